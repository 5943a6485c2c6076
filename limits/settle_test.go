package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// The behavioural table of Settle: every case runs on a fake clock against
// every Store (Memory, and Redis driven by the same clock). A Decide step
// may name its hit's ticket; a Settle step settles a named ticket to an
// actual cost; Peek and Decide steps check the state that results.

type settleOp int

const (
	sDecide settleOp = iota
	sPeek
	sSettle
	sReset
)

type sstep struct {
	at     float64 // seconds after t0
	op     settleOp
	rule   int    // index in the case's rules
	cost   int64  // Decide, Peek: the hit's cost
	tag    string // Decide: names its ticket; Settle: the ticket it settles
	actual int64  // Settle
	want   *want  // Decide, Peek: nil when not checked
}

type settleCase struct {
	name  string
	rules []*limits.Rule
	steps []sstep
}

func okw(remaining int64) *want { return &want{allowed: true, remaining: remaining} }

var settleCases = []settleCase{
	{"window/refund-exact-slots", []*limits.Rule{sw("r", 10, time.Minute)}, []sstep{
		{at: 0, cost: 8, tag: "a", want: okw(2)},
		{at: 1, cost: 5, want: &want{remaining: 2, retry: 59 * time.Second}},
		{at: 2, op: sSettle, tag: "a", actual: 3}, // 5 back: the slot at 0 s holds 3
		{at: 3, cost: 5, tag: "b", want: okw(2)},
		{at: 4, op: sPeek, cost: 3, want: &want{remaining: 2, retry: 56 * time.Second, reset: 59 * time.Second, next: 56 * time.Second}},
		{at: 4, op: sSettle, tag: "b", actual: 0}, // the slot at 3 s empties: dropped
		{at: 5, op: sPeek, cost: 7, want: &want{allowed: true, remaining: 0, reset: time.Minute, next: 55 * time.Second}},
		{at: 5, op: sPeek, cost: 0, want: &want{allowed: true, remaining: 7, reset: 55 * time.Second, next: 55 * time.Second}},
	}},
	{"window/refund-grouped-slots", []*limits.Rule{sw("big", 5000, time.Minute)}, []sstep{
		{at: 0, cost: 3000, tag: "a", want: okw(2000)},
		{at: 0.001, cost: 1500, tag: "b", want: okw(500)}, // the same 1/1000 of the window: one slot, at 1 ms
		{at: 0.5, cost: 1000, want: &want{remaining: 500, retry: 59501 * time.Millisecond}},
		{at: 1, op: sSettle, tag: "a", actual: 1000}, // 2000 back from the grouped slot
		{at: 1, cost: 2500, tag: "c", want: okw(0)},
		{at: 2, op: sPeek, cost: 1, want: &want{remaining: 0, retry: 58001 * time.Millisecond}},
		{at: 2, op: sSettle, tag: "b", actual: 0},
		{at: 2, op: sPeek, cost: 1500, want: okw(0)},
		{at: 2, op: sPeek, cost: 1501, want: &want{remaining: 1500, retry: 58001 * time.Millisecond}},
	}},
	{"window/refund-after-the-slot-left-does-nothing", []*limits.Rule{sw("r", 2, time.Minute)}, []sstep{
		{at: 0, cost: 2, tag: "a", want: okw(0)},
		{at: 61, cost: 2, tag: "b", want: okw(0)},
		{at: 62, op: sSettle, tag: "a", actual: 0},
		{at: 63, op: sPeek, cost: 1, want: &want{remaining: 0, retry: 58 * time.Second}},
	}},
	{"window/refund-of-an-admission-out-of-the-window-in-a-later-slot-does-nothing", []*limits.Rule{sw("big", 5000, time.Minute)}, []sstep{
		{at: 0, cost: 3000, tag: "a", want: okw(2000)},
		{at: 0.05, cost: 1000, want: okw(1000)}, // joins a's slot, which moves to 50 ms
		{at: 60.02, op: sSettle, tag: "a", actual: 0},
		{at: 60.03, op: sPeek, cost: 1000, want: okw(0)},
		{at: 60.03, op: sPeek, cost: 1001, want: &want{remaining: 1000, retry: 20 * time.Millisecond}},
	}},
	{"window/extra-charge-past-the-limit", []*limits.Rule{sw("r", 10, time.Minute)}, []sstep{
		{at: 0, cost: 4, tag: "a", want: okw(6)},
		{at: 10, cost: 3, tag: "b", want: okw(3)},
		{at: 20, op: sSettle, tag: "a", actual: 12}, // 8 more, counted at 20 s: 15 of 10
		{at: 21, cost: 1, want: &want{remaining: 0, retry: 49 * time.Second, reset: 59 * time.Second, next: 39 * time.Second}},
		{at: 21, op: sPeek, cost: 0, want: okw(0)}, // a cost of 0 still reads
		{at: 70.5, cost: 1, want: okw(1)},          // only the 8 at 20 s are left
	}},
	{"window/extra-charge-at-capacity-joins-the-newest-slot", []*limits.Rule{sw("r", 2, time.Minute)}, []sstep{
		{at: 0, cost: 1, tag: "a", want: okw(1)},
		{at: 1, cost: 1, tag: "b", want: okw(0)},
		{at: 2, op: sSettle, tag: "a", actual: 3}, // 2 slots of 2: the 2 more join b's, which moves to 2 s
		{at: 2, op: sSettle, tag: "b", actual: 0}, // b's unit out of that slot
		{at: 3, cost: 1, want: &want{remaining: 0, retry: 59 * time.Second}},
		{at: 60.5, op: sPeek, cost: 1, want: &want{remaining: 0, retry: 1500 * time.Millisecond}},
	}},
	{"bucket/refund", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 8, tag: "a", want: okw(2)},
		{at: 6, op: sSettle, tag: "a", actual: 2}, // 6 back at the bucket's time (0 s): 8, 9 at 6 s
		{at: 6, op: sPeek, cost: 0, want: &want{allowed: true, remaining: 9, reset: 6 * time.Second, next: 6 * time.Second}},
	}},
	{"bucket/refund-capped-at-burst", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 5, tag: "a", want: okw(5)},
		{at: 30, cost: 1, tag: "b", want: okw(9)}, // refilled to 10, 9 left at 30 s
		{at: 31, op: sSettle, tag: "a", actual: 0},
		{at: 31, op: sPeek, cost: 0, want: &want{allowed: true, remaining: 10, reset: none, next: none}},
		{at: 31, cost: 10, want: okw(0)},
		{at: 31, cost: 1, want: &want{remaining: 0, retry: 6 * time.Second}},
	}},
	{"bucket/debt-refills-before-the-next-admission", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 10, tag: "a", want: okw(0)},
		{at: 0, op: sSettle, tag: "a", actual: 15}, // 5 more: -5 tokens
		{at: 6, cost: 1, want: &want{remaining: 0, retry: 30 * time.Second, reset: 84 * time.Second, next: 30 * time.Second}},
		{at: 6, op: sPeek, cost: 0, want: &want{allowed: true, remaining: 0, reset: 84 * time.Second, next: 30 * time.Second}},
		{at: 35.9, op: sPeek, cost: 1, want: &want{remaining: 0, retry: 100 * time.Millisecond}},
		{at: 36, cost: 1, want: okw(0)},
	}},
	{"bucket/a-debt-deeper-than-the-burst", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 10, tag: "a", want: okw(0)},
		{at: 0, op: sSettle, tag: "a", actual: 40}, // -30: three bursts in debt
		{at: 60, cost: 1, want: &want{remaining: 0, retry: 126 * time.Second, reset: 180 * time.Second}},
		{at: 239.9, op: sPeek, cost: 10, want: &want{remaining: 9, retry: 100 * time.Millisecond}},
		{at: 240, cost: 10, want: okw(0)},
	}},
	{"bucket/extra-charge-at-later-time", []*limits.Rule{tb("r", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 4, tag: "a", want: okw(6)},
		{at: 12, op: sSettle, tag: "a", actual: 7}, // 8 at 12 s, 3 taken: 5
		{at: 12, op: sPeek, cost: 0, want: &want{allowed: true, remaining: 5, reset: 30 * time.Second}},
	}},
	{"skipped/zero-ticket-and-equal-actual", []*limits.Rule{sw("w", 2, time.Minute), tb("b", 10, time.Minute, 2)}, []sstep{
		{at: 0, cost: 2, tag: "a", want: okw(0)},
		{at: 0, rule: 1, cost: 2, tag: "ba", want: okw(0)},
		{at: 1, cost: 1, tag: "refused", want: &want{remaining: 0, retry: 59 * time.Second}},
		{at: 1, rule: 1, cost: 1, tag: "brefused", want: &want{remaining: 0, retry: 5 * time.Second}},
		{at: 1, cost: 0, tag: "free", want: okw(0)},
		{at: 1, op: sSettle, tag: "refused", actual: 0},
		{at: 1, op: sSettle, tag: "brefused", actual: 0},
		{at: 1, op: sSettle, tag: "free", actual: 5},
		{at: 2, op: sSettle, tag: "a", actual: 2},
		{at: 2, op: sSettle, tag: "ba", actual: 2},
		{at: 3, op: sPeek, cost: 1, want: &want{remaining: 0, retry: 57 * time.Second}},
		{at: 3, op: sPeek, rule: 1, cost: 1, want: &want{remaining: 0, retry: 3 * time.Second}},
	}},
	{"reset/refund-after-reset-is-skipped", []*limits.Rule{sw("w", 5, time.Minute), tb("b", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 5, tag: "a", want: okw(0)},
		{at: 0, rule: 1, cost: 10, tag: "ba", want: okw(0)},
		{at: 1, op: sReset},
		{at: 1, op: sReset, rule: 1},
		{at: 2, cost: 3, tag: "b", want: okw(2)}, // a new counter
		{at: 3, op: sSettle, tag: "a", actual: 0},
		{at: 3, op: sSettle, tag: "ba", actual: 0},
		{at: 4, op: sPeek, cost: 3, want: &want{remaining: 2, retry: 58 * time.Second}},
		{at: 4, op: sPeek, rule: 1, cost: 0, want: &want{allowed: true, remaining: 10, reset: none, next: none}},
	}},
	{"reload/settle-after-an-algorithm-change-is-harmless", []*limits.Rule{sw("r", 5, time.Minute), tb("r", 10, time.Minute, 10)}, []sstep{
		{at: 0, cost: 5, tag: "a", want: okw(0)},
		{at: 1, rule: 1, cost: 4, want: okw(6)}, // the rule is a bucket now: a fresh counter
		{at: 2, op: sSettle, tag: "a", actual: 0},
		{at: 2, op: sSettle, tag: "a", actual: 9},
		{at: 2, op: sPeek, rule: 1, cost: 0, want: &want{allowed: true, remaining: 6}},
	}},
}

func TestSettle(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for _, sc := range settleCases {
			t.Run(sc.name, func(t *testing.T) { sc.run(t, newStore()) })
		}
	})
}

type decided struct {
	hit    limits.Hit
	ticket limits.Ticket
}

func (sc *settleCase) run(t *testing.T, s limits.Store) {
	ctx := context.Background()
	tickets := map[string]decided{}
	for si, st := range sc.steps {
		label := fmt.Sprintf("step %d (t=%vs)", si, st.at)
		now := at(st.at)
		h := limits.Hit{Rule: sc.rules[st.rule], Key: limits.KeyOf("caller", "a"), Cost: st.cost}
		switch st.op {
		case sReset:
			if err := s.Reset(ctx, h.Rule, h.Key); err != nil {
				t.Fatalf("%s: Reset: %v", label, err)
			}
			continue
		case sSettle:
			d, ok := tickets[st.tag]
			if !ok {
				t.Fatalf("%s: no ticket %q", label, st.tag)
			}
			if err := s.Settle(ctx, []limits.Settlement{{Hit: d.hit, Ticket: d.ticket, Actual: st.actual}}, now); err != nil {
				t.Fatalf("%s: Settle: %v", label, err)
			}
			continue
		}
		out := make([]limits.Decision, 1)
		call := s.Decide
		if st.op == sPeek {
			call = s.Peek
		}
		ok, err := call(ctx, []limits.Hit{h}, now, out)
		if err != nil || ok != out[0].Allowed {
			t.Fatalf("%s: %v %v %+v", label, ok, err, out[0])
		}
		checkTickets(t, label, []limits.Hit{h}, ok, out, st.op == sDecide)
		if st.tag != "" {
			tickets[st.tag] = decided{h, out[0].Ticket}
		}
		if st.want != nil {
			checkDecision(t, label, &h, out[0], *st.want)
		}
	}
}

// A malformed settlement is the caller's bug: ErrBatch, nothing settled;
// an empty list or one with nothing to correct is no error.
func TestSettleMalformed(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		ctx := context.Background()
		r := sw("r", 5, time.Minute)
		out := make([]limits.Decision, 1)
		hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "a"), Cost: 3}
		if ok, err := s.Decide(ctx, []limits.Hit{hit}, at(0), out); !ok || err != nil {
			t.Fatal(ok, err)
		}
		good := limits.Settlement{Hit: hit, Ticket: out[0].Ticket, Actual: 0}
		for _, bad := range []limits.Settlement{
			{Hit: limits.Hit{Key: hit.Key, Cost: 1}, Ticket: out[0].Ticket},
			{Hit: hit, Ticket: out[0].Ticket, Actual: -1},
			{Hit: limits.Hit{Rule: r, Key: hit.Key, Cost: -1}, Ticket: out[0].Ticket},
		} {
			if err := s.Settle(ctx, []limits.Settlement{good, bad}, at(1)); err != limits.ErrBatch {
				t.Fatalf("settling %+v: %v, want ErrBatch", bad, err)
			}
		}
		if err := s.Settle(ctx, nil, at(1)); err != nil {
			t.Fatal(err)
		}
		if rem := read(t, s, []limits.Hit{hit}, at(1)); rem[0] != 2 {
			t.Fatalf("a batch with a malformed settlement settled something: %d remaining, want 2", rem[0])
		}
	})
}

// An extra charge after a Reset: Memory knows the counter was reset and
// skips it; Redis cannot tell a reset counter from one that expired while
// the response ran, and charges it (it can only refuse more, by what the
// reservation did not cover). A refund after a Reset is skipped by both
// (the table above).
func TestSettleChargeAfterReset(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		_, shared := newStore().(*limits.Redis)
		for _, r := range []*limits.Rule{sw("w", 10, time.Minute), tb("b", 10, time.Minute, 10)} {
			s := newStore()
			ctx := context.Background()
			hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "a"), Cost: 4}
			out := make([]limits.Decision, 1)
			if ok, err := s.Decide(ctx, []limits.Hit{hit}, at(0), out); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if err := s.Reset(ctx, r, hit.Key); err != nil {
				t.Fatal(err)
			}
			if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: 7}}, at(1)); err != nil {
				t.Fatal(err)
			}
			want := int64(10)
			if shared {
				want = 7
			}
			if rem := read(t, s, []limits.Hit{hit}, at(1)); rem[0] != want {
				t.Fatalf("%s: %d remaining after an extra charge of 3 following a Reset, want %d", r.Name, rem[0], want)
			}
		}
	})
}

// An extra charge owed by a hit whose counter was dropped while its
// response ran (idle, swept) is still counted.
func TestSettleChargeAfterSweep(t *testing.T) {
	for _, r := range []*limits.Rule{sw("w", 10, time.Minute), tb("b", 10, time.Minute, 10)} {
		s := limits.NewMemory(limits.MemoryOptions{})
		ctx := context.Background()
		hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "a"), Cost: 4}
		out := make([]limits.Decision, 1)
		if ok, err := s.Decide(ctx, []limits.Hit{hit}, at(0), out); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if n := s.Sweep(at(90)); n != 1 {
			t.Fatalf("%s: swept %d", r.Name, n)
		}
		allow(t, s, r, "a", 1, at(91)) // the key is back: a new counter
		if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: 10}}, at(92)); err != nil {
			t.Fatal(err)
		}
		if rem := read(t, s, []limits.Hit{hit}, at(92)); rem[0] != 3 {
			t.Fatalf("%s: %d remaining, want 10-1-6 = 3", r.Name, rem[0])
		}
	}
}
