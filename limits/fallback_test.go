package limits_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// While the shared store fails, each hit's effective limit and burst are
// divided by the instance count, for Decide and Peek alike; Reset resets
// both stores.
func TestFallbackScalesEffectiveLimits(t *testing.T) {
	ctx := context.Background()
	primary := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
	primary.down.Store(true)
	local := 0
	f := limits.NewFallback(primary, limits.NewMemory(limits.MemoryOptions{}), 4)
	f.OnFallback = func() { local++ }
	r := tb("r", 10, time.Minute, 10)
	tier := []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 1, Own: true, Limit: 20, Burst: 8}}
	out := make([]limits.Decision, 1)
	if ok, err := f.Peek(ctx, tier, at(0), out); !ok || err != nil || out[0].Limit != 5 || out[0].Remaining != 1 {
		t.Fatalf("local peek: %v %v %+v, want the limit 20/4 and burst 8/4", ok, err, out[0])
	}
	admitted := 0
	for range 5 {
		if ok, err := f.Decide(ctx, tier, at(0), out); err != nil {
			t.Fatal(err)
		} else if ok {
			admitted++
		}
	}
	if admitted != 2 || out[0].Limit != 5 || out[0].RetryAfter != 12*time.Second {
		t.Fatalf("%d admitted locally (want 2: burst 8/4), last %+v", admitted, out[0])
	}
	if local != 6 {
		t.Fatalf("%d local decisions reported, want 6", local)
	}
	if err := f.Reset(ctx, r, limits.KeyOf("caller", "k")); !errors.Is(err, limits.ErrUnavailable) {
		t.Fatalf("Reset with the shared store down: %v", err)
	}
	if ok, _ := f.Decide(ctx, tier, at(0), out); !ok {
		t.Fatalf("the local counters survived Reset: %+v", out[0])
	}
	primary.down.Store(false)
	if ok, err := f.Decide(ctx, tier, at(0), out); !ok || err != nil || out[0].Limit != 20 || out[0].Remaining != 7 {
		t.Fatalf("shared again: %v %v %+v", ok, err, out[0])
	}
}
