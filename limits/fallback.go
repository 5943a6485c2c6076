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
// the shared limit allows.
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
	return f.local.Decide(ctx, f.scale(hits), now, out)
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

// scale returns a copy of hits with their effective limit and burst
// divided (rounded down: the instances together never exceed the shared
// limit), and reports the local decision.
func (f *Fallback) scale(hits []Hit) []Hit {
	local := make([]Hit, len(hits))
	for i := range hits {
		h := &hits[i]
		limit, burst := h.Limits()
		local[i] = *h
		local[i].Own, local[i].Limit, local[i].Burst = true, limit/f.divide, burst/f.divide
	}
	if f.OnFallback != nil {
		f.OnFallback()
	}
	return local
}
