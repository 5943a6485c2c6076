package limits_test

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// The behavioural table: every case runs on a fake clock against every
// Store (Memory, and Redis driven by the same clock), for both algorithms.
// Every Decide step is first Peeked with the same batch at the same time:
// the Peek must give the same answers, and record nothing.

func sw(name string, limit int64, window time.Duration) *limits.Rule {
	return &limits.Rule{Name: name, Algorithm: limits.SlidingWindow, Limit: limit, Window: window}
}

func tb(name string, limit int64, window time.Duration, burst int64) *limits.Rule {
	return &limits.Rule{Name: name, Algorithm: limits.TokenBucket, Limit: limit, Window: window, Burst: burst}
}

func shadow(r *limits.Rule) *limits.Rule { r.Shadow = true; return r }

type op int

const (
	opDecide op = iota
	opPeek
	opReset
)

// probe is one hit of a step's batch.
type probe struct {
	rule int    // index in the case's rules
	key  string // "a" when empty
	cost int64  // 1 when 0, unless free
	free bool   // cost 0: reads the state
	own  []int64
}

// none expects a zero ResetAfter or NextAfter (zero in a want means
// "not checked").
const none time.Duration = -1

// want is what a hit's decision must say.
type want struct {
	allowed     bool
	remaining   int64
	retry       time.Duration // exact: the expected wait when refused
	reset, next time.Duration // checked when not zero; none: must be 0
}

type step struct {
	at   float64 // seconds after t0
	op   op
	n    int     // times the step is repeated (1 when 0); the wants hold for the last
	hits []probe // one probe{} when empty
	want []want  // one per hit
}

type behaviour struct {
	name  string
	rules []*limits.Rule
	steps []step
}

var longKey = strings.Repeat("k", 100_000)

// ok and no are a one-hit step's want.
func ok(remaining int64) []want { return []want{{allowed: true, remaining: remaining}} }
func no(remaining int64, retry time.Duration) []want {
	return []want{{remaining: remaining, retry: retry}}
}

var behaviours = []behaviour{
	// Seed 001, Behaviour Story 1: a request with tokens available.
	{"story1/full-bucket-first-request", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, want: []want{{allowed: true, remaining: 9, reset: 6 * time.Second, next: 6 * time.Second}}},
	}},
	{"story1/partly-consumed-bucket", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 7, want: ok(3)},
		{at: 0, want: ok(2)},
	}},
	{"story1/clients-do-not-share-tokens", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 9, want: ok(1)},
		{at: 1, hits: []probe{{key: "a"}, {key: "b"}}, want: []want{{allowed: true, remaining: 0}, {allowed: true, remaining: 9}}},
	}},
	// Story 2: refused with the right wait.
	{"story2/over-the-limit", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 10, want: ok(0)},
		{at: 0, want: no(0, 6*time.Second)},
	}},
	{"story2/retry-after-reflects-next-token", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 10, want: ok(0)},
		{at: 2, want: []want{{remaining: 0, retry: 4 * time.Second, next: 4 * time.Second, reset: 58 * time.Second}}},
	}},
	{"story2/refused-requests-consume-nothing", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 10, want: ok(0)},
		{at: 1, n: 5, want: no(0, 5*time.Second)},
		{at: 6, want: ok(0)},
		{at: 6, want: no(0, 6*time.Second)},
	}},
	// Story 3: lazy refill.
	{"story3/tokens-refill-after-waiting", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 10, want: ok(0)},
		{at: 30, want: ok(4)},
	}},
	{"story3/refill-never-above-burst", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 2, want: ok(8)},
		{at: 60, want: []want{{allowed: true, remaining: 9, reset: 6 * time.Second}}},
	}},
	{"story3/partial-refill-rounds-down", []*limits.Rule{tb("r", 1, time.Second, 1)}, []step{
		{at: 0, want: ok(0)},
		{at: 0.5, want: no(0, 500*time.Millisecond)},
		{at: 1, want: ok(0)},
	}},
	// Seed 001, Edge Cases.
	{"edge/clock-going-backwards-adds-nothing", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 60, n: 5, want: ok(5)},
		{at: 0, want: ok(4)},                  // no tokens from a negative elapsed
		{at: 66, want: ok(4)},                 // one token since 60 s: the stored time did not move back
		{at: 10, n: 4, want: ok(0)},           // still nothing added, never below zero
		{at: 30, want: no(0, 42*time.Second)}, // the next token comes at 72 s
	}},
	{"edge/very-long-key", []*limits.Rule{tb("r", 10, time.Minute, 10), sw("w", 2, time.Minute)}, []step{
		{at: 0, hits: []probe{{key: longKey}, {rule: 1, key: longKey}}, want: []want{{allowed: true, remaining: 9}, {allowed: true, remaining: 1}}},
		{at: 1, hits: []probe{{key: longKey}, {rule: 1, key: longKey}}, want: []want{{allowed: true, remaining: 8}, {allowed: true, remaining: 0}}},
		{at: 2, hits: []probe{{key: longKey + "x"}}, want: ok(9)},
	}},
	{"edge/first-request-passes", []*limits.Rule{tb("r", 10, time.Minute, 1)}, []step{
		{at: 0, want: []want{{allowed: true, remaining: 0, next: 6 * time.Second, reset: 6 * time.Second}}},
		{at: 1, want: no(0, 5*time.Second)},
	}},
	{"edge/limit-zero-refuses-everything", []*limits.Rule{tb("r", 0, time.Minute, 10), sw("w", 0, time.Minute)}, []step{
		{at: 0, want: []want{{remaining: 0, retry: time.Minute, reset: none, next: none}}},
		{at: 100, want: no(0, time.Minute)},
		{at: 100, hits: []probe{{rule: 1}}, want: no(0, time.Minute)},
	}},
	{"edge/overflow-after-days-clamps-to-burst", []*limits.Rule{tb("r", 10, time.Minute, 10), tb("fast", 1e15, time.Second, 10)}, []step{
		{at: 0, n: 10, want: ok(0)},
		{at: 0, hits: []probe{{rule: 1}}, n: 10, want: ok(0)},
		{at: 3 * 86400, want: ok(9)},
		{at: 10 * 86400, hits: []probe{{rule: 1}}, want: ok(9)},
	}},
	// More token bucket.
	{"bucket/fractional-tokens-are-kept", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 10, want: ok(0)},
		{at: 3, want: []want{{remaining: 0, retry: 3 * time.Second, next: 3 * time.Second}}},
		{at: 9, want: []want{{allowed: true, remaining: 0, next: 3 * time.Second}}}, // 1.5 tokens, 0.5 kept
		{at: 12, want: ok(0)},
	}},
	{"bucket/cost-above-burst-never-fits", []*limits.Rule{tb("r", 10, time.Minute, 5)}, []step{
		{at: 0, hits: []probe{{cost: 6}}, want: no(5, time.Minute)},
		{at: 0, hits: []probe{{cost: 5}}, want: []want{{allowed: true, remaining: 0, reset: 30 * time.Second, next: 6 * time.Second}}},
		{at: 12, hits: []probe{{cost: 3}}, want: no(2, 6*time.Second)},
	}},
	{"bucket/burst-zero", []*limits.Rule{tb("r", 10, time.Minute, 0)}, []step{
		{at: 0, want: []want{{remaining: 0, retry: time.Minute, reset: none, next: none}}},
		{at: 0, hits: []probe{{free: true}}, want: []want{{allowed: true, remaining: 0}}},
	}},
	{"bucket/cost-zero-reads", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 3, want: ok(7)},
		{at: 1, hits: []probe{{free: true}}, want: []want{{allowed: true, remaining: 7, next: 5 * time.Second, reset: 17 * time.Second}}},
		{at: 1, op: opPeek, hits: []probe{{free: true}}, want: ok(7)},
	}},
	// Sliding window.
	{"window/rolling-not-fixed", []*limits.Rule{sw("r", 2, time.Minute)}, []step{
		{at: 0, want: []want{{allowed: true, remaining: 1, reset: time.Minute}}},
		{at: 40, want: []want{{allowed: true, remaining: 0, reset: time.Minute}}},
		{at: 41, want: []want{{remaining: 0, retry: 19 * time.Second, reset: 59 * time.Second}}},
		{at: 59.999, want: no(0, time.Millisecond)},
		{at: 60.5, want: []want{{allowed: true, remaining: 0, reset: time.Minute}}},
		{at: 99.9, want: no(0, 100*time.Millisecond)},
		{at: 100, want: ok(0)},
	}},
	{"window/callers-never-share-budgets", []*limits.Rule{sw("r", 1, time.Minute)}, []step{
		{at: 0, hits: []probe{{key: "a"}}, want: ok(0)},
		{at: 1, hits: []probe{{key: "b"}}, want: ok(0)},
		{at: 2, hits: []probe{{key: "a"}}, want: no(0, 58*time.Second)},
		{at: 3, hits: []probe{{key: "b"}}, want: no(0, 58*time.Second)},
		{at: 4, hits: []probe{{key: "c"}}, want: ok(0)},
	}},
	{"window/refused-requests-consume-nothing", []*limits.Rule{sw("r", 2, time.Minute)}, []step{
		{at: 0, want: ok(1)},
		{at: 10, want: ok(0)},
		{at: 20, want: no(0, 40*time.Second)},
		{at: 30, want: no(0, 30*time.Second)},
		{at: 59, want: no(0, time.Second)},
		{at: 60, want: ok(0)},
		{at: 70, want: ok(0)},
	}},
	{"window/boundary-excludes-the-old-admission", []*limits.Rule{sw("r", 1, time.Minute)}, []step{
		{at: 0, want: ok(0)},
		{at: 60, want: ok(0)},
	}},
	{"window/retry-after-is-when-this-cost-fits", []*limits.Rule{sw("r", 5, time.Minute)}, []step{
		{at: 0, hits: []probe{{cost: 2}}, want: ok(3)},
		{at: 10, hits: []probe{{cost: 2}}, want: ok(1)},
		{at: 20, want: ok(0)},
		{at: 30, hits: []probe{{cost: 3}}, want: []want{{remaining: 0, retry: 40 * time.Second, next: 30 * time.Second}}},
		{at: 30, hits: []probe{{cost: 6}}, want: no(0, time.Minute)},
	}},
	{"window/clock-going-backwards", []*limits.Rule{sw("r", 2, time.Minute)}, []step{
		{at: 50, want: ok(1)},
		{at: 10, want: ok(0)},
		{at: 109, want: no(0, time.Second)},
		{at: 110, want: ok(1)}, // both counted at 50 s: they leave together
	}},
	// Own limits: a tier or an override in place of the rule's.
	{"own/window-limit", []*limits.Rule{sw("r", 10, time.Minute)}, []step{
		{at: 0, n: 2, hits: []probe{{own: []int64{2, 0}}}, want: ok(0)},
		{at: 1, hits: []probe{{own: []int64{2, 0}}}, want: no(0, 59*time.Second)},
		{at: 2, want: ok(7)}, // the rule's own limit: the same counter
	}},
	{"own/bucket-limit-and-burst", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []step{
		{at: 0, n: 3, hits: []probe{{own: []int64{60, 3}}}, want: ok(0)},
		{at: 0.25, hits: []probe{{own: []int64{60, 3}}}, want: []want{{remaining: 0, retry: 750 * time.Millisecond, reset: 2750 * time.Millisecond}}},
		{at: 1, hits: []probe{{own: []int64{60, 3}}}, want: ok(0)},
	}},
	// Shadow rules never veto; they count only what fits.
	{"shadow/never-vetoes", []*limits.Rule{sw("enforce", 10, time.Minute), shadow(sw("shadow", 1, time.Minute))}, []step{
		{at: 0, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 9}, {allowed: true, remaining: 0}}},
		{at: 1, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 8}, {remaining: 0, retry: 59 * time.Second}}},
		{at: 2, op: opPeek, hits: []probe{{rule: 1, free: true}}, want: ok(0)},
	}},
	{"shadow/recorded-only-when-it-fits", []*limits.Rule{sw("enforce", 10, time.Minute), shadow(tb("shadow", 10, time.Minute, 2))}, []step{
		{at: 0, n: 2, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 8}, {allowed: true, remaining: 0}}},
		{at: 0, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 7}, {remaining: 0, retry: 6 * time.Second}}},
		{at: 6, hits: []probe{{rule: 1, free: true}}, want: ok(1)}, // the refused shadow hit took nothing
	}},
	{"shadow/refused-batch-records-nothing", []*limits.Rule{sw("enforce", 1, time.Minute), shadow(sw("shadow", 10, time.Minute)), shadow(tb("bucket", 10, time.Minute, 10))}, []step{
		{at: 0, hits: []probe{{}, {rule: 1}, {rule: 2}}, want: []want{{allowed: true, remaining: 0}, {allowed: true, remaining: 9}, {allowed: true, remaining: 9}}},
		{at: 1, hits: []probe{{}, {rule: 1}, {rule: 2}}, want: []want{{remaining: 0, retry: 59 * time.Second}, {allowed: true, remaining: 9}, {allowed: true, remaining: 9}}},
		{at: 1, hits: []probe{{rule: 1, free: true}, {rule: 2, free: true}}, want: []want{{allowed: true, remaining: 9}, {allowed: true, remaining: 9}}},
	}},
	{"shadow/only-shadow-hits-always-pass", []*limits.Rule{shadow(sw("shadow", 0, time.Minute)), shadow(tb("bucket", 0, time.Minute, 5))}, []step{
		{at: 0, hits: []probe{{}, {rule: 1}}, want: []want{{remaining: 0, retry: time.Minute}, {remaining: 0, retry: time.Minute}}},
	}},
	// Peek records nothing (and answers as Decide: checked on every step).
	{"peek/records-nothing", []*limits.Rule{sw("w", 2, time.Minute), tb("b", 10, time.Minute, 2)}, []step{
		{at: 0, op: opPeek, n: 5, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 1, reset: time.Minute, next: time.Minute}, {allowed: true, remaining: 1, reset: 6 * time.Second, next: 6 * time.Second}}},
		{at: 0, n: 2, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 0}, {allowed: true, remaining: 0}}},
		{at: 1, op: opPeek, n: 3, hits: []probe{{}, {rule: 1}}, want: []want{{remaining: 0, retry: 59 * time.Second}, {remaining: 0, retry: 5 * time.Second}}},
		{at: 1, op: opPeek, hits: []probe{{free: true}, {rule: 1, free: true}}, want: []want{{allowed: true, remaining: 0}, {allowed: true, remaining: 0}}},
	}},
	// Reset forgets a key's counters, and only that key's.
	{"reset/forgets-the-key", []*limits.Rule{sw("w", 2, time.Minute), tb("b", 10, time.Minute, 2)}, []step{
		{at: 0, n: 2, hits: []probe{{}, {rule: 1}, {key: "other"}}, want: []want{{allowed: true, remaining: 0}, {allowed: true, remaining: 0}, {allowed: true, remaining: 0}}},
		{at: 1, op: opReset, hits: []probe{{}}},
		{at: 1, op: opReset, hits: []probe{{rule: 1}}},
		{at: 1, op: opReset, hits: []probe{{key: "never-seen"}}},
		{at: 1, hits: []probe{{}, {rule: 1}}, want: []want{{allowed: true, remaining: 1}, {allowed: true, remaining: 1}}},
		{at: 1, hits: []probe{{key: "other"}}, want: no(0, 59*time.Second)},
	}},
	// Past 1000 slots a window groups admissions by 1/1000 of the window
	// (60 ms here): an admission joins its group, which leaves the window
	// with its latest admission.
	{"window/grouped-past-1000-slots", []*limits.Rule{sw("w", 2000, time.Minute)}, []step{
		{at: 0, hits: []probe{{cost: 600}}, want: []want{{allowed: true, remaining: 1400, reset: time.Minute, next: time.Minute}}},
		{at: 0.03125, hits: []probe{{cost: 600}}, want: []want{{allowed: true, remaining: 800, reset: time.Minute, next: time.Minute}}},
		{at: 30, hits: []probe{{cost: 600}}, want: []want{{allowed: true, remaining: 200, reset: time.Minute, next: 30031250 * time.Microsecond}}},
		{at: 30.5, hits: []probe{{cost: 600}}, want: []want{{remaining: 200, retry: 29531250 * time.Microsecond,
			reset: 59500 * time.Millisecond, next: 29531250 * time.Microsecond}}},
		{at: 60.0625, hits: []probe{{cost: 600}}, want: []want{{allowed: true, remaining: 800, reset: time.Minute, next: 29937500 * time.Microsecond}}},
		{at: 60.0625, hits: []probe{{cost: 900}}, want: []want{{remaining: 800, retry: 29937500 * time.Microsecond}}},
	}},
	// A reload that changes a rule's algorithm starts it afresh.
	{"reload/algorithm-change-starts-afresh", []*limits.Rule{sw("r", 1, time.Minute), tb("r", 10, time.Minute, 3)}, []step{
		{at: 0, want: ok(0)},
		{at: 1, hits: []probe{{rule: 1}}, want: ok(2)},
	}},
}

func TestBehaviour(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for _, bc := range behaviours {
			t.Run(bc.name, func(t *testing.T) { bc.run(t, newStore()) })
		}
	})
}

func (bc *behaviour) run(t *testing.T, s limits.Store) {
	ctx := context.Background()
	for si, st := range bc.steps {
		probes := st.hits
		if len(probes) == 0 {
			probes = []probe{{}}
		}
		hits := make([]limits.Hit, len(probes))
		for i, p := range probes {
			h := limits.Hit{Rule: bc.rules[p.rule], Key: limits.KeyOf("caller", cmp.Or(p.key, "a")), Cost: cmp.Or(p.cost, 1)}
			if p.free {
				h.Cost = 0
			}
			if p.own != nil {
				h.Own, h.Limit, h.Burst = true, p.own[0], p.own[1]
			}
			hits[i] = h
		}
		now := at(st.at)
		for rep := range max(st.n, 1) {
			label := fmt.Sprintf("step %d (t=%vs) #%d", si, st.at, rep+1)
			if st.op == opReset {
				if err := s.Reset(ctx, hits[0].Rule, hits[0].Key); err != nil {
					t.Fatalf("%s: Reset: %v", label, err)
				}
				continue
			}
			peek := make([]limits.Decision, len(hits))
			pok, err := s.Peek(ctx, hits, now, peek)
			if err != nil {
				t.Fatalf("%s: Peek: %v", label, err)
			}
			out := peek
			if st.op == opDecide {
				out = make([]limits.Decision, len(hits))
				dok, err := s.Decide(ctx, hits, now, out)
				if err != nil {
					t.Fatalf("%s: Decide: %v", label, err)
				}
				if dok != pok || fmt.Sprint(untick(out)) != fmt.Sprint(peek) {
					t.Fatalf("%s: Peek answered %v %+v, Decide %v %+v", label, pok, peek, dok, out)
				}
				pok = dok
			}
			checkTickets(t, label, hits, pok, out, st.op == opDecide)
			wantOK := true
			for i, h := range hits {
				if !h.Rule.Shadow && !out[i].Allowed {
					wantOK = false
				}
			}
			if pok != wantOK {
				t.Fatalf("%s: batch verdict %v with decisions %+v", label, pok, out)
			}
			if rep < max(st.n, 1)-1 {
				for i := range hits {
					if out[i].Allowed != st.want[i].allowed {
						t.Fatalf("%s: hit %d: %+v, want allowed=%v", label, i, out[i], st.want[i].allowed)
					}
				}
				continue
			}
			for i := range hits {
				checkDecision(t, fmt.Sprintf("%s hit %d", label, i), &hits[i], out[i], st.want[i])
			}
		}
	}
}

// untick returns a copy of ds without their tickets, to compare the
// decisions of calls that record with those of calls that do not, or of
// different stores.
func untick(ds []limits.Decision) []limits.Decision {
	c := make([]limits.Decision, len(ds))
	for i, d := range ds {
		d.Ticket = limits.Ticket{}
		c[i] = d
	}
	return c
}

// checkTickets checks that a decision carries a ticket exactly when its
// hit was recorded: by Decide, in an admitted batch, a hit of some cost
// that its rule admitted.
func checkTickets(t *testing.T, label string, hits []limits.Hit, ok bool, out []limits.Decision, decided bool) {
	t.Helper()
	for i := range hits {
		want := decided && ok && out[i].Allowed && hits[i].Cost > 0
		if out[i].Ticket.IsZero() == want {
			t.Fatalf("%s: hit %d (cost %d) has a ticket: %v, want %v; %+v", label, i, hits[i].Cost, !out[i].Ticket.IsZero(), want, out[i])
		}
	}
}

func checkDecision(t *testing.T, label string, h *limits.Hit, d limits.Decision, w want) {
	t.Helper()
	limit, _ := h.Limits()
	bad := d.Allowed != w.allowed || d.Remaining != w.remaining || d.Limit != limit
	if w.allowed {
		bad = bad || d.RetryAfter != 0
	} else {
		bad = bad || d.RetryAfter != w.retry || w.retry == 0
	}
	for _, c := range []struct{ got, want time.Duration }{{d.ResetAfter, w.reset}, {d.NextAfter, w.next}} {
		switch c.want {
		case 0:
		case none:
			bad = bad || c.got != 0
		default:
			bad = bad || c.got != c.want
		}
	}
	if bad {
		t.Fatalf("%s: got %+v, want %+v (limit %d)", label, d, w, limit)
	}
}
