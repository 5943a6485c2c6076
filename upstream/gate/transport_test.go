package gate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// Two 429s then a 200: the client gets the 200; the upstream got the same
// request three times; each wait was the pause, then the backoff; the
// retries counted in the rate.
func TestTransportRetryThenOK(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		// Queue 0: an Acquire past the rate is refused at once.
		o := gate.Options{Name: "chat", Priorities: prios, Rate: 5, Per: time.Minute, Retries: 2,
			MaxBackoff: 20 * time.Second, MaxWait: 30 * time.Second}
		r := newRig(t, mk, o, 0.5)
		up := newStub(t, script(tooMany(), tooMany("retry-after-ms", "200"), ok200))
		tk := acquire(t, r.g, 1)
		client := &http.Client{Transport: r.tr}
		req, _ := http.NewRequestWithContext(gate.WithTicket(context.Background(), tk), http.MethodPost, up.srv.URL,
			strings.NewReader(`{"model":"m","messages":[]}`))
		req.Header.Set("Authorization", "Bearer k")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || readBody(t, res) != "ok" {
			t.Fatalf("status %d", res.StatusCode)
		}
		got := up.requests()
		if len(got) != 3 {
			t.Fatalf("upstream saw %d requests, want 3", len(got))
		}
		for i, b := range got {
			if b != `{"model":"m","messages":[]}` {
				t.Fatalf("request %d body %q", i, b)
			}
			if h := up.headers[i].Get("Authorization"); h != "Bearer k" {
				t.Fatalf("request %d Authorization %q", i, h)
			}
		}
		// First: no reset header, the default pause (1s), then a backoff
		// of 0.5 × 500ms; second: the 200ms pause, then 0.5 × 1s.
		if s := r.slept(); !sameDurations(s, []time.Duration{1250 * time.Millisecond, 700 * time.Millisecond}) {
			t.Fatalf("slept %v, want [1.25s 700ms]", s)
		}
		if r.g.InFlight() != 1 {
			t.Fatalf("in flight %d during the request, want 1", r.g.InFlight())
		}
		tk.Release()
		// Three sends of 5 in the window: two more pass.
		acquire(t, r.g, 1).Release()
		acquire(t, r.g, 1).Release()
		var busy *gate.BusyError
		if _, err := r.g.Acquire(context.Background(), 1, time.Time{}); !errors.As(err, &busy) {
			t.Fatalf("sixth send in the window: %v, want refused (the retries count in the rate)", err)
		}
	})
}

// Retries exhausted: the last 429 reaches the client with a Retry-After
// (and retry-after-ms) that matches the pause.
func TestTransportRetriesExhausted(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		r := newRig(t, mk, retryOpts(gate.Options{}), 0)
		up := newStub(t, script(tooMany("retry-after-ms", "1500")))
		tk := acquire(t, r.g, 1)
		defer tk.Release()
		res, err := r.send(t, tk, up.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 429 || readBody(t, res) != "slow down" {
			t.Fatalf("status %d", res.StatusCode)
		}
		if n := len(up.requests()); n != 3 {
			t.Fatalf("upstream saw %d requests, want 3 (2 retries)", n)
		}
		if ra, ms := res.Header.Get("Retry-After"), res.Header.Get("Retry-After-Ms"); ra != "2" || ms != "1500" {
			t.Fatalf("Retry-After %q, retry-after-ms %q; want 2, 1500", ra, ms)
		}
		if s := r.slept(); !sameDurations(s, []time.Duration{1500 * time.Millisecond, 1500 * time.Millisecond}) {
			t.Fatalf("slept %v", s)
		}
		if p := r.g.Snapshot().Pause; p != 1500*time.Millisecond {
			t.Fatalf("pause %s, want 1.5s", p)
		}
	})
}

// Retries 0: the 429 passes at once, and the group is paused: a request
// that cannot wait that long is refused at once, on every instance.
func TestTransportNoRetriesPauses(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, backend string, mk maker) {
		o := opts(gate.Options{Retries: 0, MaxBackoff: 20 * time.Second, MaxWait: 5 * time.Second})
		r := newRig(t, mk, o, 0.5)
		up := newStub(t, script(tooMany("Retry-After", "30")))
		tk := acquire(t, r.g, 1)
		res, err := r.send(t, tk, up.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, res)
		tk.Release()
		if res.StatusCode != 429 || res.Header.Get("Retry-After") != "30" || len(up.requests()) != 1 || len(r.slept()) != 0 {
			t.Fatalf("status %d, Retry-After %q, %d requests, slept %v", res.StatusCode,
				res.Header.Get("Retry-After"), len(up.requests()), r.slept())
		}
		if p := r.g.Snapshot().Pause; p != 30*time.Second {
			t.Fatalf("pause %s, want 30s", p)
		}
		instances := []*gate.Group{r.g}
		if backend == "redis" {
			o.Now = r.clk.Now
			instances = append(instances, mk(t, o)) // another instance honours the pause
		}
		for i, g := range instances {
			start := time.Now()
			_, err := g.Acquire(context.Background(), 0, time.Time{})
			var busy *gate.BusyError
			if !errors.As(err, &busy) || busy.Reason != gate.ReasonPaused || busy.RetryAfter != 30*time.Second {
				t.Fatalf("instance %d while paused: %v, want paused, retry after 30s", i, err)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("refused after %s, want at once", el)
			}
		}
		// A pause within max_wait is waited out in the queue.
		r.clk.Advance(29 * time.Second)
		var waiters []chan result
		for _, g := range instances {
			waiters = append(waiters, pending(context.Background(), g, 1))
			waitQueued(t, g, 1, 1)
		}
		for _, w := range waiters {
			quiet(t, w, 50*time.Millisecond)
		}
		r.clk.Advance(time.Second)
		for _, w := range waiters {
			res := get(t, w, 5*time.Second)
			if res.err != nil {
				t.Fatal(res.err)
			}
			res.tk.Release()
		}
	})
}

// No retry when the wait passes max_wait or the caller's deadline, or
// when the body cannot be sent again; the answer then carries the pause.
func TestTransportNoRetry(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		for _, tc := range []struct {
			name     string
			reply    reply
			deadline time.Duration // from now; 0 none
			noGet    bool          // a body without GetBody
			method   string
			retried  bool
			after    string
		}{
			{name: "pause past max_wait", reply: tooMany("Retry-After", "30"), after: "30"},
			{name: "pause within max_wait", reply: tooMany("Retry-After", "3"), retried: true},
			{name: "deadline too near", reply: tooMany("retry-after-ms", "2000"), deadline: time.Second, after: "2"},
			{name: "deadline far enough", reply: tooMany("retry-after-ms", "2000"), deadline: 10 * time.Second, retried: true},
			{name: "body without GetBody", reply: tooMany(), noGet: true, after: "1"},
			{name: "no body", reply: tooMany(), method: http.MethodGet, retried: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := newRig(t, mk, retryOpts(gate.Options{Name: strings.ReplaceAll(tc.name, " ", "_")}), 0.5)
				up := newStub(t, script(tc.reply, ok200))
				tk := acquire(t, r.g, 1)
				defer tk.Release()
				if tc.deadline > 0 {
					tk.Deadline = r.clk.Now().Add(tc.deadline)
				}
				method := tc.method
				if method == "" {
					method = http.MethodPost
				}
				var body io.Reader
				if method == http.MethodPost {
					body = strings.NewReader("payload")
					if tc.noGet {
						body = io.NopCloser(body) // unknown to http.NewRequest: no GetBody
					}
				}
				req, err := http.NewRequestWithContext(gate.WithTicket(context.Background(), tk), method, up.srv.URL, body)
				if err != nil {
					t.Fatal(err)
				}
				if body != nil && tc.noGet != (req.GetBody == nil) {
					t.Fatalf("GetBody set: %v", req.GetBody != nil)
				}
				res, err := r.tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				readBody(t, res)
				n := len(up.requests())
				if tc.retried {
					if res.StatusCode != 200 || n != 2 {
						t.Fatalf("status %d after %d requests, want 200 after a retry", res.StatusCode, n)
					}
					return
				}
				if res.StatusCode != 429 || n != 1 || len(r.slept()) != 0 {
					t.Fatalf("status %d after %d requests, slept %v; want the 429 at once", res.StatusCode, n, r.slept())
				}
				if ra := res.Header.Get("Retry-After"); ra != tc.after {
					t.Fatalf("Retry-After %q, want %q", ra, tc.after)
				}
			})
		}
	})
}

// A client that leaves during the backoff ends the request with its
// context's error.
func TestTransportCancelDuringBackoff(t *testing.T) {
	t.Run("injected sleep", func(t *testing.T) {
		up := newStub(t, script(tooMany("Retry-After", "5"), ok200))
		g, err := gate.New(retryOpts(gate.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		tk := acquire(t, g, 1)
		defer tk.Release()
		ctx, cancel := context.WithCancel(gate.WithTicket(context.Background(), tk))
		defer cancel()
		var asked time.Duration
		tr := &gate.Transport{Base: &http.Transport{}, Sleep: func(sctx context.Context, d time.Duration) error {
			asked = d
			cancel() // the client leaves while we wait
			<-sctx.Done()
			return sctx.Err()
		}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.srv.URL, strings.NewReader("x"))
		res, err := tr.RoundTrip(req)
		if !errors.Is(err, context.Canceled) || res != nil {
			t.Fatalf("RoundTrip: %v, %v; want context.Canceled", res, err)
		}
		if asked < 5*time.Second || len(up.requests()) != 1 {
			t.Fatalf("asked to sleep %s, %d requests", asked, len(up.requests()))
		}
	})
	t.Run("timer", func(t *testing.T) {
		up := newStub(t, script(tooMany("Retry-After", "8"), ok200))
		g, err := gate.New(retryOpts(gate.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		tk := acquire(t, g, 1)
		defer tk.Release()
		ctx, cancel := context.WithCancel(gate.WithTicket(context.Background(), tk))
		defer cancel()
		go func() {
			<-up.hit
			time.Sleep(100 * time.Millisecond)
			cancel()
		}()
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		tr := &gate.Transport{Base: base}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.srv.URL, strings.NewReader("x"))
		start := time.Now()
		res, err := tr.RoundTrip(req)
		if !errors.Is(err, context.Canceled) || res != nil {
			t.Fatalf("RoundTrip: %v, %v; want context.Canceled", res, err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("returned after %s of an 8s wait", el)
		}
		if n := len(up.requests()); n != 1 {
			t.Fatalf("%d requests", n)
		}
	})
}

// A 503 is retried like a 429 and pauses the group, but only a 429
// lowers the adaptive rate.
func TestTransport503(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		o := retryOpts(gate.Options{Rate: 600, Per: time.Minute, Adaptive: &gate.Adaptive{Start: 500_000,
			Increase: 100_000, Every: 5 * time.Minute, Decrease: 500_000, Hold: 10 * time.Minute, Ceiling: 800_000}})
		r := newRig(t, mk, o, 0)
		up := newStub(t, script(reply{status: 503, header: map[string]string{"Retry-After": "1"}, body: "busy"}, ok200,
			tooMany("retry-after-ms", "100"), ok200))
		tk := acquire(t, r.g, 1)
		res, err := r.send(t, tk, up.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || readBody(t, res) != "ok" || len(up.requests()) != 2 {
			t.Fatalf("status %d after %d requests", res.StatusCode, len(up.requests()))
		}
		if s := r.slept(); !sameDurations(s, []time.Duration{time.Second}) {
			t.Fatalf("slept %v, want [1s]", s)
		}
		if f := r.g.Snapshot().Factor; f != 0.5 {
			t.Fatalf("factor %v after a 503, want 0.5", f)
		}
		res, err = r.send(t, tk, up.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, res)
		if res.StatusCode != 200 || len(up.requests()) != 4 {
			t.Fatalf("status %d after %d requests", res.StatusCode, len(up.requests()))
		}
		if f := r.g.Snapshot().Factor; f != 0.25 {
			t.Fatalf("factor %v after a 429, want 0.25", f)
		}
		tk.Release()
	})
}

// retriesOf is ratelimit_proxy_upstream_retries_total of group on reg.
func retriesOf(t *testing.T, reg *prometheus.Registry, group string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_proxy_upstream_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "group" && l.GetValue() == group {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
