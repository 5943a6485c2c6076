package limits

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// scriptMode says what redis.lua does with a batch it evaluates.
type scriptMode int

const (
	modeDecide  scriptMode = 0 // record the batch when admitted
	modePeek    scriptMode = 1 // answer as modeDecide would, record nothing
	modeRefused scriptMode = 2 // the batch is refused already: answer as is, record nothing
)

// keyBase is the name every Redis key of (rule, key) starts with; its hash
// tag keeps them in one cluster slot, while counters of different keys or
// rules live in different slots (see Redis).
func (s *Redis) keyBase(rule string, key Key) string {
	return s.o.Prefix + "{" + rule + "|" + key.s + "}"
}

// counterKeys returns the Redis keys of hits' counters in order: a
// sliding window's string and list, a token bucket's or a calendar
// counter's string, each followed by its pending mark's key when marks. They are cut from one
// string: one allocation for the batch instead of two or three per hit.
func (s *Redis) counterKeys(hits []Hit, marks bool) []string {
	per := func(h *Hit) (n int, size int) {
		n = 2
		if h.Rule.Algorithm != SlidingWindow {
			n = 1 // a bucket's or a calendar counter's one key
		}
		if marks {
			n++
		}
		return n, n * (len(s.o.Prefix) + len(h.Rule.Name) + len(h.Key.s) + len("{|}:z"))
	}
	count, total := 0, 0
	for i := range hits {
		n, size := per(&hits[i])
		count, total = count+n, total+size
	}
	buf := make([]byte, 0, total)
	keys := make([]string, 0, count)
	for i := range hits {
		h := &hits[i]
		n, _ := per(h)
		for k := range n {
			buf = append(buf, s.o.Prefix...)
			buf = append(buf, '{')
			buf = append(buf, h.Rule.Name...)
			buf = append(buf, '|')
			buf = append(buf, h.Key.s...)
			buf = append(buf, '}', ':', counterSuffix(h.Rule.Algorithm, k))
		}
	}
	// buf is never written again: the keys share it.
	all := unsafe.String(unsafe.SliceData(buf), len(buf))
	at := 0
	for i := range hits {
		h := &hits[i]
		n, size := per(h)
		for k := range n {
			keys = append(keys, all[at+k*size/n:at+(k+1)*size/n])
		}
		at += size
	}
	return keys
}

// counterSuffix is the last letter of the k-th key of a counter (see
// counterKeys): w and l for a window, b for a bucket, c for a calendar
// counter, then p, its pending mark.
func counterSuffix(a Algorithm, k int) byte {
	switch a {
	case TokenBucket:
		return "bp"[k]
	case Calendar:
		return "cp"[k]
	}
	return "wlp"[k]
}

// Decide implements Store.
func (s *Redis) Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	return s.evaluate(ctx, hits, now, out, modeDecide)
}

// Peek implements Store: the same script, recording nothing. On a cluster
// every part is evaluated in turn, nothing to roll back.
func (s *Redis) Peek(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	return s.evaluate(ctx, hits, now, out, modePeek)
}

// Reset implements Store: it deletes the key's counters of every
// algorithm (one slot, so one DEL on a cluster too), and a window's keys
// as earlier releases laid them out (:z, :h), which this one never reads.
func (s *Redis) Reset(ctx context.Context, rule *Rule, key Key) error {
	if rule == nil {
		return ErrBatch
	}
	base := s.keyBase(rule.Name, key)
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	if err := s.o.Client.Del(ctx, base+":w", base+":l", base+":b", base+":c", base+":p", base+":z", base+":h").Err(); err != nil {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

func (s *Redis) evaluate(ctx context.Context, hits []Hit, now time.Time, out []Decision, mode scriptMode) (bool, error) {
	if err := checkBatch(hits, out); err != nil {
		return false, err
	}
	if s.cluster == nil {
		return s.run(ctx, s.shard(""), hits, now, out, nil, mode, marksNone, 0)
	}
	parts := s.slotParts(hits)
	if len(parts) == 1 {
		sh, err := s.shardOf(ctx, &hits[0])
		if err != nil {
			return false, err
		}
		return s.run(ctx, sh, hits, now, out, nil, mode, marksCheck, 0)
	}
	return s.evaluateSplit(ctx, hits, parts, now, out, mode)
}

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

// algorithmArg is an algorithm as the scripts name it.
func algorithmArg(a Algorithm) string {
	switch a {
	case TokenBucket:
		return "b"
	case Calendar:
		return "c"
	}
	return "w"
}

// decideArgs are the algorithms as redis.lua names them, in capitals for
// a shadow rule, boxed once (an argument boxed per call is an allocation).
var decideArgs = [2][3]any{{"w", "b", "c"}, {"W", "B", "C"}}

// decideArg is a rule's algorithm as redis.lua names it.
func decideArg(r *Rule) any {
	shadow := 0
	if r.Shadow {
		shadow = 1
	}
	switch r.Algorithm {
	case TokenBucket:
		return decideArgs[shadow][1]
	case Calendar:
		return decideArgs[shadow][2]
	}
	return decideArgs[shadow][0]
}

// calendarMargin is how long a calendar counter's key outlives its
// period: instances whose clocks are a little behind still read it.
const calendarMargin = time.Hour

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

// pendingMarks says what redis.lua does with the counters' pending marks
// (see Redis): on a single server there are none.
type pendingMarks int

const (
	marksNone  pendingMarks = 0 // a single server or Sentinel: no rollback ever
	marksCheck pendingMarks = 1 // a Cluster: a refusal says whether a mark is on its counter
	marksSet   pendingMarks = 2 // as marksCheck, and each hit recorded is marked (it may be rolled back)
)

// run runs the script in mode for hits, which all live on sh; recs, when
// not nil, receives what each hit recorded (for rollback; 0: nothing).
// marks and markFor are what the script does with pending marks.
func (s *Redis) run(ctx context.Context, sh *redisShard, hits []Hit, now time.Time, out []Decision, recs []int64, mode scriptMode,
	marks pendingMarks, markFor time.Duration) (bool, error) {
	if sh.down.Load() {
		return false, ErrUnavailable
	}
	keys := s.counterKeys(hits, marks != marksNone)
	caller := hits
	args := make([]any, 0, 7+5*len(hits))
	args = append(args, len(hits), s.clock(now), int(mode), maxSlots, int(marks), markFor.Milliseconds())
	for i := range hits {
		h := &hits[i]
		limit, burst := h.Limits()
		alg := decideArg(h.Rule)
		switch h.Rule.Algorithm {
		case Calendar:
			// The period's start (unix s) and how long the key lives,
			// in s, from now to the period's end and a margin (relative:
			// the script's clock may not be now's): the script does no
			// calendar arithmetic.
			p := periodOf(h.Rule, now)
			args = append(args, alg, limit, p.start, h.Cost, ceilSeconds(p.left+calendarMargin))
		case TokenBucket:
			args = append(args, alg, limit, h.Rule.Window.Microseconds(), h.Cost, burst)
		default:
			args = append(args, alg, limit, h.Rule.Window.Microseconds(), h.Cost)
		}
	}
	var clamped []int // the clamping hits, in the order of their arguments
	outCap := int64(-1)
	if maxOut, minOut, ok := clampBounds(hits); ok {
		for i := range hits {
			if hits[i].clamps() {
				clamped = append(clamped, i)
			}
		}
		args = append(args, len(clamped), maxOut, minOut)
		for _, i := range clamped {
			c := &hits[i].Clamp
			args = append(args, i+1, c.Base, strconv.FormatFloat(c.Per, 'g', -1, 64))
		}
	} else {
		args = append(args, 0)
	}
	reply, err := s.exec(ctx, sh, s.script, keys, args, s.o.Timeout)
	if err != nil {
		return false, fmt.Errorf("redis decision: %w", err)
	}
	res, ok := reply.(string)
	if !ok {
		return false, fmt.Errorf("redis decision: unexpected reply %T", reply)
	}
	if len(clamped) > 0 {
		// After the hits: the output the script lowered the batch to
		// (-1: none), then what each clamping hit was charged.
		tail := 8 * (2 + 6*len(hits))
		if len(res) != tail+8*(1+len(clamped)) {
			return false, fmt.Errorf("redis decision: %d bytes returned for %d hits", len(res), len(hits))
		}
		outCap = int64(replyValue(res[tail:], 0))
		if outCap >= 0 {
			// The clamping hits were charged their lowered cost: the
			// decisions are read at it.
			hits = append([]Hit(nil), hits...)
			for j, i := range clamped {
				hits[i].Cost = int64(replyValue(res[tail:], 1+j))
			}
		}
		res = res[:tail]
	}
	allowed, err := decodeReply(res, hits, now, mode, out, recs)
	if err != nil {
		return false, fmt.Errorf("redis decision: %w", err)
	}
	for _, i := range clamped {
		out[i].Output = hits[i].Clamp.Max
		if outCap >= 0 {
			out[i].Output = outCap
			if allowed && mode == modeDecide {
				caller[i].Cost = hits[i].Cost // what was charged
			}
		}
	}
	return allowed, nil
}

// clock is the script's now argument: 0 for Redis's TIME, else now in µs
// (ClientClock).
func (s *Redis) clock(now time.Time) int64 {
	if s.o.ClientClock {
		return now.UnixMicro()
	}
	return 0
}

// exec runs script on sh's server within timeout, keeping sh's breaker: a
// failure of Redis counts towards opening it, a success closes the count.
func (s *Redis) exec(ctx context.Context, sh *redisShard, script *redis.Script, keys []string, args []any, timeout time.Duration) (any, error) {
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	res, err := script.Run(callCtx, s.o.Client, keys, args...).Result()
	cancel()
	if err != nil && ctx.Err() != nil {
		// The request itself went away (a client disconnect): not a
		// failure of Redis, and no reason to open the breaker.
		return nil, ctx.Err()
	}
	if s.o.OnCall != nil {
		s.o.OnCall(time.Since(start), err)
	}
	if err != nil {
		if redis.IsClusterDownError(err) && s.cluster != nil {
			// The whole cluster refuses while a slot has no master (Redis's
			// cluster-require-full-coverage): not this shard's failure, so
			// its breaker stays closed; the request fails and FAIL_OPEN
			// applies.
			s.cluster.ReloadState(context.Background())
			return nil, err
		}
		s.failed(sh, err)
		return nil, err
	}
	sh.failures.Store(0)
	return res, nil
}

// replyValue is the i-th number of redis.lua's reply (a double, little
// endian).
func replyValue(res string, i int) float64 {
	b := res[8*i : 8*i+8]
	return math.Float64frombits(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56)
}

// decodeReply fills out (and recs) from redis.lua's reply for hits
// decided in mode, and returns the batch's verdict. A token bucket's
// numbers are computed here from the state the script read, with the
// arithmetic Memory uses.
func decodeReply(res string, hits []Hit, at time.Time, mode scriptMode, out []Decision, recs []int64) (bool, error) {
	const per = 6
	if len(res) != 8*(2+per*len(hits)) {
		return false, fmt.Errorf("%d bytes returned for %d hits", len(res), len(hits))
	}
	batch := replyValue(res, 0) == 1
	now := int64(replyValue(res, 1))
	for i := range hits {
		v := func(j int) float64 { return replyValue(res, 2+per*i+j) }
		h := &hits[i]
		limit, burst := h.Limits()
		verdict := v(0)
		pending := verdict < 0 // refused by a counter holding charges that may be rolled back
		rec := int64(v(1))
		if recs != nil {
			recs[i] = rec
		}
		var ticket Ticket
		if rec != 0 {
			ticket = Ticket{rec: rec, set: true}
		}
		switch h.Rule.Algorithm {
		case Calendar:
			// The count the script read in the period it counted in (a
			// later one than at's, for a clock behind another
			// instance's), and that period's start.
			count := int64(v(2))
			p := periodOf(h.Rule, at)
			d := calendarDecide(&p, count, h.Cost, limit)
			d.Allowed = verdict == 1
			if !d.Allowed && d.RetryAfter == 0 {
				d.RetryAfter = p.left
			}
			if batch && mode != modeRefused && d.Allowed && h.Cost > 0 {
				calendarTake(&p, count, h.Cost, limit, &d)
			}
			if rec != 0 {
				ticket.at = int64(v(3)) // when the counter was made
			}
			d.Ticket = ticket
			d.pending = pending
			out[i] = d
		case TokenBucket:
			p := newBucketParams(h.Rule.Window, limit, burst)
			tokens, last := bucketState(&p, v(2), v(3), now)
			d, level := p.decide(tokens, last, now, h.Cost)
			if d.Allowed != (verdict == 1) {
				// Cannot happen (the same IEEE operations on both sides);
				// the script's verdict is what was recorded.
				d.Allowed = verdict == 1
				d.RetryAfter = 0
				if !d.Allowed {
					d.RetryAfter = time.Microsecond
				}
			}
			if batch && mode != modeRefused && d.Allowed && h.Cost > 0 {
				p.take(level, last, now, h.Cost, &d)
			}
			d.Ticket = ticket
			d.pending = pending
			out[i] = d
		default:
			if rec != 0 {
				ticket.at = rec // the time the admission was counted at
			}
			out[i] = Decision{
				Allowed:    verdict == 1,
				Limit:      limit,
				Remaining:  int64(v(2)),
				RetryAfter: micros(int64(v(3))),
				ResetAfter: micros(int64(v(4))),
				NextAfter:  micros(int64(v(5))),
				Ticket:     ticket,
				pending:    pending,
			}
		}
	}
	return batch, nil
}

// bucketState is a bucket's state as redis.lua read it (tokens, NaN for
// a fresh bucket, at last, µs), clamped to p's burst; a fresh bucket is
// full at now.
func bucketState(p *bucketParams, tokens, last float64, now int64) (float64, int64) {
	if math.IsNaN(tokens) {
		return p.burst, now
	}
	return min(tokens, p.burst), int64(last)
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
