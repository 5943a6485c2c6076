package gate

import "testing"

// The queue's turns, step by step: weights, a newcomer joining at the end
// of the round, a waiter leaving the lane whose turn it is, a lane
// emptied while it has the turn, and the empty key keeping arrival order.
func TestFairQueueTurns(t *testing.T) {
	var q fairQueue
	add := func(key string, weight int) *waiter {
		w := &waiter{fair: key, weight: weight}
		q.push(w)
		return w
	}
	order := func(n int) string {
		var s []byte
		for range n {
			w := q.pop()
			if w == nil {
				break
			}
			s = append(s, w.fair[0])
		}
		return string(s)
	}
	for range 5 {
		add("a", 2)
	}
	add("b", 1)
	add("b", 1)
	if got := order(3); got != "aab" {
		t.Fatalf("got %q, want aab", got)
	}
	add("c", 1) // joins at the end of the round: after a's and b's turns
	if got := order(5); got != "aabca" {
		t.Fatalf("got %q, want aabca", got)
	}
	if q.count != 0 || q.cur != nil || len(q.byKey) != 0 {
		t.Fatalf("drained queue: count %d, cur %v, lanes %d", q.count, q.cur, len(q.byKey))
	}
	x := add("x", 1)
	add("y", 1)
	add("x", 1)
	q.unlink(x) // x has the turn and keeps one waiter: still its turn
	if got := order(3); got != "xy" {
		t.Fatalf("got %q, want yx", got)
	}
	p := add("p", 1)
	add("q", 1)
	q.unlink(p) // p had the turn and is gone: q's turn
	if got := order(2); got != "q" {
		t.Fatalf("got %q, want q", got)
	}
	var ws []*waiter
	for range 4 {
		ws = append(ws, add("", 1))
	}
	q.unlink(ws[1])
	for _, want := range []*waiter{ws[0], ws[2], ws[3]} {
		if w := q.pop(); w != want {
			t.Fatal("the empty key is not served in arrival order")
		}
	}
	if q.pop() != nil || q.count != 0 {
		t.Fatal("queue not empty")
	}
}
