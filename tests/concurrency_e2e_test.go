package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

const concurrencyConfig = `
[[rule]]
name      = "in-flight"
key       = ["caller"]
algorithm = "concurrency"
limit     = 2
`

// A concurrency rule on the real binary, alone and on two instances that
// share Redis: with two requests of a caller held at the upstream, a third
// is refused (429, Retry-After: 1, the free places in the headers); once
// they have ended, the caller's requests pass again.
func TestConcurrencyRuleE2E(t *testing.T) {
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "one instance", true: "two instances on redis"}[shared]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			arrived := make(chan struct{}, 10)
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Hold") != "" {
					arrived <- struct{}{}
					<-release
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"ok":true}`))
			})
			cfg := filepath.Join(t.TempDir(), "c.toml")
			if err := os.WriteFile(cfg, []byte(concurrencyConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			if shared {
				srv := redistest.Start(t)
				env["REDIS_URL"] = srv.URL()
			}
			a := startProxy(t, up.URL, env, "-config", cfg)
			b := a
			if shared {
				b = startProxy(t, up.URL, env, "-config", cfg)
			}
			key := "Bearer sk-concurrency-e2e"
			var wg sync.WaitGroup
			held := make([]*response, 2)
			for i, p := range []*proc{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					held[i] = p.post(t, "/v1/chat/completions", "Authorization", key, "X-Hold", "1")
				}()
			}
			for range 2 {
				select {
				case <-arrived:
				case <-time.After(10 * time.Second):
					t.Fatal("the held requests did not reach the upstream")
				}
			}
			r := a.post(t, "/v1/chat/completions", "Authorization", key)
			wantStatus(t, r, http.StatusTooManyRequests)
			if r.Header.Get("Retry-After") != "1" || r.Header.Get("X-RateLimit-Remaining") != "0" ||
				r.Header.Get("X-RateLimit-Limit") != "2" || r.Header.Get("X-RateLimit-Reset") != "1" {
				t.Fatalf("the third in flight: %v", r.Header)
			}
			if m := r.json(t); m["denied_by"] != "in-flight" || m["retry_after_seconds"] != 1.0 {
				t.Fatalf("body %v", m)
			}
			// Another caller has places of its own.
			wantStatus(t, b.post(t, "/v1/chat/completions", "Authorization", "Bearer sk-other"), http.StatusOK)
			free()
			wg.Wait()
			for _, h := range held {
				wantStatus(t, h, http.StatusOK)
			}
			r = b.post(t, "/v1/chat/completions", "Authorization", key)
			wantStatus(t, r, http.StatusOK)
			if r.Header.Get("X-RateLimit-Remaining") != "1" {
				t.Fatalf("after the held requests ended: remaining %q", r.Header.Get("X-RateLimit-Remaining"))
			}
		})
	}
}
