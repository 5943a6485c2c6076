package gate

import (
	"bytes"
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
// body (Request.GetBody), with nothing yet sent to the client — at most
// Retries times. Each retry waits for the group's pause to end, then for
// a backoff drawn with full jitter below min(MaxBackoff, BaseBackoff ×
// 2^attempt) (MaxBackoff caps the backoff, not the pause), and for the
// outbound rate; a retry whose wait would end past the caller's deadline
// (the ticket's or the context's) or past MaxWait after the request
// arrived is not made. The answer it then passes on has a Retry-After
// that matches the pause.
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
		// The pause first, then the backoff: a pause the upstream asked
		// for is honoured whole, and the retries it releases spread out.
		o := g.opts()
		wait := left + tr.backoff(o, attempt)
		until := t.until(req.Context())
		if attempt >= o.Retries || !replayable(req) || now.Add(wait).After(until) {
			upstream.SetRetryAfter(res.Header, max(left, pause))
			return res, nil
		}
		// The answer is kept (its body read, bounded) until the retry is
		// sure to leave: if the wait grows past the bounds, it is what the
		// caller gets.
		if !keep(res) {
			upstream.SetRetryAfter(res.Header, max(left, pause))
			return res, nil
		}
		for {
			if err := tr.sleep(req.Context(), wait); err != nil {
				return nil, err
			}
			// The group may be paused again (another request's 429,
			// another instance's) and the rate may be spent: the retry
			// leaves only when both allow, as any request does.
			if wait = g.resend(&t.w, attempt+1); wait == 0 {
				break
			}
			if g.now().Add(wait).After(until) {
				upstream.SetRetryAfter(res.Header, wait)
				return res, nil
			}
		}
		res.Body.Close()
		if req, err = again(req); err != nil {
			return nil, err
		}
		if g.m != nil {
			g.m.retries.Inc()
		}
	}
}

// until is the latest a retry of t's request may leave: MaxWait after it
// arrived, and never past the caller's deadline (the ticket's, ctx's).
func (t *Ticket) until(ctx context.Context) time.Time {
	until := t.Arrived.Add(t.g.opts().MaxWait)
	if !t.Deadline.IsZero() && t.Deadline.Before(until) {
		until = t.Deadline
	}
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	return until
}

// backoff is full jitter over a doubling ceiling capped at MaxBackoff:
// uniform in [0, min(MaxBackoff, BaseBackoff × 2^attempt)).
func (tr *Transport) backoff(o *Options, attempt int) time.Duration {
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

// keep reads a refused answer's body (its connection goes back to the
// pool) and makes it readable again from memory; false when it is longer
// than maxDrain, and then it stays as it was, to be passed on.
func keep(res *http.Response) bool {
	buf, err := io.ReadAll(io.LimitReader(res.Body, maxDrain+1))
	if len(buf) > maxDrain {
		res.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), res.Body), res.Body}
		return false
	}
	res.Body.Close()
	if err != nil {
		buf = nil // a broken answer: what arrived is not passed on as whole
	}
	res.Body = io.NopCloser(bytes.NewReader(buf))
	return true
}
