package limits

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// correction is one change settle.lua makes to what redis.lua recorded
// for h: delta < 0 gives -delta back, delta > 0 charges delta at now.
type correction struct {
	h     *Hit
	rec   int64 // what redis.lua recorded (Ticket.rec)
	at    int64 // when a window admission was counted (a calendar counter made), µs; 0: not checked (a rollback)
	delta int64
}

// Settle implements Store: one script (settle.lua) on a single server or
// Sentinel-managed master for every settlement, on Redis's clock. On a
// Cluster the settlements are grouped by slot, one script per slot, each
// on its own: a group that fails does not stop the others, and the first
// error is returned.
//
// A window's refund is taken out of the admission's slot while the
// admission is in the window and its counter was not made again since (a
// Reset); a bucket's tokens are given back while its key lives. An extra
// charge is counted at now in the key's counter as it is, made again if
// it expired or was reset while the response ran: a store shared by
// instances cannot tell the two apart, and a charge can only refuse more,
// by what the reservation did not cover. A calendar counter is corrected
// only while the period its admission was counted in is still the
// current one and the counter still counts it (not after a Reset).
func (s *Redis) Settle(ctx context.Context, st []Settlement, now time.Time) error {
	if err := checkSettlements(st); err != nil {
		return err
	}
	cs := make([]correction, 0, len(st))
	for i := range st {
		x := &st[i]
		if !x.needsSettling() {
			continue
		}
		if x.Hit.Rule.Algorithm == Calendar && x.Ticket.rec != periodOf(x.Hit.Rule, now).start {
			// Only into the period current now, if the admission was
			// counted in it (the script checks the counter still is).
			continue
		}
		cs = append(cs, correction{h: &x.Hit, rec: x.Ticket.rec, at: x.Ticket.at, delta: x.Actual - x.Hit.Cost})
	}
	if len(cs) == 0 {
		return nil
	}
	if s.cluster == nil {
		return s.correct(ctx, s.shard(""), cs, now)
	}
	slots := make([]int, len(cs))
	for i := range cs {
		slots[i] = Slot(s.keyBase(cs[i].h.Rule.Name, cs[i].h.Key))
	}
	sort.Stable(bySlot{cs, slots}) // a counter's corrections keep their order
	var first error
	for lo := 0; lo < len(cs); {
		hi := lo + 1
		for hi < len(cs) && slots[hi] == slots[lo] {
			hi++
		}
		sh, err := s.shardOf(ctx, cs[lo].h)
		if err == nil {
			err = s.correct(ctx, sh, cs[lo:hi], now)
		}
		if first == nil {
			first = err
		}
		lo = hi
	}
	return first
}

// bySlot orders corrections by their cluster slot.
type bySlot struct {
	cs    []correction
	slots []int
}

func (b bySlot) Len() int           { return len(b.cs) }
func (b bySlot) Less(i, j int) bool { return b.slots[i] < b.slots[j] }
func (b bySlot) Swap(i, j int) {
	b.cs[i], b.cs[j] = b.cs[j], b.cs[i]
	b.slots[i], b.slots[j] = b.slots[j], b.slots[i]
}

// correct runs settle.lua for cs, whose counters all live on sh (one slot
// on a cluster), within the timeout; not while sh's breaker is open.
func (s *Redis) correct(ctx context.Context, sh *redisShard, cs []correction, now time.Time) error {
	if sh.down.Load() {
		return ErrUnavailable
	}
	return s.apply(ctx, sh, cs, now, s.o.Timeout)
}

// apply runs settle.lua for cs on sh within timeout, whatever sh's breaker
// says.
func (s *Redis) apply(ctx context.Context, sh *redisShard, cs []correction, now time.Time, timeout time.Duration) error {
	hits := make([]Hit, len(cs))
	for i := range cs {
		hits[i] = *cs[i].h
	}
	keys := s.counterKeys(hits, false)
	args := make([]any, 0, 3+7*len(cs))
	args = append(args, len(cs), s.clock(now), maxSlots)
	for i := range cs {
		c := &cs[i]
		limit, burst := c.h.Limits()
		args = append(args, algorithmArg(c.h.Rule.Algorithm), c.rec, c.at, c.delta, limit,
			c.h.Rule.Window.Microseconds(), burst)
	}
	if _, err := s.exec(ctx, sh, s.settle, keys, args, timeout); err != nil {
		return fmt.Errorf("redis settlement: %w", err)
	}
	return nil
}
