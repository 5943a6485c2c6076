package proxy_test

import (
	"testing"
)

// TestRefusalAllocatesNothing: a refused caller asking again, the
// attacker's hot path, costs the proxy no allocation (the server's own
// are not counted: the writer here keeps nothing).
func TestRefusalAllocatesNothing(t *testing.T) {
	if raceOn {
		t.Skip("the race detector empties sync.Pool at random")
	}
	ask := rememberedRefusals(t)
	for i := range 512 { // every caller's answer prepared once
		ask(i)
	}
	i := 0
	if n := testing.AllocsPerRun(2048, func() { ask(i); i++ }); n != 0 {
		t.Errorf("%v allocations per remembered 429, want 0", n)
	}
}
