package limits

// A batch whose counters live on several masters of a Redis Cluster:
// decided part by part, in a fixed order, each part rolled back when a
// later one refuses.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotParts groups a batch's hits by cluster slot, in slot order, the
// parts holding only shadow hits last: the fixed order in which every
// instance decides the parts of a split batch.
func (s *Redis) slotParts(hits []Hit) [][]int {
	if len(hits) == 1 {
		return [][]int{{0}}
	}
	slots := make([]int, len(hits))
	enforcing := make(map[int]bool, len(hits))
	for i := range hits {
		slots[i] = Slot(s.keyBase(hits[i].Rule.Name, hits[i].Key))
		if !hits[i].Rule.Shadow {
			enforcing[slots[i]] = true
		}
	}
	order := make([]int, len(hits))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		sa, sb := slots[order[a]], slots[order[b]]
		if enforcing[sa] != enforcing[sb] {
			return enforcing[sa]
		}
		return sa < sb
	})
	var parts [][]int
	for _, i := range order {
		if n := len(parts); n > 0 && slots[parts[n-1][0]] == slots[i] {
			parts[n-1] = append(parts[n-1], i)
		} else {
			parts = append(parts, []int{i})
		}
	}
	return parts
}

// evaluateSplit evaluates a batch whose hits live in several cluster
// slots, part by part in slot order. While the parts admit, each is
// decided (or peeked) in mode; when one refuses, the parts recorded before
// it are rolled back, and the parts after it are evaluated as refused, so
// every hit still gets its decision.
func (s *Redis) evaluateSplit(ctx context.Context, hits []Hit, parts [][]int, now time.Time, out []Decision, mode scriptMode) (bool, error) {
	type recorded struct {
		sh   *redisShard
		hits []Hit
		recs []int64
	}
	var done []recorded
	var taken []int // hits recorded (or, peeking, that would be)
	rollback := func() {
		deadline := time.Now().Add(s.o.RollbackTimeout) // for the whole rollback
		for _, r := range done {
			s.rollback(r.sh, r.hits, r.recs, now, deadline)
		}
		done = nil
		for i := range out {
			out[i].Ticket = Ticket{} // nothing stays recorded
		}
	}
	// A part once sent is waited for even if the request goes away: its
	// reply says what to roll back (a part abandoned mid-call may stay
	// recorded). The request's end is checked between parts instead.
	sent := context.WithoutCancel(ctx)
	allowed := true
	// A pending mark outlasts the rollback of what it marks: the parts
	// after it (each up to a timeout to find its master and one for its
	// call), then the rollback, with a second to spare.
	markFor := time.Duration(2*len(parts))*s.o.Timeout + s.o.RollbackTimeout + time.Second
	clampMax := int64(-1) // the output the clamping parts decided so far (-1: none yet)
	defer func() {
		for i := range hits {
			if hits[i].clamps() && clampMax >= 0 {
				out[i].Output = clampMax // every clamping hit's charge covers it
			}
		}
	}()
	for p, part := range parts {
		if err := ctx.Err(); err != nil {
			rollback()
			return false, err
		}
		ph := make([]Hit, len(part))
		for j, i := range part {
			ph[j] = hits[i]
			if c := &ph[j].Clamp; ph[j].clamps() && clampMax >= 0 && clampMax < c.Max {
				// An earlier part lowered the output: this one asks no
				// more (the earlier parts' larger charges are settled
				// down later: a split batch may reserve more, never less).
				c.Max = clampMax
				ph[j].Cost = c.cost(clampMax)
			}
		}
		m := mode
		if !allowed {
			m = modeRefused
		}
		sh, err := s.shardOf(sent, &ph[0])
		if err != nil {
			rollback()
			return false, err
		}
		pout := make([]Decision, len(part))
		recs := make([]int64, len(part))
		marks := marksCheck
		if p < len(parts)-1 {
			marks = marksSet // it may be rolled back if a later part refuses or fails
		}
		ok, err := s.run(sent, sh, ph, now, pout, recs, m, marks, markFor)
		if err != nil {
			rollback()
			return false, err
		}
		for j, i := range part {
			out[i] = pout[j]
		}
		if !allowed {
			continue
		}
		if !ok {
			allowed = false
			rollback()
			// As the batch was refused, those hits show what is left
			// without them: a window's units or a bucket's tokens back.
			for _, i := range taken {
				out[i].Remaining += hits[i].Cost
			}
			continue
		}
		for j, i := range part {
			if ph[j].clamps() {
				if m == modeDecide {
					hits[i].Cost = ph[j].Cost // what was charged
				}
				if clampMax < 0 || pout[j].Output < clampMax {
					clampMax = pout[j].Output
				}
			}
			if pout[j].Allowed && ph[j].Cost > 0 {
				taken = append(taken, i)
			}
		}
		if m == modeDecide {
			done = append(done, recorded{sh: sh, hits: ph, recs: recs})
		}
	}
	return allowed, nil
}

// rollback takes back what redis.lua recorded of one part: a refund of
// each hit's whole cost. It is complete before the refusal is returned:
// the master answered the part a moment ago, so the rollback neither stops
// at an open breaker nor gives up at a decision's timeout; it waits up to
// RollbackTimeout (all of a batch's parts together, until deadline), and
// tries again within it after a failure that shows the script did not run
// (no connection, CLUSTERDOWN, TRYAGAIN, LOADING).
// Only a master silent for the whole RollbackTimeout, or a reply lost on
// the way (the refund may have been made: trying again could give back
// twice), leaves the part counted, which refuses more, never admits more.
func (s *Redis) rollback(sh *redisShard, hits []Hit, recs []int64, now, deadline time.Time) {
	cs := make([]correction, 0, len(hits))
	for i := range hits {
		if recs[i] != 0 {
			// at 0: taken back whatever the time, just after the decision.
			cs = append(cs, correction{h: &hits[i], rec: recs[i], delta: -hits[i].Cost})
		}
	}
	if len(cs) == 0 {
		return
	}
	for {
		err := s.apply(context.Background(), sh, cs, now, time.Until(deadline))
		if err == nil || !notRun(err) || time.Until(deadline) < retryPause {
			return
		}
		time.Sleep(retryPause)
	}
}

// retryPause is the wait before a rollback tries again.
const retryPause = 20 * time.Millisecond

// notRun reports whether err shows that the script was not run: the call
// never reached Redis, or Redis refused it before running it.
func notRun(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsLoadingError(err)
}

// shardOf returns the shard that serves h's counters: in a cluster, the
// master of its slot by the client's current slot map.
func (s *Redis) shardOf(ctx context.Context, h *Hit) (*redisShard, error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	c, err := s.cluster.MasterForKey(ctx, s.keyBase(h.Rule.Name, h.Key))
	if err != nil {
		// No slot map (every node unreachable since start): the cluster as
		// a whole is the shard.
		sh := s.shard("")
		s.failed(sh, err)
		if sh.down.Load() {
			return nil, ErrUnavailable
		}
		return nil, fmt.Errorf("redis decision: %w", err)
	}
	return s.shard(c.Options().Addr), nil
}

// shard returns the breaker of the shard at addr.
func (s *Redis) shard(addr string) *redisShard {
	if v, ok := s.shards.Load(addr); ok {
		return v.(*redisShard)
	}
	v, _ := s.shards.LoadOrStore(addr, &redisShard{addr: addr})
	return v.(*redisShard)
}
