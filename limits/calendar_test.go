package limits_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

func rome(t testing.TB) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Rome")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func cal(name string, limit int64, p limits.Period, loc *time.Location) *limits.Rule {
	return &limits.Rule{Name: name, Algorithm: limits.Calendar, Limit: limit, Period: p, Location: loc}
}

// Every boundary is a local midnight, exact to the second: the days of
// the 2026 daylight-saving changes in Rome are 23 and 25 hours long, ISO
// weeks start on Monday, months on the 1st (February of a leap year
// included).
func TestCalendarBounds(t *testing.T) {
	r := rome(t)
	day, week, month := cal("d", 1, limits.Day, r), cal("w", 1, limits.Week, r), cal("m", 1, limits.Month, r)
	utcMonth := cal("u", 1, limits.Month, nil)
	local := func(y int, m time.Month, d, h, min, s int) time.Time { return time.Date(y, m, d, h, min, s, 0, r) }
	cases := []struct {
		rule             *limits.Rule
		at, start, end   time.Time
		wantLen          time.Duration
		startUTC, endUTC string
	}{
		// 2026-03-29: clocks go from 02:00 CET to 03:00 CEST.
		{day, local(2026, 3, 29, 12, 0, 0), local(2026, 3, 29, 0, 0, 0), local(2026, 3, 30, 0, 0, 0), 23 * time.Hour,
			"2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{day, local(2026, 3, 28, 23, 59, 59), local(2026, 3, 28, 0, 0, 0), local(2026, 3, 29, 0, 0, 0), 24 * time.Hour,
			"2026-03-27T23:00:00Z", "2026-03-28T23:00:00Z"},
		// 2026-10-25: clocks go from 03:00 CEST back to 02:00 CET.
		{day, local(2026, 10, 25, 2, 30, 0), local(2026, 10, 25, 0, 0, 0), local(2026, 10, 26, 0, 0, 0), 25 * time.Hour,
			"2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		// A Sunday belongs to the week that began on Monday.
		{week, local(2026, 3, 29, 23, 59, 59), local(2026, 3, 23, 0, 0, 0), local(2026, 3, 30, 0, 0, 0), 7*24*time.Hour - time.Hour,
			"2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z"},
		{week, local(2026, 3, 30, 0, 0, 0), local(2026, 3, 30, 0, 0, 0), local(2026, 4, 6, 0, 0, 0), 7 * 24 * time.Hour,
			"2026-03-29T22:00:00Z", "2026-04-05T22:00:00Z"},
		{week, local(2026, 1, 1, 10, 0, 0), local(2025, 12, 29, 0, 0, 0), local(2026, 1, 5, 0, 0, 0), 7 * 24 * time.Hour,
			"2025-12-28T23:00:00Z", "2026-01-04T23:00:00Z"},
		{month, local(2024, 2, 29, 23, 59, 59), local(2024, 2, 1, 0, 0, 0), local(2024, 3, 1, 0, 0, 0), 29 * 24 * time.Hour,
			"2024-01-31T23:00:00Z", "2024-02-29T23:00:00Z"},
		{month, local(2026, 2, 14, 0, 0, 0), local(2026, 2, 1, 0, 0, 0), local(2026, 3, 1, 0, 0, 0), 28 * 24 * time.Hour,
			"2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z"},
		{month, local(2026, 3, 31, 0, 0, 0), local(2026, 3, 1, 0, 0, 0), local(2026, 4, 1, 0, 0, 0), 31*24*time.Hour - time.Hour,
			"2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{month, local(2026, 12, 31, 23, 0, 0), local(2026, 12, 1, 0, 0, 0), local(2027, 1, 1, 0, 0, 0), 31 * 24 * time.Hour,
			"2026-11-30T23:00:00Z", "2026-12-31T23:00:00Z"},
		{utcMonth, time.Date(2100, 2, 28, 12, 0, 0, 0, time.UTC), time.Date(2100, 2, 1, 0, 0, 0, 0, time.UTC),
			time.Date(2100, 3, 1, 0, 0, 0, 0, time.UTC), 28 * 24 * time.Hour, "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z"},
	}
	for _, c := range cases {
		start, end := c.rule.Bounds(c.at)
		if !start.Equal(c.start) || !end.Equal(c.end) || end.Sub(start) != c.wantLen ||
			start.UTC().Format(time.RFC3339) != c.startUTC || end.UTC().Format(time.RFC3339) != c.endUTC {
			t.Errorf("%s at %v: [%v, %v) (%v), want [%s, %s) (%v)", c.rule.Period, c.at, start.UTC(), end.UTC(), end.Sub(start),
				c.startUTC, c.endUTC, c.wantLen)
		}
		// The instant before the end is in the period, the end is not.
		if s2, _ := c.rule.Bounds(end.Add(-time.Nanosecond)); !s2.Equal(start) {
			t.Errorf("%v: the last instant of the period starts at %v", c.at, s2)
		}
		if s3, _ := c.rule.Bounds(end); !s3.Equal(end) {
			t.Errorf("%v: the end starts the next period at %v", c.at, s3)
		}
	}
}

// A daily quota in Rome over the short and the long day of 2026: never
// more than the limit in a day, refused with the wait to the next local
// midnight, fresh again exactly then; the headers' numbers follow the
// day's length.
func TestCalendarDailyQuotaAcrossDST(t *testing.T) {
	r := rome(t)
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		q := cal("daily", 3, limits.Day, r)
		for _, c := range []struct {
			day    time.Time
			length time.Duration
		}{
			{time.Date(2026, 3, 29, 0, 0, 0, 0, r), 23 * time.Hour},
			{time.Date(2026, 10, 25, 0, 0, 0, 0, r), 25 * time.Hour},
		} {
			first := allow(t, s, q, "k", 1, c.day)
			if !first.Allowed || first.Remaining != 2 || first.Period != c.length || first.ResetAfter != c.length {
				t.Fatalf("first of %v: %+v, want a %v day", c.day, first, c.length)
			}
			// Later the same day, 10 s before its end.
			late := c.day.Add(c.length - 10*time.Second)
			for i := range 2 {
				if d := allow(t, s, q, "k", 1, late); !d.Allowed || d.Remaining != int64(1-i) {
					t.Fatalf("%v: admission %d: %+v", late, i+2, d)
				}
			}
			d := allow(t, s, q, "k", 1, late)
			if d.Allowed || d.RetryAfter != 10*time.Second || d.ResetAfter != 10*time.Second || d.Remaining != 0 {
				t.Fatalf("over the daily quota at %v: %+v, want refused for 10 s", late, d)
			}
			if d := allow(t, s, q, "k", 1, c.day.Add(c.length-time.Nanosecond)); d.Allowed {
				t.Fatalf("admitted a nanosecond before midnight: %+v", d)
			}
			next := c.day.Add(c.length)
			if next.In(r).Hour() != 0 || next.In(r).Day() != c.day.Day()+1 {
				t.Fatalf("test's next midnight is %v", next.In(r))
			}
			if d := allow(t, s, q, "k", 1, next); !d.Allowed || d.Remaining != 2 {
				t.Fatalf("at the next midnight %v: %+v, want a fresh quota", next, d)
			}
		}
	})
}

// A refused request records nothing; a cost of 0 reads the count; Reset
// forgets it; a cost above the limit waits for a period that never
// admits it (the whole period).
func TestCalendarRefusedRecordsNothingAndReset(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		q := cal("monthly", 10, limits.Month, nil)
		now := time.Date(2026, 4, 30, 12, 0, 0, 0, time.UTC)
		if d := allow(t, s, q, "k", 7, now); !d.Allowed || d.Remaining != 3 {
			t.Fatalf("%+v", d)
		}
		if d := allow(t, s, q, "k", 4, now); d.Allowed || d.RetryAfter != 12*time.Hour {
			t.Fatalf("over: %+v", d)
		}
		if d := allow(t, s, q, "k", 3, now); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("the refusal took something: %+v", d)
		}
		if err := s.Reset(context.Background(), q, limits.KeyOf("caller", "k")); err != nil {
			t.Fatal(err)
		}
		if rem := read(t, s, one(q, "k"), now); rem[0] != 10 {
			t.Fatalf("after Reset: %d remaining", rem[0])
		}
		if d := allow(t, s, q, "k", 11, now); d.Allowed || d.RetryAfter != 12*time.Hour {
			t.Fatalf("a cost above the limit: %+v", d)
		}
	})
}

// Concurrent batches never admit more than the limit in a period.
func TestCalendarConcurrentNeverOverLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		q := cal("weekly", 10, limits.Week, rome(t))
		w := sw("window", 1000, time.Minute)
		now := time.Date(2026, 3, 29, 23, 59, 0, 0, rome(t))
		batch := func(int) []limits.Hit {
			k := limits.KeyOf("caller", "k")
			return []limits.Hit{{Rule: w, Key: k, Cost: 1}, {Rule: q, Key: k, Cost: 1}}
		}
		if n := fire(t, s, 40, batch, now); n != 10 {
			t.Fatalf("%d admitted, want 10", n)
		}
		if rem := read(t, s, batch(0), now); rem[0] != 990 || rem[1] != 0 {
			t.Fatalf("remaining %v, want [990 0]", rem)
		}
		// Monday 00:00 local starts the next week.
		if n := fire(t, s, 40, batch, now.Add(time.Minute)); n != 10 {
			t.Fatalf("next week: %d admitted, want 10", n)
		}
	})
}

// A monthly spend cap: a settlement lands in the month its admission was
// counted in while it is the current one, and is dropped after the
// boundary: never charged or refunded into the next month.
func TestCalendarSettlementStaysInItsPeriod(t *testing.T) {
	r := rome(t)
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		ctx := context.Background()
		q := cal("spend-month", 1_000_000, limits.Month, r) // micro-dollars
		q.Settles = true
		hit := limits.Hit{Rule: q, Key: limits.KeyOf("api_key", "k"), Cost: 600_000}
		decide := func(now time.Time) limits.Ticket {
			t.Helper()
			out := make([]limits.Decision, 1)
			if ok, err := s.Decide(ctx, []limits.Hit{hit}, now, out); !ok || err != nil {
				t.Fatalf("decision at %v: %v %v %+v", now, ok, err, out[0])
			}
			return out[0].Ticket
		}
		settle := func(tk limits.Ticket, actual int64, now time.Time) {
			t.Helper()
			if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: tk, Actual: actual}}, now); err != nil {
				t.Fatal(err)
			}
		}
		jan := time.Date(2026, 1, 31, 23, 59, 0, 0, r)
		feb := time.Date(2026, 2, 1, 0, 0, 1, 0, r)
		// Within the month: a refund and an extra charge both land.
		a := decide(jan.Add(-time.Hour))
		settle(a, 100_000, jan.Add(-time.Hour+time.Second))
		if rem := read(t, s, []limits.Hit{hit}, jan); rem[0] != 900_000 {
			t.Fatalf("January after a refund: %d remaining, want 900000", rem[0])
		}
		b := decide(jan)
		if rem := read(t, s, []limits.Hit{hit}, jan); rem[0] != 300_000 {
			t.Fatalf("January: %d remaining", rem[0])
		}
		// February: one admission of its own, then January's reservation
		// settles, once lower and once (another request) higher.
		c := decide(feb)
		settle(b, 0, feb.Add(time.Second))
		settle(a, 900_000, feb.Add(time.Second)) // an extra of 800000 owed to January
		if rem := read(t, s, []limits.Hit{hit}, feb.Add(2*time.Second)); rem[0] != 400_000 {
			t.Fatalf("February: %d remaining, want 400000: January's settlements touched it", rem[0])
		}
		// February's own settlement lands.
		settle(c, 50_000, feb.Add(3*time.Second))
		if rem := read(t, s, []limits.Hit{hit}, feb.Add(4*time.Second)); rem[0] != 950_000 {
			t.Fatalf("February after its own refund: %d remaining, want 950000", rem[0])
		}
		// A Reset forgets the counter: a settlement of what it counted is
		// dropped, not charged to the counter made again.
		d := decide(feb.Add(5 * time.Second))
		if err := s.Reset(ctx, q, hit.Key); err != nil {
			t.Fatal(err)
		}
		decide(feb.Add(6 * time.Second))
		settle(d, 1_000_000, feb.Add(7*time.Second))
		if rem := read(t, s, []limits.Hit{hit}, feb.Add(8*time.Second)); rem[0] != 400_000 {
			t.Fatalf("after a Reset: %d remaining, want 400000", rem[0])
		}
	})
}

// The state file carries calendar counters: the count of the current
// period comes back; a counter of a period that has ended is dropped at
// load.
func TestCalendarStateRoundTrip(t *testing.T) {
	r := rome(t)
	m := limits.NewMemory(limits.MemoryOptions{})
	q := cal("daily", 5, limits.Day, r)
	now := time.Date(2026, 10, 25, 23, 0, 0, 0, r)
	allow(t, m, q, "a", 3, now)
	allow(t, m, q, "b", 1, now.AddDate(0, 0, -1)) // the day before (25 h ago): ended
	var buf bytes.Buffer
	n, err := m.WriteState(&buf, now)
	if err != nil || n != 1 {
		t.Fatalf("saved %d, %v; want the one live counter", n, err)
	}
	saved := buf.Bytes()
	m2 := limits.NewMemory(limits.MemoryOptions{})
	st, err := m2.ReadState(bytes.NewReader(saved), now.Add(time.Minute))
	if err != nil || st.Loaded != 1 {
		t.Fatalf("%+v %v", st, err)
	}
	if d := allow(t, m2, q, "a", 3, now.Add(time.Minute)); d.Allowed || d.Remaining != 2 || d.RetryAfter != 59*time.Minute {
		t.Fatalf("restored counter: %+v, want 2 left until midnight", d)
	}
	if d := allow(t, m2, q, "a", 2, now.Add(time.Minute)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("restored counter: %+v", d)
	}
	// Loaded after midnight, the day's counter has nothing left to say.
	m3 := limits.NewMemory(limits.MemoryOptions{})
	st, err = m3.ReadState(bytes.NewReader(saved), now.Add(time.Hour))
	if err != nil || st.Loaded != 0 || st.Expired != 1 {
		t.Fatalf("loaded after the period: %+v %v", st, err)
	}
	// A corrupted calendar record is damage, not a panic.
	bad := bytes.Clone(saved)
	bad[len(bad)-40] ^= 0xff
	if _, err := limits.NewMemory(limits.MemoryOptions{}).ReadState(bytes.NewReader(bad), now); err == nil {
		t.Fatal("a corrupted stream loaded")
	}
}

// On a Redis Cluster a batch split over slots whose later part refuses
// rolls back the calendar counter of an earlier part: the refused request
// records nothing anywhere.
func TestCalendarClusterRollback(t *testing.T) {
	redistest.Require(t)
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	s := clusterStore(t, c, "calrb:", time.Second)
	q := cal("month", 100, limits.Month, nil)
	checked := 0
	for round := 0; checked < 4 && round < 200; round++ {
		gate := sw(fmt.Sprintf("gate%d", round), 1, time.Hour)
		k := limits.KeyOf("caller", fmt.Sprint("c", round))
		// Only batches whose calendar part is decided first (parts go in
		// slot order): the gate's refusal must roll it back.
		if limits.Slot("calrb:{month|"+k.String()+"}") >= limits.Slot("calrb:{"+gate.Name+"|}") {
			continue
		}
		checked++
		batch := []limits.Hit{{Rule: q, Key: k, Cost: 10}, {Rule: gate, Key: limits.NewKey(), Cost: 1}}
		out := make([]limits.Decision, 2)
		now := time.Now()
		if ok, err := s.Decide(context.Background(), batch, now, out); !ok || err != nil {
			t.Fatalf("first: %v %v %+v", ok, err, out)
		}
		ok, err := s.Decide(context.Background(), batch, now, out)
		if ok || err != nil || out[1].Allowed || !out[1].Ticket.IsZero() || !out[0].Ticket.IsZero() {
			t.Fatalf("second: %v %v %+v", ok, err, out)
		}
		if rem := read(t, s, batch[:1], now); rem[0] != 90 {
			t.Fatalf("round %d: %d remaining, want 90: the refused batch stayed counted", round, rem[0])
		}
	}
	if checked < 4 {
		t.Fatalf("only %d batches split with the calendar part first", checked)
	}
}
