package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// SPEC §9: upstream groups, black-box against the real binary. Every case
// has a group (and paths) of its own, so that the cases share the
// instances (and, with Redis, the store) without sharing any state.
const (
	gpCap        = "/v1/chat/completions" // group "cap": max_in_flight 2
	gpOrder      = "/v1/order/chat/completions"
	gpBound      = "/v1/bound/chat/completions" // group "bound", with /api/chat
	gpSeed       = "/api/chat"
	gpGone       = "/v1/gone/chat/completions"
	gpRetry      = "/v1/retry/chat/completions"
	gpNoRetry    = "/v1/noretry/chat/completions"
	gpPause      = "/v1/pause/chat/completions"
	gpPauseShort = "/v1/pauseshort/chat/completions"
	gpRate       = "/v1/rate/chat/completions"
)

// gatePaths are the protected paths of the suite: every group's.
var gatePaths = []string{gpCap, gpOrder, gpBound, gpSeed, gpGone, gpRetry, gpNoRetry, gpPause, gpPauseShort, gpRate}

// gateGroups are the suite's groups, each with the priorities it reports.
var gateGroups = []string{"cap", "order", "bound", "gone", "retry", "noretry", "pause", "pauseshort", "rate"}

const gateFile = `
[[upstream_group]]
name          = "cap"
paths         = ["/v1/chat/completions"]
max_in_flight = 2

[[upstream_group]]
name          = "order"
paths         = ["/v1/order/chat/completions"]
max_in_flight = 1
priority_from = "header:X-Priority"
priorities    = ["interactive", "default", "batch"]

[[upstream_group]]
name          = "bound"
paths         = ["/v1/bound/chat/completions", "/api/chat"]
max_in_flight = 1
queue         = 1
max_wait      = "500ms"

[[upstream_group]]
name          = "gone"
paths         = ["/v1/gone/chat/completions"]
max_in_flight = 1
max_wait      = "20s"

[[upstream_group]]
name        = "retry"
paths       = ["/v1/retry/chat/completions"]
retries     = 2
max_backoff = "2s"

[[upstream_group]]
name     = "noretry"
paths    = ["/v1/noretry/chat/completions"]
retries  = 0
max_wait = "10s"

[[upstream_group]]
name     = "pause"
paths    = ["/v1/pause/chat/completions"]
retries  = 0
max_wait = "10s"

[[upstream_group]]
name     = "pauseshort"
paths    = ["/v1/pauseshort/chat/completions"]
retries  = 0
max_wait = "500ms"

[[upstream_group]]
name  = "rate"
paths = ["/v1/rate/chat/completions"]
rate  = 3
per   = "1s"
`

// gateEnv is what every instance of the suite runs with: a rate limit
// that never refuses, so that only the groups decide.
func gateEnv() map[string]string {
	return map[string]string{
		"CHAT_RPM":         "100000",
		"PROTECTED_PATHS":  strings.Join(gatePaths, ","),
		"SHUTDOWN_TIMEOUT": "2s",
	}
}

// reply is one scripted upstream answer.
type reply struct {
	status int
	hdr    map[string]string
}

// hit is one request the upstream received.
type hit struct {
	method, tag, prio string
	body              []byte
	contentLength     int64
	at                time.Time
}

// gateUpstream is an upstream the tests steer per path: it records every
// request with its arrival time, tracks concurrency, can hold requests
// until released, delay them, or answer from a script.
type gateUpstream struct {
	srv   *httptest.Server
	quit  chan struct{} // closed at cleanup: every held request returns
	holds map[string]chan struct{}
	delay map[string]time.Duration

	mu        sync.Mutex
	hits      map[string][]hit
	cur, peak map[string]int
	script    map[string][]reply
	quitOnce  sync.Once
}

func newGateUpstream(t *testing.T, hold []string, delay map[string]time.Duration) *gateUpstream {
	t.Helper()
	u := &gateUpstream{quit: make(chan struct{}), holds: map[string]chan struct{}{}, delay: delay,
		hits: map[string][]hit{}, cur: map[string]int{}, peak: map[string]int{}, script: map[string][]reply{}}
	for _, p := range hold {
		u.holds[p] = make(chan struct{})
	}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	t.Cleanup(u.unblock) // runs before srv.Close
	return u
}

// unblock lets every held request go; registered again after the proxies
// start, so that it runs before they are stopped.
func (u *gateUpstream) unblock() { u.quitOnce.Do(func() { close(u.quit) }) }

func (u *gateUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	path := r.URL.Path
	u.mu.Lock()
	u.hits[path] = append(u.hits[path], hit{method: r.Method, tag: r.Header.Get("X-Tag"), prio: r.Header.Get("X-Priority"),
		body: body, contentLength: r.ContentLength, at: time.Now()})
	u.cur[path]++
	u.peak[path] = max(u.peak[path], u.cur[path])
	var rep reply
	if s := u.script[path]; len(s) > 0 {
		rep, u.script[path] = s[0], s[1:]
	}
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.cur[path]--
		u.mu.Unlock()
	}()
	if ch := u.holds[path]; ch != nil {
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		case <-u.quit:
		}
	}
	if d := u.delay[path]; d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	for k, v := range rep.hdr {
		w.Header().Set(k, v)
	}
	if rep.status != 0 && rep.status != http.StatusOK {
		w.WriteHeader(rep.status)
		fmt.Fprintf(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":%d}}`+"\n", rep.status)
		return
	}
	fmt.Fprintf(w, `{"upstream":"ok","path":%q}`+"\n", path)
}

// setScript replaces path's scripted answers (afterwards: 200).
func (u *gateUpstream) setScript(path string, rs ...reply) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.script[path] = rs
}

func (u *gateUpstream) hitsOf(path string) []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]hit(nil), u.hits[path]...)
}

func (u *gateUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.hits[path])
}

func (u *gateUpstream) peakOf(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.peak[path]
}

// waitHits waits until path has had n requests.
func (u *gateUpstream) waitHits(t *testing.T, path string, n int, d time.Duration) {
	t.Helper()
	if !waitFor(d, func() bool { return u.count(path) >= n }) {
		t.Fatalf("the upstream saw %d requests on %s within %v, want %d", u.count(path), path, d, n)
	}
}

// release lets one held request on path answer; the time it went.
func (u *gateUpstream) release(t *testing.T, path string) time.Time {
	t.Helper()
	select {
	case u.holds[path] <- struct{}{}:
		return time.Now()
	case <-time.After(10 * time.Second):
		t.Fatalf("no request held on %s to release", path)
		return time.Time{}
	}
}

// result is one request's outcome, for requests sent from goroutines
// (which must not call t.Fatal).
type result struct {
	r       *response
	err     error
	elapsed time.Duration
}

// send sends one request to p and reads the whole answer; body nil is a
// POST with bodyFor(path), a GET has none.
func send(ctx context.Context, p *proc, method, path string, body []byte, hdr ...string) result {
	if body == nil && method == http.MethodPost {
		body = bodyFor(path)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.url(path), rd)
	if err != nil {
		return result{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	start := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		return result{err: err, elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{r: &response{Response: resp, body: b}, err: err, elapsed: time.Since(start)}
}

// goSend sends in the background; the channel gets the one result.
func goSend(ctx context.Context, p *proc, method, path string, body []byte, hdr ...string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- send(ctx, p, method, path, body, hdr...) }()
	return ch
}

// await waits for a background request's result.
func await(t *testing.T, ch <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case res := <-ch:
		if res.err != nil {
			t.Fatalf("%s: %v", what, res.err)
		}
		return res
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return result{}
	}
}

// wantOK fails unless res is a 200 (the body is shown otherwise).
func wantOK(t *testing.T, res result, what string) {
	t.Helper()
	if res.err != nil {
		t.Fatalf("%s: %v", what, res.err)
	}
	if res.r.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d, want 200\nheaders: %v\nbody: %s", what, res.r.StatusCode, res.r.Header, res.r.body)
	}
}

// total sums one series over the instances (absent counts 0).
func total(t *testing.T, ps []*proc, series string) float64 {
	t.Helper()
	var sum float64
	for _, p := range ps {
		sum += sample(t, p, series)
	}
	return sum
}

func depthSeries(group, prio string) string {
	return fmt.Sprintf(`ratelimit_proxy_upstream_queue_depth{group=%q,priority=%q}`, group, prio)
}

// waitDepth waits until group's queue holds n requests of prio on the
// instances together.
func waitDepth(t *testing.T, ps []*proc, group, prio string, n float64, d time.Duration) {
	t.Helper()
	var got float64
	if !waitFor(d, func() bool { got = total(t, ps, depthSeries(group, prio)); return got == n }) {
		t.Fatalf("queue depth of %s/%s is %v after %v, want %v", group, prio, got, d, n)
	}
}

// wantCounter waits (briefly: counters move after the answer) for a
// series' sum over the instances to be want.
func wantCounter(t *testing.T, ps []*proc, series string, want float64) {
	t.Helper()
	var got float64
	if !waitFor(3*time.Second, func() bool { got = total(t, ps, series); return got == want }) {
		t.Errorf("%s = %v, want %v", series, got, want)
	}
}

// wantBusy checks a 503 upstream_busy (SPEC §9, §5): the envelope of the
// path, the top-level fields, Retry-After and retry-after-ms.
func wantBusy(t *testing.T, r *response, path, group, reason string) {
	t.Helper()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%s: status %d, want 503 upstream_busy (%s)\nheaders: %v\nbody: %s", path, r.StatusCode, reason, r.Header, r.body)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: 503 Content-Type %q, want application/json", path, ct)
	}
	ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || ra < 1 {
		t.Errorf("%s: 503 Retry-After %q, want whole seconds ≥ 1", path, r.Header.Get("Retry-After"))
	}
	if ms, err := strconv.Atoi(r.Header.Get("Retry-After-Ms")); err != nil || ms < 1 || ms > ra*1000 {
		t.Errorf("%s: 503 retry-after-ms %q, want milliseconds in [1, Retry-After×1000]", path, r.Header.Get("Retry-After-Ms"))
	}
	b := r.json(t)
	var code, msg any
	if strings.HasPrefix(path, "/v1/") {
		e, ok := b["error"].(map[string]any)
		if !ok {
			t.Fatalf("%s: not the OpenAI envelope {\"error\":{...}}: %s", path, r.body)
		}
		code, msg = e["code"], e["message"]
		if e["type"] != "api_error" {
			t.Errorf("%s: error.type %v, want api_error: %s", path, e["type"], r.body)
		}
		if p, has := e["param"]; !has || p != nil {
			t.Errorf("%s: error.param must be null: %s", path, r.body)
		}
	} else {
		code, msg = b["error"], b["message"]
	}
	if code != "upstream_busy" {
		t.Errorf("%s: code %v, want upstream_busy: %s", path, code, r.body)
	}
	if s, _ := msg.(string); s == "" {
		t.Errorf("%s: no message: %s", path, r.body)
	}
	secs, ok := b["retry_after_seconds"].(float64)
	if !ok || secs < 1 || secs != float64(int64(secs)) {
		t.Errorf("%s: retry_after_seconds %v, want an integer ≥ 1: %s", path, b["retry_after_seconds"], r.body)
	} else if err == nil && int(secs) != ra {
		t.Errorf("%s: retry_after_seconds %v but Retry-After %d", path, secs, ra)
	}
	if b["group"] != group || b["reason"] != reason {
		t.Errorf("%s: group %v reason %v, want %s %s: %s", path, b["group"], b["reason"], group, reason, r.body)
	}
	// SPEC §5: every response to a protected route that went through the
	// rate limiter carries its headers.
	wantRateLimitHeaders(t, r)
}

func retryAfter(t *testing.T, r *response) (int, int) {
	t.Helper()
	s, err1 := strconv.Atoi(r.Header.Get("Retry-After"))
	ms, err2 := strconv.Atoi(r.Header.Get("Retry-After-Ms"))
	if err1 != nil || err2 != nil {
		t.Errorf("%d: Retry-After %q retry-after-ms %q: want both, whole numbers", r.StatusCode, r.Header.Get("Retry-After"), r.Header.Get("Retry-After-Ms"))
	}
	return s, ms
}
