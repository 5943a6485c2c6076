package main

import "testing"

// GOGC stays at 400 while the live heap is the tokenizer's tables, then
// keeps the room between collections at 64 MiB, never below Go's default.
func TestGCPercentFor(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{{0, 400}, {10 << 20, 400}, {16 << 20, 400}, {32 << 20, 200}, {64 << 20, 100}, {100 << 20, 100}, {1 << 30, 100}} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("live %d MiB: GOGC %d, want %d", c.live>>20, got, c.want)
		}
	}
}
