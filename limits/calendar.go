package limits

import (
	"time"
)

// A calendar counter (SPEC §7.3) counts the cost admitted since the
// current period (a day, an ISO week from Monday, a month) began at
// midnight in the rule's location, and reads as zero once the next period
// has begun: it never admits more than the limit in one period. Period
// boundaries are computed with time.Date in the location, so a day with a
// daylight-saving change is 23 or 25 hours long and every boundary is a
// local midnight, exact to the second.
//
// Both stores keep, per (rule, key), the start of the period the count
// belongs to (unix seconds) and the count; a stored start other than the
// current period's is an old period, read as zero. The Go side computes
// the period for both stores, so redis.lua does no calendar arithmetic.

// Period is the length of a Calendar rule's period.
type Period uint8

const (
	// Day starts at every local midnight.
	Day Period = iota + 1
	// Week starts at midnight between Sunday and Monday (ISO 8601).
	Week
	// Month starts at midnight of the 1st.
	Month
)

// String is the period as rules name it: "day", "week", "month".
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	}
	return "unknown"
}

// ParsePeriod reads "day", "week" or "month".
func ParsePeriod(s string) (Period, bool) {
	switch s {
	case "day":
		return Day, true
	case "week":
		return Week, true
	case "month":
		return Month, true
	}
	return 0, false
}

// nominal is the period's usual length, the counter's span (a period of
// one rule never changes span; a rule changed to another period restarts
// its counters, as a window changed by a reload does).
func (p Period) nominal() time.Duration {
	switch p {
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 31 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// Bounds returns the calendar period of r that holds t: its start (a
// local midnight in r's location, UTC when nil) and the next period's
// start. For rules of other algorithms both are t.
func (r *Rule) Bounds(t time.Time) (start, end time.Time) {
	if r.Algorithm != Calendar {
		return t, t
	}
	loc := r.Location
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	y, m, d := lt.Date()
	switch r.Period {
	case Week:
		// Monday is day 0 of an ISO week.
		back := (int(lt.Weekday()) + 6) % 7
		start = time.Date(y, m, d-back, 0, 0, 0, 0, loc)
		end = time.Date(y, m, d-back+7, 0, 0, 0, 0, loc)
	case Month:
		start = time.Date(y, m, 1, 0, 0, 0, 0, loc)
		end = time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	default:
		start = time.Date(y, m, d, 0, 0, 0, 0, loc)
		end = time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	}
	return start, end
}

// span is the counter's span: the window, or a calendar period's nominal
// length.
func (r *Rule) span() int64 {
	if r.Algorithm == Calendar {
		return int64(r.Period.nominal())
	}
	return int64(r.Window)
}

// calendarPeriod is the current period of a calendar hit at now, in unix
// seconds, with now's distance to its end.
type calendarPeriod struct {
	start, end int64         // unix s
	left       time.Duration // from now to end, > 0
	length     time.Duration // end - start
}

func periodOf(r *Rule, now time.Time) calendarPeriod {
	s, e := r.Bounds(now)
	return calendarPeriod{start: s.Unix(), end: e.Unix(), left: max(e.Sub(now), time.Nanosecond), length: e.Sub(s)}
}

// calendarDecide decides cost against count (what the current period
// holds) under limit, recording nothing: the decision as it is before any
// recording.
func calendarDecide(p *calendarPeriod, count, cost, limit int64) Decision {
	d := Decision{Limit: limit, Remaining: max(limit-count, 0), Period: p.length, ResetAfter: p.left}
	d.Allowed = cost == 0 || count+cost <= limit
	if !d.Allowed {
		d.RetryAfter = p.left // the next period, or never (a cost above the limit)
	}
	if count > 0 {
		d.NextAfter = p.left
	}
	return d
}

// calendarTake updates d to the state after cost is counted on count.
func calendarTake(p *calendarPeriod, count, cost, limit int64, d *Decision) {
	d.Remaining = max(limit-count-cost, 0)
	d.NextAfter = p.left
}
