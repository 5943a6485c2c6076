package gate

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
)

// DefaultPause is the pause after a 429 or 503 whose headers name no reset.
const DefaultPause = time.Second

// maxDrain is the most of a refused answer's body read before its
// connection is given back; a longer one closes the connection instead.
const maxDrain = 64 << 10

// Transport sends a request that holds a Ticket (WithTicket) and handles
// the upstream's 429 and 503 answers (SPEC §9): the group pauses until
// the upstream's reset, and the request is sent again — from its buffered
// body (Request.GetBody), with nothing yet sent to the client — after
// capped exponential backoff with full jitter and the pause, never past
// the caller's deadline nor MaxBackoff, at most Retries times. The answer
// it then passes on has a Retry-After that matches the pause.
type Transport struct {
	Base http.RoundTripper
	// Jitter returns a uniform value in [0, 1); math/rand/v2 when nil.
	Jitter func() float64
	// Sleep waits d or until ctx ends; a timer when nil (tests step time).
	Sleep func(ctx context.Context, d time.Duration) error
}

type ticketKey struct{}

// WithTicket is ctx carrying t to Transport.
func WithTicket(ctx context.Context, t *Ticket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// RoundTrip implements http.RoundTripper.
func (tr *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t, _ := req.Context().Value(ticketKey{}).(*Ticket)
	if t == nil {
		return tr.Base.RoundTrip(req)
	}
	g := t.g
	for attempt := 0; ; attempt++ {
		sent := g.now()
		res, err := tr.Base.RoundTrip(req)
		if err != nil || res.StatusCode != http.StatusTooManyRequests && res.StatusCode != http.StatusServiceUnavailable {
			return res, err
		}
		now := g.now()
		pause, ok := upstream.ResetAfter(res.Header, now)
		if !ok {
			pause = DefaultPause
		}
		left := g.throttled(&t.w, res.StatusCode, pause, sent)
		wait := max(left, tr.backoff(g.o, attempt))
		if attempt >= g.o.Retries || !replayable(req) || wait > g.o.MaxBackoff ||
			!t.Deadline.IsZero() && now.Add(wait).After(t.Deadline) {
			upstream.SetRetryAfter(res.Header, max(left, pause))
			return res, nil
		}
		discard(res)
		if err := tr.sleep(req.Context(), wait); err != nil {
			return nil, err
		}
		// Another instance may have lengthened the pause meanwhile.
		// Waiting it out too is bounded like the first wait; past the
		// bounds the request goes now, as the caller cannot wait longer.
		if more := g.pauseNow(); more > 0 && more <= g.o.MaxBackoff &&
			(t.Deadline.IsZero() || !g.now().Add(more).After(t.Deadline)) {
			if err := tr.sleep(req.Context(), more); err != nil {
				return nil, err
			}
		}
		if req, err = again(req); err != nil {
			return nil, err
		}
		g.resent(&t.w, attempt+1)
		if g.m != nil {
			g.m.retries.Inc()
		}
	}
}

// backoff is full jitter over a doubling ceiling capped at MaxBackoff:
// uniform in [0, min(MaxBackoff, BaseBackoff × 2^attempt)).
func (tr *Transport) backoff(o Options, attempt int) time.Duration {
	ceiling := o.MaxBackoff
	if attempt < 30 {
		ceiling = min(ceiling, o.BaseBackoff<<attempt)
	}
	j := rand.Float64
	if tr.Jitter != nil {
		j = tr.Jitter
	}
	return time.Duration(j() * float64(ceiling))
}

func (tr *Transport) sleep(ctx context.Context, d time.Duration) error {
	if tr.Sleep != nil {
		return tr.Sleep(ctx, d)
	}
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// again is req with a fresh copy of its body.
func again(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Body = body
	return r, nil
}

// discard reads a little of a refused answer so its connection can be
// reused, and closes it.
func discard(res *http.Response) {
	io.CopyN(io.Discard, res.Body, maxDrain)
	res.Body.Close()
}
