package proxy

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// A 429 written from its prepared answer is byte for byte the 429 rendered
// afresh: two proxies on one clock, one without the cache, get the same
// requests; the refusals are answered from the refusal memory, their
// times counted down across seconds and milliseconds, under two rules
// (one a token bucket, one refusing) and in two envelopes.
func TestPreparedRefusalIsTheRendered(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	cfg := config.Default()
	cfg.UpstreamURL = "http://upstream.invalid"
	cfg.Rules = []config.Rule{{Name: "per-caller", Methods: []string{"POST"}, Key: []string{"caller"}, OnMissingKey: "skip",
		Algorithm: config.AlgSlidingWindow, Limit: 3, Window: time.Minute, Cost: config.CostRequests, Action: "reject"}, {Name: "bucket", Methods: []string{"POST"}, Key: []string{"caller"}, OnMissingKey: "skip",
		Algorithm: config.AlgTokenBucket, Limit: 100, Burst: 50, Window: time.Minute, Cost: config.CostRequests, Action: "reject"}}
	mk := func(cache bool) http.Handler {
		p, err := New(Options{Config: cfg, Store: limits.NewRemember(limits.NewMemory(limits.MemoryOptions{}), 100),
			Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Now: clock,
			Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		if !cache {
			p.prepared = nil
		}
		return p.Handler()
	}
	cached, fresh := mk(true), mk(false)
	hits := 0
	// Three admitted (two at once, one 1.5 s later): the wait (until the
	// first leaves the window) and the reset (until all have) differ.
	for i, step := range []time.Duration{0, 1500 * time.Millisecond, 0, 300 * time.Microsecond, 999 * time.Millisecond,
		1, 7 * time.Millisecond, 2 * time.Second, 20 * time.Second, 36*time.Second + 500*time.Millisecond, 300 * time.Millisecond,
		200 * time.Millisecond, time.Second, 400 * time.Millisecond} {
		now = now.Add(step)
		for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
			var got [2]*httptest.ResponseRecorder
			for j, h := range []http.Handler{cached, fresh} {
				r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"model":"gpt-4o","messages":[]}`))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Authorization", "Bearer sk-one")
				got[j] = httptest.NewRecorder()
				h.ServeHTTP(got[j], r)
			}
			a, b := got[0], got[1]
			if a.Code != b.Code || !bytes.Equal(a.Body.Bytes(), b.Body.Bytes()) || !reflect.DeepEqual(a.Header(), b.Header()) {
				t.Fatalf("request %d %s: prepared\n%d %v\n%s\nrendered\n%d %v\n%s", i, path, a.Code, a.Header(), a.Body, b.Code, b.Header(), b.Body)
			}
			if a.Code == http.StatusTooManyRequests {
				hits++
			}
		}
	}
	if hits < 10 {
		t.Errorf("%d refusals compared, want most of them", hits)
	}
}

// The same refusal in the same second is answered from one prepared
// answer; the next second renders a new one.
func TestPreparedRefusalKept(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	cfg := config.Default()
	cfg.ChatRPM = 1
	p := stepProxy(t, cfg, func() time.Time { return now })
	refuse := func() *denial {
		x := stepExchange(t, p, chatRequest(`{}`))
		x.identify()
		x.addHits()
		return x.decide()
	}
	if d := refuse(); d != nil {
		t.Fatal("first request refused")
	}
	now = now.Add(10 * time.Second)
	d := refuse()
	if d == nil || d.prepared != nil || d.sig == nil {
		t.Fatalf("first refusal: %+v", d)
	}
	pr := p.prepared.get(preparedKey{}, d.sig) // nothing kept under another key
	if pr != nil {
		t.Fatal("found under the zero key")
	}
	x := stepExchange(t, p, chatRequest(`{}`))
	x.ResponseWriter = httptest.NewRecorder()
	x.identify()
	x.addHits()
	d = x.decide()
	x.deny(d) // renders and keeps it
	kept := d.prepared
	now = now.Add(400 * time.Millisecond) // 49.6 s: still 50 in whole seconds
	if d := refuse(); d == nil || d.prepared != kept {
		t.Errorf("same second: prepared %p, want %p", d.prepared, kept)
	}
	now = now.Add(700 * time.Millisecond)
	if d := refuse(); d == nil || d.prepared != nil {
		t.Error("a second later: the old answer was used")
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
