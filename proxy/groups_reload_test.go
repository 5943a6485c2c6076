package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// holding is an upstream that keeps every request until release, and
// counts those it received.
type holding struct {
	srv  *httptest.Server
	seen atomic.Int64
	quit chan struct{}
	once sync.Once
}

func newHolding(t *testing.T) *holding {
	h := &holding{quit: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h.seen.Add(1)
		select {
		case <-h.quit:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(h.srv.Close)
	t.Cleanup(h.release) // before the server closes
	return h
}

func (h *holding) release() { h.once.Do(func() { close(h.quit) }) }

const capGroup = `
[[upstream_group]]
name          = "chat"
max_in_flight = %d
max_wait      = "20s"
`

// A reload that raises a group's max_in_flight frees slots at once: the
// requests already waiting get them (within 1 s), on this instance and,
// with Redis, on an instance that did not reload.
func TestGroupReloadRaisesCap(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		h := newHolding(t)
		opt, write := configFile(t, fmt.Sprintf(capGroup, 2), "CHAT_RPM", "1000000000")
		f := newFixture(t, upstreamAt(h.srv.URL), opt, realClock)
		testReloadRaisesCap(t, h, []*fixture{f}, []int{2, 3}, write)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		h := newHolding(t)
		var fs []*fixture
		var writes []func(string)
		for range 2 {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { client.Close() })
			opt, write := configFile(t, fmt.Sprintf(capGroup, 2), "CHAT_RPM", "1000000000")
			fs = append(fs, newFixture(t, upstreamAt(h.srv.URL), opt, realClock, func(_ *config.Config, o *proxy.Options) {
				o.GateRedis = &gate.RedisOptions{Client: client, Prefix: "raise:", Timeout: 5 * time.Second, Instances: 2} // generous: a loaded CI machine
			}))
			writes = append(writes, write)
		}
		// Two in flight from A, then waiters on both; only A reloads.
		testReloadRaisesCap(t, h, fs, []int{2, 1, 2}, writes[0])
	})
}

// testReloadRaisesCap sends plan[0] requests through fs[0] (they take the
// cap of 2), then plan[i] more through fs[i-1] for i ≥ 1 (they wait),
// raises the cap to 5 with write and reloads fs[0], and requires every
// request at the upstream within 1 s.
func testReloadRaisesCap(t *testing.T, h *holding, fs []*fixture, plan []int, write func(string)) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvs := make([]*httptest.Server, len(fs))
	for i, f := range fs {
		srvs[i] = httptest.NewServer(f.handler)
		t.Cleanup(srvs[i].Close)
	}
	total := 0
	var wg sync.WaitGroup
	codes := make(chan int, 16)
	send := func(srv *httptest.Server) {
		total++
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := postTo(ctx, srv.URL+"/v1/chat/completions")
			if err != nil {
				codes <- 0
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			codes <- res.StatusCode
		}()
	}
	for range plan[0] {
		send(srvs[0])
	}
	if !waitUntil(func() bool { return h.seen.Load() == int64(plan[0]) }) {
		t.Fatalf("the upstream saw %d requests, want %d", h.seen.Load(), plan[0])
	}
	for i, n := range plan[1:] {
		f := fs[i%len(fs)]
		for range n {
			send(srvs[i%len(fs)])
		}
		if !waitUntil(func() bool {
			return gauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=default") == float64(n)
		}) {
			t.Fatalf("instance %d: %v waiting, want %d", i, gauge(t, f, "ratelimit_proxy_upstream_queue_depth",
				"group=chat,priority=default"), n)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := h.seen.Load(); n != int64(plan[0]) {
		t.Fatalf("the upstream saw %d requests over the cap of 2", n)
	}
	write(fmt.Sprintf(capGroup, 5) + "\n# raised\n")
	res, err := fs[0].p.Reload("test")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(res.Changed, ","), "upstream_group chat") {
		t.Fatalf("reload changed %v", res.Changed)
	}
	reloaded := time.Now()
	for h.seen.Load() < int64(total) && time.Since(reloaded) < 3*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(reloaded)
	if n := h.seen.Load(); n != int64(total) || took > time.Second {
		t.Fatalf("the upstream saw %d of %d requests %v after the reload raised the cap to 5, want all within 1 s",
			n, total, took.Round(time.Millisecond))
	}
	t.Logf("all %d at the upstream %v after the reload", total, took.Round(time.Millisecond))
	h.release()
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a request ended with %d, want 200", c)
		}
	}
}
