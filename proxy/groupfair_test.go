package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// gatekeeper is an upstream that holds every request until told to
// answer it, and records the X-Team of each in the order they arrived.
type gatekeeper struct {
	mu    sync.Mutex
	teams []string
	go1   chan struct{}
	in    chan struct{}
}

func (k *gatekeeper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	k.mu.Lock()
	k.teams = append(k.teams, r.Header.Get("X-Team"))
	k.mu.Unlock()
	k.in <- struct{}{}
	<-k.go1
	io.WriteString(w, `{"ok":true}`)
}

// sender returns a function that posts a chat request of a team and plan
// to the proxy at url in the background, expecting 200; the test's
// cleanup answers whatever still waits at k, then waits for every request.
func (k *gatekeeper) sender(t *testing.T, url string) func(team, plan string) {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(k.go1) }) // first: whatever still waits at the upstream answers
	return func(team, plan string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := postTo(context.Background(), url+"/v1/chat/completions", "X-Team", team, "X-Plan", plan)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Errorf("%s: %d", team, res.StatusCode)
			}
		}()
	}
}

// The proxy wires fair_by and fair_weights: one team's backlog does not
// hold back another team's single request by more than one turn, and a
// pro plan (weight 3) takes three turns for the free plan's one.
func TestGroupFairShare(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testGroupFairShare(t, func(*config.Config, *proxy.Options) {}) })
	t.Run("redis", func(t *testing.T) {
		opt, _ := gateOnRedis(t, "fair:")
		testGroupFairShare(t, opt)
	})
}

func testGroupFairShare(t *testing.T, shared option) {
	k := &gatekeeper{go1: make(chan struct{}), in: make(chan struct{}, 100)}
	up := httptest.NewServer(k)
	t.Cleanup(up.Close)
	f, srv := groupProxy(t, up.URL, `
tier_from = "header:X-Plan"

[[upstream_group]]
name = "chat"
max_in_flight = 1
fair_by = "header:X-Team"
fair_weights = { pro = 3 }
`, shared)
	send := k.sender(t, srv.URL)
	queued := func(n float64) {
		t.Helper()
		waitGauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=default", n)
	}
	step := func() { // the upstream answers one; the next comes in
		k.go1 <- struct{}{}
		select {
		case <-k.in:
		case <-time.After(5 * time.Second):
			t.Fatal("no request reached the upstream")
		}
	}
	_, rules := f.adminDo(t, "GET", "/admin/rules", "", "")
	if gs, _ := rules["upstream_groups"].([]any); len(gs) != 1 ||
		gs[0].(map[string]any)["fair_by"] != "header:X-Team" || gs[0].(map[string]any)["fair_weights"].(map[string]any)["pro"] != 3.0 {
		t.Fatalf("GET /admin/rules: upstream_groups %v", rules["upstream_groups"])
	}
	send("holder", "free")
	<-k.in
	for range 20 {
		send("batch", "free")
	}
	queued(20)
	send("alice", "free")
	queued(21)
	if n := gauge(t, f, "ratelimit_proxy_upstream_queue_fair_keys", "group=chat,priority=default"); n != 2 {
		t.Fatalf("fair keys waiting %v, want 2 (batch and alice)", n)
	}
	step()
	step()
	k.mu.Lock()
	got := strings.Join(k.teams, ",")
	k.mu.Unlock()
	if !strings.Contains(got, "alice") {
		t.Fatalf("upstream saw %s: alice not within two grants of arriving", got)
	}
	// Weights: pro (3) against free (1), both backlogged.
	for range 19 { // the rest of the batch
		step()
	}
	queued(0)
	for range 16 {
		send("big", "pro")
		send("small", "free")
	}
	queued(32)
	k.mu.Lock()
	start := len(k.teams)
	k.mu.Unlock()
	for range 16 {
		step()
	}
	k.mu.Lock()
	counts := map[string]int{}
	for _, team := range k.teams[start:] {
		counts[team]++
	}
	k.mu.Unlock()
	if counts["big"] < 11 || counts["big"] > 13 || counts["small"] < 3 || counts["small"] > 5 {
		t.Fatalf("16 grants: pro %d, free %d, want 12 and 4 (±1 turn)", counts["big"], counts["small"])
	}
	for range 16 {
		step()
	}
}

// The cookbook's fair-share.toml: with its 8 slots taken by one team and
// 30 more of that team's requests waiting, another team's single request
// is among the next two to reach the upstream.
func TestCookbookFairShare(t *testing.T) {
	k := &gatekeeper{go1: make(chan struct{}), in: make(chan struct{}, 100)}
	up := httptest.NewServer(k)
	t.Cleanup(up.Close)
	f := newFixture(t, upstreamAt(up.URL), cookbook(t, "fair-share.toml", "UPSTREAM_URL", up.URL), realClock)
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)
	post := k.sender(t, srv.URL)
	send := func(team string) { post(team, "free") }
	for range 8 {
		send("batch")
		<-k.in
	}
	for range 30 {
		send("batch")
	}
	waitGauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=default", 30)
	send("alice")
	waitGauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=default", 31)
	for range 2 {
		k.go1 <- struct{}{}
		<-k.in
	}
	k.mu.Lock()
	got := k.teams[8:]
	k.mu.Unlock()
	if !slices.Contains(got, "alice") {
		t.Fatalf("after 2 grants the upstream saw %v: alice not among them", got)
	}
}

// waitGauge waits until the gauge reads want (5 s at most).
func waitGauge(t *testing.T, f *fixture, name, labels string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for gauge(t, f, name, labels) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s{%s} = %v, want %v", name, labels, gauge(t, f, name, labels), want)
		}
		time.Sleep(time.Millisecond)
	}
}
