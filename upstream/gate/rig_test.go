package gate_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// clock is a clock the test steps (Options.Now; with Redis, ClientClock
// makes the script use it too).
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.UnixMilli(1_700_000_000_000)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// eachBackendClock is eachBackend with the script on the group's clock.
func eachBackendClock(t *testing.T, f func(t *testing.T, backend string, mk maker)) {
	t.Run("memory", func(t *testing.T) {
		f(t, "memory", func(t *testing.T, o gate.Options) *gate.Group {
			g, err := gate.New(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Close)
			return g
		})
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, "redis", redisMaker(srv.Addr, fmt.Sprintf("gt%d:", prefixes.Add(1)), gate.RedisOptions{ClientClock: true}))
	})
}

// reply is what the stub upstream answers.
type reply struct {
	status int
	header map[string]string
	body   string
}

// stub is an upstream: answer decides the reply to its n-th request (0
// first); it records what it received.
type stub struct {
	srv    *httptest.Server
	answer func(n int, r *http.Request) reply
	hit    chan struct{}

	mu      sync.Mutex
	bodies  []string
	headers []http.Header
}

func newStub(t *testing.T, answer func(n int, r *http.Request) reply) *stub {
	s := &stub{answer: answer, hit: make(chan struct{}, 100)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.bodies)
		s.bodies = append(s.bodies, string(b))
		s.headers = append(s.headers, r.Header.Clone())
		s.mu.Unlock()
		rep := s.answer(n, r)
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(rep.status)
		io.WriteString(w, rep.body)
		select {
		case s.hit <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// script answers the n-th request with replies[n], the last one again
// past the end.
func script(replies ...reply) func(int, *http.Request) reply {
	return func(n int, _ *http.Request) reply { return replies[min(n, len(replies)-1)] }
}

func (s *stub) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

func tooMany(h ...string) reply {
	r := reply{status: http.StatusTooManyRequests, header: map[string]string{}, body: "slow down"}
	for i := 0; i+1 < len(h); i += 2 {
		r.header[h[i]] = h[i+1]
	}
	return r
}

var ok200 = reply{status: http.StatusOK, body: "ok"}

// rig is a group on a fake clock and a Transport whose Sleep steps the
// clock and records what it was asked to wait.
type rig struct {
	clk *clock
	g   *gate.Group
	tr  *gate.Transport

	mu     sync.Mutex
	sleeps []time.Duration
}

func newRig(t *testing.T, mk maker, o gate.Options, jitter float64) *rig {
	r := &rig{clk: newClock()}
	o.Now = r.clk.Now
	r.g = mk(t, o)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	r.tr = &gate.Transport{Base: base, Jitter: func() float64 { return jitter }, Sleep: r.sleep}
	return r
}

func (r *rig) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	r.sleeps = append(r.sleeps, d)
	r.mu.Unlock()
	r.clk.Advance(d)
	return ctx.Err()
}

func (r *rig) slept() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.sleeps...)
}

// send sends a POST of body (GetBody set, as the proxy's buffered body
// has it) under tk.
func (r *rig) send(t *testing.T, tk *gate.Ticket, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(gate.WithTicket(context.Background(), tk), http.MethodPost, url,
		strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer k")
	return r.tr.RoundTrip(req)
}

func readBody(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func sameDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func retryOpts(o gate.Options) gate.Options {
	o = opts(o)
	if o.Retries == 0 {
		o.Retries = 2
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 20 * time.Second
	}
	return o
}
