package limits

import (
	"context"
	"fmt"
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

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
