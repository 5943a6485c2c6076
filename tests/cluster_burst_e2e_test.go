package tests

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// burstRules: a shared window, a caller's token bucket of 4 and a
// caller's window of 5 per minute, whose counters live in different slots
// of a Cluster. X-Round keeps each round's shared window apart.
const burstRules = `
[[rule]]
name   = "global"
paths  = ["/api/chat"]
key    = ["header:X-Round"]
limit  = 10
window = "1m"

[[rule]]
name      = "bucket"
paths     = ["/api/chat"]
key       = ["header:X-Round", "header:X-Caller"]
algorithm = "token_bucket"
limit     = 1
window    = "1h"
burst     = 4

[[rule]]
name   = "window"
paths  = ["/api/chat"]
key    = ["header:X-Round", "header:X-Caller"]
limit  = 5
window = "1m"
`

// Two instances on a Cluster after a burst of simultaneous requests: a
// caller with room in every rule is admitted at once by either instance,
// and the shared window has exactly the places the admissions left —
// refused requests left nothing counted, and no instance remembers a
// refusal that a rollback undid.
func TestClusterBurstLeavesNothingBehind(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	rec := newRecorder(t)
	env := map[string]string{"REDIS_URL": c.URL(), "REDIS_TIMEOUT": "1s"}
	cfg := writeRules(t, burstRules)
	ps := []*proc{startProxy(t, rec.URL(), env, "-config", cfg), startProxy(t, rec.URL(), env, "-config", cfg)}
	send := func(p *proc, round, caller int) int {
		return p.do(t, http.MethodPost, p.url("/api/chat"), []byte(`{"message":"hi"}`),
			"X-Round", fmt.Sprint(round), "X-Caller", fmt.Sprint("c", caller)).StatusCode
	}
	for round := range 8 {
		callers := 3 + round%4
		admitted := make([]int, callers)
		total := 0
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch code := send(ps[i%2], round, i%callers); code {
				case 200:
					mu.Lock()
					admitted[i%callers]++
					total++
					mu.Unlock()
				case 429:
				default:
					t.Errorf("round %d: status %d", round, code)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		left := 10 - total
		for ci := range callers {
			for _, p := range ps {
				room := admitted[ci] < 4 && left > 0
				code := send(p, round, ci)
				if (code == 200) != room {
					t.Fatalf("round %d: caller %d (admitted %d, %d left in the shared window) got %d (room: %v)",
						round, ci, admitted[ci], left, code, room)
				}
				if code == 200 {
					admitted[ci]++
					left--
				}
			}
		}
		// The shared window is spent exactly by what was admitted.
		for left > 0 {
			if code := send(ps[left%2], round, 100+left); code != 200 {
				t.Fatalf("round %d: a fresh caller refused (%d) with %d places left in the shared window", round, code, left)
			}
			left--
		}
		if code := send(ps[0], round, 99); code != 429 {
			t.Fatalf("round %d: a fresh caller admitted (%d) past the shared window", round, code)
		}
	}
}
