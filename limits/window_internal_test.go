package limits

import (
	"fmt"
	"testing"
	"time"
	"unsafe"
)

// A key's memory is bounded whatever its limit: at most maxSlots+1 slots.
func TestSlotsAreBounded(t *testing.T) {
	for _, limit := range []int64{20, 1000, 1_000_000} {
		w := newWindow(time.Minute)
		now := int64(0)
		for i := 0; i < 200_000; i++ {
			now += int64(time.Minute) / 50_000 // 50k requests a minute
			w.expire(now)
			if d := w.decide(now, 1, limit); d.Allowed {
				w.record(now, 1, limit, &d)
			}
		}
		if want := min(limit, maxSlots+1); w.capacity() > int(want) {
			t.Errorf("limit %d: ring of %d slots, want at most %d", limit, w.capacity(), want)
		}
	}
}

// A refund takes units out of its admission's slot; a slot it empties is
// dropped with the ring kept in time order, also when the ring has
// wrapped; an admission whose slot may have been dropped as expired gets
// nothing back.
func TestRefundKeepsTheRingInOrder(t *testing.T) {
	const sec = int64(time.Second)
	w := newWindow(time.Minute)
	ticket := map[int64]int64{}
	add := func(s, cost int64) {
		t.Helper()
		w.expire(s * sec)
		d := w.decide(s*sec, cost, 100)
		if !d.Allowed {
			t.Fatalf("refused at %d s", s)
		}
		w.record(s*sec, cost, 100, &d)
		ticket[s] = d.Ticket.at
	}
	slots := func() string {
		var b []string
		for i := 0; i < int(w.size); i++ {
			b = append(b, fmt.Sprintf("%d:%d", w.at(i).at/sec, w.at(i).n))
		}
		return fmt.Sprintf("%v used=%d", b, w.used)
	}
	for s := int64(1); s <= 4; s++ {
		add(s, s)
	}
	add(61, 5) // drops the slot at 1 s
	add(62, 6) // drops the slot at 2 s; the ring (4 slots) wraps
	if got := slots(); got != "[3:3 4:4 61:5 62:6] used=18" || w.head == 0 {
		t.Fatalf("before: %s (head %d)", got, w.head)
	}
	for _, c := range []struct {
		at, n int64
		want  string
	}{
		{4, 4, "[3:3 61:5 62:6] used=14"}, // emptied: dropped from the middle
		{61, 2, "[3:3 61:3 62:6] used=12"},
		{61, 9, "[3:3 62:6] used=9"}, // never more than the slot holds
		{3, 3, "[62:6] used=6"},      // the oldest
		{1, 1, "[62:6] used=6"},      // its slot was dropped as expired
		{62, 6, "[] used=0"},
	} {
		w.refund(ticket[c.at], 62*sec, c.n)
		if got := slots(); got != c.want {
			t.Fatalf("refund of %d to the admission at %d s: %s, want %s", c.n, c.at, got, c.want)
		}
	}
	add(64, 1)
	if got := slots(); got != "[64:1] used=1" {
		t.Fatalf("after: %s", got)
	}
}

// A counter is one 80-byte allocation (Go's size class above 64): a
// field more, and every tracked caller costs 16 bytes more.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 72 {
		t.Fatalf("entry is %d bytes, want at most 72", n)
	}
}
