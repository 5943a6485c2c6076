package limits

// redis.lua's reply: one string of doubles, decoded into Decisions with
// the arithmetic Memory uses.

import (
	"fmt"
	"math"
	"time"
)

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
