package limits

import (
	"math"
	"time"
)

// A token bucket (SPEC §7.3, seed 001) holds up to burst tokens. It starts
// full, refills continuously at limit per window, lazily (computed when a
// hit is decided, never by a timer) and never above burst; a hit is
// admitted when the bucket holds at least its cost, which it then takes.
// Tokens are fractional; Remaining rounds them down. Time going backwards
// adds nothing, and a refused hit takes nothing.
//
// Both stores count in float64 and in µs, with the operations below run in
// the same order in redis.lua, so that Memory and Redis give identical
// answers.

// maxWait caps a bucket's waits, in µs (about 31 years): a huge burst
// refilled slowly must not overflow a time.Duration.
const maxWait = 1e15

// bucketParams are the effective parameters of one token-bucket hit.
type bucketParams struct {
	limit  float64 // tokens refilled per window
	window float64 // µs
	burst  float64 // capacity
	limitN int64
	span   time.Duration
}

func newBucketParams(window time.Duration, limit, burst int64) bucketParams {
	return bucketParams{limit: float64(limit), window: float64(window.Microseconds()), burst: float64(burst),
		limitN: limit, span: window}
}

// fill is the level of a bucket that held tokens (at most burst; below 0
// after a settled charge, a debt) elapsed µs ago (elapsed >= 0).
func (p *bucketParams) fill(tokens, elapsed float64) float64 {
	add := elapsed * p.limit / p.window
	room := p.burst
	if tokens < 0 {
		room = p.burst - tokens
	}
	if add > room {
		return p.burst // days of idle fill the bucket, whatever it held
	}
	t := tokens + add
	if t > p.burst {
		t = p.burst
	}
	return t
}

// wait is the time in µs from now until a bucket that held tokens at last
// holds target, 0 when it does now: the smallest whole µs at which fill
// reaches target, so a retry then is admitted and one a µs earlier is not.
// It needs limit > 0 and target <= burst.
func (p *bucketParams) wait(tokens float64, last, now int64, target float64) int64 {
	e0 := float64(max(now-last, 0))
	if p.fill(tokens, e0) >= target {
		return 0
	}
	e := math.Ceil((target - tokens) * p.window / p.limit)
	if e <= e0 {
		e = e0 + 1
	}
	// The estimate may be a µs off either way by rounding.
	for n := 0; n < 4 && e-1 > e0 && p.fill(tokens, e-1) >= target; n++ {
		e--
	}
	for n := 0; n < 4 && p.fill(tokens, e) < target; n++ {
		e++
	}
	return int64(math.Min(float64(last)+e-float64(now), maxWait))
}

// decide evaluates cost at now (µs) against a bucket that held tokens
// (clamped to burst) at last, recording nothing. It returns the decision
// as it is before any recording and the bucket's level at now.
func (p *bucketParams) decide(tokens float64, last, now, cost int64) (Decision, float64) {
	level := p.fill(tokens, float64(max(now-last, 0)))
	d := Decision{Limit: p.limitN, Allowed: cost == 0 || (p.limitN > 0 && level >= float64(cost))}
	if !d.Allowed {
		if p.limitN == 0 || float64(cost) > p.burst {
			d.RetryAfter = p.span // never fits: not within this window
		} else {
			d.RetryAfter = micros(p.wait(tokens, last, now, float64(cost)))
		}
	}
	p.report(&d, tokens, last, now, level)
	return d, level
}

// take takes cost from a bucket at level (its level at now) that held
// tokens at last, and sets d to the state after it, which it returns.
func (p *bucketParams) take(level float64, last, now, cost int64, d *Decision) (float64, int64) {
	tokens := level - float64(cost)
	if now > last {
		last = now // the stored time never moves backwards
	}
	p.report(d, tokens, last, now, tokens)
	return tokens, last
}

// report sets Remaining, ResetAfter and NextAfter for a bucket that held
// tokens at last and holds level at now.
func (p *bucketParams) report(d *Decision, tokens float64, last, now int64, level float64) {
	if p.limitN == 0 {
		d.Remaining, d.ResetAfter, d.NextAfter = 0, 0, 0 // admits nothing, refills nothing
		return
	}
	// A settled charge may leave the bucket in debt: nothing remains until
	// it holds a whole token again.
	whole := max(math.Floor(level), 0)
	d.Remaining = int64(whole)
	d.ResetAfter = micros(p.wait(tokens, last, now, p.burst))
	d.NextAfter = 0
	if level < p.burst {
		d.NextAfter = micros(p.wait(tokens, last, now, whole+1))
	}
}

func micros(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// bucket is one key's token-bucket state in Memory.
type bucket struct {
	tokens float64 // the level at last
	last   int64   // unix µs
	full   int64   // unix µs from which the bucket is full again; 0: never taken from
}

// state is the bucket's tokens, clamped to p's burst, and when it held
// them; a bucket never taken from is full now.
func (b *bucket) state(p *bucketParams, now int64) (float64, int64) {
	if b.full == 0 {
		return p.burst, now
	}
	return min(b.tokens, p.burst), b.last
}

// refund gives n tokens back at the bucket's stored time, never above
// p's burst (as settle.lua does).
func (b *bucket) refund(p *bucketParams, n int64) {
	if b.full == 0 {
		return // full: nothing was taken
	}
	t := b.tokens + float64(n)
	if t > p.burst {
		t = p.burst
	}
	b.tokens = t
	b.full = b.last
	if p.limitN > 0 {
		b.full += p.wait(t, b.last, b.last, p.burst)
	}
}

// charge takes n tokens at now (µs) without a decision, as an admission
// would take them: the level may fall below 0, a debt that refills.
func (b *bucket) charge(p *bucketParams, now, n int64) {
	tokens, last := b.state(p, now)
	level := p.fill(tokens, float64(max(now-last, 0)))
	var d Decision
	tokens, last = p.take(level, last, now, n, &d)
	*b = bucket{tokens: tokens, last: last, full: now + int64(d.ResetAfter/time.Microsecond)}
}
