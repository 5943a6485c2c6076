package limits

import (
	"testing"
	"time"
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
		if want := min(limit, maxSlots+1); len(w.ring) > int(want) {
			t.Errorf("limit %d: ring of %d slots, want at most %d", limit, len(w.ring), want)
		}
	}
}
