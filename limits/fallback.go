package limits

import (
	"context"
	"errors"
	"time"
)

// Fallback decides in a shared store and, when that fails, in a local
// in-memory store with every hit's effective limit and burst divided by
// the number of instances sharing the budget (FAIL_OPEN=local): while the
// shared store is down, the instances together admit at most about what
// the shared limit allows. A decision made locally is settled locally:
// its Ticket says so.
type Fallback struct {
	primary Store
	local   *Memory
	divide  int64
	// OnFallback, when set, is called for each decision made locally.
	OnFallback func()
}

var _ Store = (*Fallback)(nil)

// NewFallback returns primary backed by local; instances ≥ 1.
func NewFallback(primary Store, local *Memory, instances int64) *Fallback {
	return &Fallback{primary: primary, local: local, divide: max(instances, 1)}
}

// Decide implements Store.
func (f *Fallback) Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	ok, err := f.primary.Decide(ctx, hits, now, out)
	if err == nil || errors.Is(err, ErrBatch) {
		return ok, err
	}
	local := f.scale(hits)
	ok, err = f.local.Decide(ctx, local, now, out)
	for i := range hits {
		if !out[i].Ticket.IsZero() {
			out[i].Ticket.local = true
		}
		if hits[i].clamps() {
			hits[i].Cost = local[i].Cost // a clamping hit's charge, lowered to fit
		}
	}
	return ok, err
}

// Peek implements Store, falling back like Decide.
func (f *Fallback) Peek(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	ok, err := f.primary.Peek(ctx, hits, now, out)
	if err == nil || errors.Is(err, ErrBatch) {
		return ok, err
	}
	return f.local.Peek(ctx, f.scale(hits), now, out)
}

// Reset implements Store: it resets the local counters and the shared
// ones, and reports the shared store's failure.
func (f *Fallback) Reset(ctx context.Context, rule *Rule, key Key) error {
	if err := f.local.Reset(ctx, rule, key); err != nil {
		return err
	}
	return f.primary.Reset(ctx, rule, key)
}

// Settle implements Store: a settlement whose decision was made locally
// goes to the local store (with the hit scaled as it was decided there),
// the others to the shared one; it reports either's failure.
func (f *Fallback) Settle(ctx context.Context, s []Settlement, now time.Time) error {
	n := 0
	for i := range s {
		if s[i].Ticket.local {
			n++
		}
	}
	if n == 0 {
		return f.primary.Settle(ctx, s, now)
	}
	local, shared := make([]Settlement, 0, n), make([]Settlement, 0, len(s)-n)
	for _, x := range s {
		if x.Ticket.local {
			x.Hit = f.scaleHit(&x.Hit)
			local = append(local, x)
		} else {
			shared = append(shared, x)
		}
	}
	err := f.local.Settle(ctx, local, now)
	if len(shared) > 0 {
		err = errors.Join(err, f.primary.Settle(ctx, shared, now))
	}
	return err
}

// scale returns a copy of hits scaled by scaleHit, and reports the local
// decision.
func (f *Fallback) scale(hits []Hit) []Hit {
	local := make([]Hit, len(hits))
	for i := range hits {
		local[i] = f.scaleHit(&hits[i])
	}
	if f.OnFallback != nil {
		f.OnFallback()
	}
	return local
}

// scaleHit is h with its effective limit and burst divided (rounded down:
// the instances together never exceed the shared limit).
func (f *Fallback) scaleHit(h *Hit) Hit {
	limit, burst := h.Limits()
	local := *h
	local.Own, local.Limit, local.Burst = true, limit/f.divide, burst/f.divide
	return local
}
