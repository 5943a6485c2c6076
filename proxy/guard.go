package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// guard runs the guard chain of SPEC §4 on a protected request, in its
// contractual order: identify, rate limit (then, in a later release, the
// body and token caps). It reports whether the request may be forwarded;
// when not, the answer has been written and x.decision says why.
func (p *Proxy) guard(x *exchange, r *http.Request, now time.Time) bool {
	// 1. Identify.
	c := p.ips.identify(r)
	if p.cfg.RequireAuth && !c.hasCred {
		x.decision = decUnauthorized
		x.Header()["Www-Authenticate"] = []string{"Bearer"}
		p.writeError(x, r, &apiError{status: http.StatusUnauthorized, code: codeUnauthorized,
			message: "An API key is required: send Authorization: Bearer <key> or X-API-Key."})
		return false
	}

	// 2. Rate limit.
	if !p.cfg.RateLimitEnabled {
		return true
	}
	x.hits[0] = limits.Hit{Rule: p.chatRule.rule, Key: limits.KeyOf("caller", c.value), Cost: 1}
	allowed, err := p.store.Decide(r.Context(), x.hits[:], now, x.out[:])
	if err != nil {
		return p.storeFailed(x, r, err)
	}
	x.limited, x.rule, x.dec = true, p.chatRule, x.out[0]
	if !allowed {
		p.refuse(x, r, &x.hits[0], "caller="+c.logged())
		return false
	}
	return true
}

// refuse answers 429 for the hit that refused (SPEC §5).
func (p *Proxy) refuse(x *exchange, r *http.Request, h *limits.Hit, loggedKey string) {
	x.decision = decRateLimited
	d := &x.dec
	retry := max(ceilSeconds(d.RetryAfter), 1)
	d.Remaining = 0
	secs := strconv.FormatInt(retry, 10)
	hdr := x.Header()
	hdr["Retry-After"] = []string{secs}
	hdr["X-Ratelimit-Retry-After"] = []string{secs}
	hdr["Retry-After-Ms"] = []string{strconv.FormatInt(max(ceilMillis(d.RetryAfter), 1), 10)}
	p.log.Info("request denied", "rule", h.Rule.Name, "key", loggedKey, "retry_after", retry, "path", r.URL.Path)
	p.writeError(x, r, &apiError{
		status:  http.StatusTooManyRequests,
		code:    codeRateLimited,
		message: "Too many requests. Please retry after " + secs + " seconds.",
		fields: []field{
			{"retry_after_seconds", retry},
			{"denied_by", h.Rule.Name},
			{"denied_key", h.Key.String()},
			{"limit", d.Limit},
		},
	})
}

// storeFailed applies FAIL_OPEN when the store could not decide: admit
// without rate-limit headers, or answer 503.
func (p *Proxy) storeFailed(x *exchange, r *http.Request, err error) bool {
	p.metrics.storeErrors.Inc()
	x.decision = decStoreError
	if p.cfg.FailOpen {
		p.log.Warn("rate limiter store failed; admitting (fail_open)", "err", err)
		return true
	}
	p.log.Error("rate limiter store failed; refusing (fail_open=false)", "err", err)
	x.Header()["Retry-After"] = []string{"1"}
	p.writeError(x, r, &apiError{status: http.StatusServiceUnavailable, code: codeStoreDown,
		message: "The rate limiter is unavailable. Please retry shortly."})
	return false
}
