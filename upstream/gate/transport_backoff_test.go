package gate_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// The transport's waits: backoffs, pauses the upstream lengthens or that
// outlast max_backoff, retries waiting for the rate, and their bounds.

// The backoff doubles from BaseBackoff and stays under MaxBackoff (full
// jitter: uniform below the ceiling).
func TestTransportBackoff(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		o := retryOpts(gate.Options{Retries: 6, MaxBackoff: 3 * time.Second, MaxWait: time.Minute})
		r := newRig(t, mk, o, 0.999)
		up := newStub(t, script(tooMany("retry-after-ms", "0"))) // no pause: the backoff alone
		tk := acquire(t, r.g, 1)
		defer tk.Release()
		res, err := r.send(t, tk, up.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, res)
		if res.StatusCode != 429 || len(up.requests()) != 7 {
			t.Fatalf("status %d after %d requests, want 429 after 7", res.StatusCode, len(up.requests()))
		}
		var want []time.Duration
		for _, c := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second,
			3 * time.Second, 3 * time.Second} {
			want = append(want, time.Duration(0.999*float64(c)))
		}
		s := r.slept()
		if !sameDurations(s, want) {
			t.Fatalf("slept %v, want %v", s, want)
		}
		for i, d := range s {
			if d >= o.MaxBackoff || i > 0 && d < s[i-1] {
				t.Fatalf("backoff %d: %s after %v (max %s)", i, d, s[:i], o.MaxBackoff)
			}
		}
	})
	t.Run("random jitter", func(t *testing.T) {
		o := retryOpts(gate.Options{Retries: 8, MaxBackoff: 3 * time.Second})
		g, err := gate.New(o)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		up := newStub(t, script(tooMany("retry-after-ms", "0")))
		var sleeps []time.Duration
		tr := &gate.Transport{Base: &http.Transport{}, Sleep: func(ctx context.Context, d time.Duration) error {
			sleeps = append(sleeps, d)
			return nil
		}}
		for range 20 {
			tk := acquire(t, g, 1)
			req, _ := http.NewRequestWithContext(gate.WithTicket(context.Background(), tk), http.MethodGet, up.srv.URL, nil)
			res, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, res)
			tk.Release()
		}
		for i, d := range sleeps {
			ceiling := min(o.MaxBackoff, 500*time.Millisecond<<(i%8))
			if d < 0 || d >= ceiling {
				t.Fatalf("backoff %d (attempt %d): %s, want in [0, %s)", i, i%8, d, ceiling)
			}
		}
	})
}

// A pause lengthened while a retry waits (by another request's 429) is
// waited out too before the retry.
func TestTransportLengthenedPause(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, backend string, mk maker) {
		o := retryOpts(gate.Options{})
		r := newRig(t, mk, o, 0)
		other := r.g
		if backend == "redis" {
			o.Now = r.clk.Now
			other = mk(t, o) // the other request is on another instance
		}
		up := newStub(t, func(n int, req *http.Request) reply {
			if req.URL.Path == "/other" {
				return tooMany("Retry-After", "5")
			}
			if n == 0 {
				return tooMany("retry-after-ms", "1000")
			}
			return ok200
		})
		otherTk := acquire(t, other, 1)
		defer otherTk.Release()
		first := true
		r.tr.Sleep = func(ctx context.Context, d time.Duration) error {
			r.sleep(ctx, d)
			if first {
				first = false
				// Meanwhile another request gets a 429 asking for 5s;
				// it cannot wait (its deadline), so it does not retry.
				otherTk.Deadline = r.clk.Now().Add(time.Millisecond)
				res, err := r.send(t, otherTk, up.srv.URL+"/other", "y")
				if err != nil {
					t.Error(err)
					return nil
				}
				readBody(t, res)
			}
			return nil
		}
		tk := acquire(t, r.g, 1)
		defer tk.Release()
		res, err := r.send(t, tk, up.srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, res)
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		if s := r.slept(); !sameDurations(s, []time.Duration{time.Second, 5 * time.Second}) {
			t.Fatalf("slept %v, want [1s 5s]", s)
		}
	})
}

// A retry waits for the outbound rate like any request: with the rate
// spent it waits until a send leaves the window; when that is past
// MaxWait, the upstream's answer is passed on with that wait.
func TestTransportRetryWaitsForRate(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		o := gate.Options{Name: "rated", Priorities: prios, Rate: 2, Per: 10 * time.Second, Retries: 1,
			MaxBackoff: 20 * time.Second, MaxWait: 30 * time.Second}
		r := newRig(t, mk, o, 0)
		up := newStub(t, script(tooMany("retry-after-ms", "100"), ok200))
		tk := acquire(t, r.g, 1)
		other := acquire(t, r.g, 1) // the rate's second send, at the same time
		res, err := r.send(t, tk, up.srv.URL, "body")
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		readBody(t, res)
		// The pause (100ms), then the rest of the window: the retry left
		// 10 s after the first sends, not 100 ms.
		var total time.Duration
		for _, d := range r.slept() {
			total += d
		}
		if total < 10*time.Second {
			t.Fatalf("the retry left after %v (%v), within the rate's window", total, r.slept())
		}
		tk.Release()
		other.Release()

		// MaxWait shorter than the rate's wait: no retry; the 429 is
		// passed on, its Retry-After the wait for the rate.
		o.Name, o.MaxWait = "rated2", 2*time.Second
		r = newRig(t, mk, o, 0)
		up = newStub(t, script(tooMany("retry-after-ms", "100"), ok200))
		tk = acquire(t, r.g, 1)
		other = acquire(t, r.g, 1)
		defer tk.Release()
		defer other.Release()
		res, err = r.send(t, tk, up.srv.URL, "body")
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 429 || readBody(t, res) != "slow down" || len(up.requests()) != 1 {
			t.Fatalf("status %d, %d requests", res.StatusCode, len(up.requests()))
		}
		if ra := res.Header.Get("Retry-After"); ra != "10" {
			t.Fatalf("Retry-After %q, want 10 (the rate's wait)", ra)
		}
	})
}

// max_backoff caps the backoff, not the pause the upstream asked for: a
// 429 asking for 1 s under a max_backoff of 500 ms is retried after the
// pause and then a backoff below 500 ms, and each retry is counted.
func TestTransportPauseLongerThanMaxBackoff(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		for _, tc := range []struct {
			name    string
			retries int
			replies []reply
			status  int
			sleeps  []time.Duration
		}{
			// Jitter 0.5: 1 s of pause, then half of min(500ms, 500ms × 2^attempt).
			{"retries 2", 2, []reply{tooMany("Retry-After", "1"), tooMany("Retry-After", "1"), ok200}, 200,
				[]time.Duration{1250 * time.Millisecond, 1250 * time.Millisecond}},
			{"retries 1, throttled once", 1, []reply{tooMany("Retry-After", "1"), ok200}, 200,
				[]time.Duration{1250 * time.Millisecond}},
			{"retries 2, exhausted", 2, []reply{tooMany("Retry-After", "1")}, 429,
				[]time.Duration{1250 * time.Millisecond, 1250 * time.Millisecond}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				reg := prometheus.NewRegistry()
				m, err := gate.NewMetrics(reg)
				if err != nil {
					t.Fatal(err)
				}
				name := strings.ReplaceAll(tc.name, " ", "_")
				name = strings.ReplaceAll(name, ",", "")
				r := newRig(t, mk, opts(gate.Options{Name: name, Retries: tc.retries, MaxBackoff: 500 * time.Millisecond,
					Metrics: m}), 0.5)
				up := newStub(t, script(tc.replies...))
				tk := acquire(t, r.g, 1)
				defer tk.Release()
				res, err := r.send(t, tk, up.srv.URL, "x")
				if err != nil {
					t.Fatal(err)
				}
				readBody(t, res)
				if res.StatusCode != tc.status || len(up.requests()) != len(tc.sleeps)+1 {
					t.Fatalf("status %d after %d requests, want %d after %d", res.StatusCode, len(up.requests()),
						tc.status, len(tc.sleeps)+1)
				}
				if s := r.slept(); !sameDurations(s, tc.sleeps) {
					t.Fatalf("slept %v, want %v", s, tc.sleeps)
				}
				if tc.status == 429 {
					if ra := res.Header.Get("Retry-After"); ra != "1" {
						t.Fatalf("Retry-After %q, want 1", ra)
					}
				}
				if n := retriesOf(t, reg, name); n != float64(len(tc.sleeps)) {
					t.Fatalf("retries_total %v, want %d", n, len(tc.sleeps))
				}
			})
		}
	})
}

// A retry whose wait would end past max_wait after the request arrived,
// or past the caller's deadline, is not made; the 429 is passed on with
// the pause as its Retry-After.
func TestTransportRetryBounds(t *testing.T) {
	eachBackendClock(t, func(t *testing.T, _ string, mk maker) {
		t.Run("max_wait since arrival", func(t *testing.T) {
			r := newRig(t, mk, opts(gate.Options{Name: "mw", Retries: 2, MaxBackoff: 500 * time.Millisecond,
				MaxWait: 10 * time.Second}), 0)
			up := newStub(t, script(tooMany("Retry-After", "2"), ok200))
			tk := acquire(t, r.g, 1)
			defer tk.Release()
			r.clk.Advance(8500 * time.Millisecond) // it waited, then the upstream took long to answer
			res, err := r.send(t, tk, up.srv.URL, "x")
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, res)
			if res.StatusCode != 429 || len(up.requests()) != 1 || len(r.slept()) != 0 {
				t.Fatalf("status %d after %d requests, slept %v; want the 429 at once", res.StatusCode,
					len(up.requests()), r.slept())
			}
			if ra := res.Header.Get("Retry-After"); ra != "2" {
				t.Fatalf("Retry-After %q, want 2", ra)
			}
		})
		t.Run("within max_wait since arrival", func(t *testing.T) {
			r := newRig(t, mk, opts(gate.Options{Name: "mw2", Retries: 2, MaxBackoff: 500 * time.Millisecond,
				MaxWait: 10 * time.Second}), 0)
			up := newStub(t, script(tooMany("Retry-After", "2"), ok200))
			tk := acquire(t, r.g, 1)
			defer tk.Release()
			r.clk.Advance(7 * time.Second)
			res, err := r.send(t, tk, up.srv.URL, "x")
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, res)
			if res.StatusCode != 200 || len(up.requests()) != 2 {
				t.Fatalf("status %d after %d requests, want 200 after a retry", res.StatusCode, len(up.requests()))
			}
		})
	})
	// The context's deadline bounds the wait too (on the real clock).
	t.Run("context deadline", func(t *testing.T) {
		g, err := gate.New(opts(gate.Options{Name: "ctx", Retries: 2, MaxBackoff: 500 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		up := newStub(t, script(tooMany("Retry-After", "3"), ok200))
		tk := acquire(t, g, 1)
		defer tk.Release()
		ctx, cancel := context.WithTimeout(gate.WithTicket(context.Background(), tk), 2*time.Second)
		defer cancel()
		var slept []time.Duration
		tr := &gate.Transport{Base: &http.Transport{}, Sleep: func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			return nil
		}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.srv.URL, strings.NewReader("x"))
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, res)
		if res.StatusCode != 429 || len(up.requests()) != 1 || len(slept) != 0 {
			t.Fatalf("status %d after %d requests, slept %v; want the 429 at once", res.StatusCode, len(up.requests()), slept)
		}
		if ra := res.Header.Get("Retry-After"); ra != "3" {
			t.Fatalf("Retry-After %q, want 3", ra)
		}
	})
}
