package limits

import (
	"context"
	"time"
)

// Settle implements Store, under the same locks as Decide (the shards of
// the settlements' keys, in index order). It never fails but for a
// malformed settlement.
//
// A refund goes to the counter the hit was recorded in: a window's units
// out of the admission's slot while the admission is in the window, a
// bucket's tokens back at its stored time. A calendar counter's
// correction, refund or extra, is made only while the period the
// admission was counted in is still the current one, and dropped after. A counter reset, restarted (its
// rule's algorithm or window changed) or dropped since (idle, evicted)
// holds nothing of the hit: its refund is skipped. An extra charge is
// counted at now in the key's counter, made again if it was dropped while
// the response ran; it is skipped when the counter was reset or restarted
// since.
func (m *Memory) Settle(_ context.Context, s []Settlement, now time.Time) error {
	if err := checkSettlements(s); err != nil {
		return err
	}
	var idxBuf, lockBuf [maxInlineHits]uint8
	idx, lock := idxBuf[:0], lockBuf[:0]
	for i := range s {
		var sh uint8
		if s[i].needsSettling() {
			sh = m.shardOf(s[i].Hit.Rule.Name, s[i].Hit.Key.s)
			lock = append(lock, sh)
		}
		idx = append(idx, sh)
	}
	if len(lock) == 0 {
		return nil
	}
	locked := lockSorted(&m.shards, lock)
	defer unlockAll(&m.shards, locked)
	ns := now.UnixNano()
	for i := range s {
		if s[i].needsSettling() {
			m.settle(&m.shards[idx[i]], &s[i], ns)
		}
	}
	return nil
}

// settle applies x at now (ns). The shard is locked.
func (m *Memory) settle(s *shard, x *Settlement, now int64) {
	h, t := &x.Hit, &x.Ticket
	span, isBucket, isCalendar := h.Rule.span(), h.Rule.Algorithm == TokenBucket, h.Rule.Algorithm == Calendar
	e, ok := s.m[stateKey{rule: h.Rule.Name, key: h.Key.s}]
	if ok && (e.w.span != span || e.isBucket != isBucket || e.isCalendar != isCalendar) {
		return // the rule changed since: its counter is another one
	}
	delta := x.Actual - h.Cost
	if isCalendar {
		// Only into the period the admission was counted in, while it is
		// the current one and its counter the one that counted it: never
		// into the next period.
		p := periodOf(h.Rule, time.Unix(0, now))
		if !ok || e.gen != t.gen || t.at != p.start {
			return
		}
		start, end, count := e.calendar()
		if start != t.at {
			return
		}
		e.setCalendar(start, end, max(count+delta, 0))
		e.touched = unixSeconds(now)
		return
	}
	switch {
	case ok && e.gen == t.gen:
		e.touched = unixSeconds(now)
	case delta < 0 || newer(s.resetGen, t.gen):
		// Nothing of the hit is counted any more, or a reset (or a
		// restart) forgot it.
		return
	default:
		// Dropped while the response ran, perhaps made again since: the
		// extra is still owed.
		e = m.entry(s, h, now, true)
	}
	limit, burst := h.Limits()
	if isBucket {
		p := newBucketParams(h.Rule.Window, limit, burst)
		b := e.bucket()
		if delta < 0 {
			b.refund(&p, -delta)
		} else {
			b.charge(&p, now/1000, delta)
		}
		e.setBucket(b)
		return
	}
	if delta < 0 {
		e.w.refund(t.at, now, -delta)
		return
	}
	e.w.expire(now)
	e.w.add(now, delta, limit)
}
