package limits

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Fallback decides in a shared store and, when that fails, in a local
// in-memory store with every limit divided by the number of instances
// sharing the budget (FAIL_OPEN=local): while the shared store is down,
// the instances together admit at most about what the shared limit allows.
type Fallback struct {
	primary Store
	local   *Memory
	divide  int64
	scaled  sync.Map // *Rule → *Rule with the divided limit
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
	local := make([]Hit, len(hits))
	for i, h := range hits {
		local[i] = h
		local[i].Rule = f.scale(h.Rule)
	}
	if f.OnFallback != nil {
		f.OnFallback()
	}
	return f.local.Decide(ctx, local, now, out)
}

// scale returns r with its limit divided (rounded down: the instances
// together never exceed the shared limit), made once per rule.
func (f *Fallback) scale(r *Rule) *Rule {
	if s, ok := f.scaled.Load(r); ok {
		return s.(*Rule)
	}
	c := *r
	c.Limit = r.Limit / f.divide
	s, _ := f.scaled.LoadOrStore(r, &c)
	return s.(*Rule)
}
