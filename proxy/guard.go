package proxy

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// guard runs the guard chain of SPEC §4 on a protected request, in its
// contractual order: identify, rate limit, body and file size, token cap.
// It reports whether the request may be forwarded;
// when not, the answer has been written and x.decision says why.
func (p *Proxy) guard(x *exchange, r *http.Request, now time.Time) bool {
	// 1. Identify.
	c := p.ips.identify(r, anthropicPath(x.apiPath))
	if p.cfg.RequireAuth && !c.hasCred {
		x.decision = decUnauthorized
		p.log.Info("request denied", "rule", "require_auth", "key", "caller="+c.logged(), "path", r.URL.Path)
		x.Header()["Www-Authenticate"] = []string{"Bearer"}
		p.writeError(x, r, &apiError{status: http.StatusUnauthorized, code: codeUnauthorized,
			message: "An API key is required: send Authorization: Bearer <key>, X-API-Key or api-key."})
		return false
	}

	// 2. Rate limit.
	if !p.cfg.RateLimitEnabled {
		return p.guardBody(x, r, c, now)
	}
	x.hits[0] = limits.Hit{Rule: p.chatRule.rule, Key: limits.KeyOf("caller", c.value), Cost: 1}
	allowed, err := p.store.Decide(r.Context(), x.hits[:], now, x.out[:])
	if err != nil {
		return p.storeFailed(x, r, c, now, err)
	}
	x.limited, x.rule, x.dec = true, p.chatRule, x.out[0]
	if !allowed {
		p.refuse(x, r, &x.hits[0], "caller="+c.logged())
		return false
	}
	return p.guardBody(x, r, c, now)
}

// guardBody runs guards 3 and 4: the body and file size caps, then the
// input-token cap. The body is read in full (within the cap) because a
// token cap cannot un-send bytes; an admitted body is then forwarded from
// that copy, byte for byte. A compressed body is refused before any byte
// of it is read (SPEC §4.6): the caps would count the compressed bytes.
func (p *Proxy) guardBody(x *exchange, r *http.Request, c caller, now time.Time) bool {
	// Content_Encoding: CGI and WSGI servers read the _ spelling as the same header.
	if ce := slices.Concat(r.Header["Content-Encoding"], r.Header["Content_encoding"]); len(ce) > 0 && !identityOnly(ce) {
		x.decision = decUnsupportedEncoding
		p.log.Info("request denied", "rule", "content_encoding", "key", "caller="+c.logged(), "path", r.URL.Path)
		x.Header()["Accept-Encoding"] = []string{"identity"}
		p.writeError(x, r, &apiError{status: http.StatusUnsupportedMediaType, code: codeUnsupportedEncoding,
			message: "Compressed request bodies are not accepted: send the body without a Content-Encoding."})
		return false
	}

	// 3. Body and file size.
	body, err := readBody(x.ResponseWriter, r, p.cfg.MaxBodyBytes, now)
	switch {
	case errors.Is(err, errBodyTooLarge):
		p.tooLarge(x, r, c, "max_body_bytes", &apiError{status: http.StatusRequestEntityTooLarge, code: codeBodyTooLarge,
			message: "The request body exceeds " + strconv.FormatInt(p.cfg.MaxBodyBytes, 10) + " bytes.",
			fields:  []field{{"max_body_bytes", p.cfg.MaxBodyBytes}}})
		return false
	case err != nil:
		if r.Context().Err() != nil {
			x.decision = decClientClosed
			return false
		}
		p.invalid(x, r, "The request body could not be read completely.")
		return false
	}
	x.body = body
	ct := r.Header.Get("Content-Type")
	big, err := oversizedFile(ct, body.readerAt(), body.size, p.cfg.MaxFileBytes)
	if err != nil {
		p.invalid(x, r, "The request body is not valid multipart/form-data: "+err.Error()+".")
		return false
	}
	if big {
		p.tooLarge(x, r, c, "max_file_bytes", &apiError{status: http.StatusRequestEntityTooLarge, code: codeFileTooLarge,
			message: "An uploaded file exceeds " + strconv.FormatInt(p.cfg.MaxFileBytes, 10) + " bytes.",
			fields:  []field{{"max_file_bytes", p.cfg.MaxFileBytes}}})
		return false
	}

	// 4. Token cap.
	est, err := p.tokens.Estimate(tokens.Request{Format: x.format, ContentType: ct,
		Body: body.readerAt(), Size: body.size}, int(p.cfg.MaxInputTokens))
	if err != nil {
		if errors.Is(err, tokens.ErrInvalid) {
			p.invalid(x, r, "The request body could not be parsed: "+strings.TrimPrefix(err.Error(), tokens.ErrInvalid.Error()+"\n")+".")
			return false
		}
		p.log.Error("counting input tokens failed", "err", err)
		p.invalid(x, r, "The request body could not be counted.")
		return false
	}
	p.metrics.inputTokens.Observe(float64(est.Tokens))
	if int64(est.Tokens) > p.cfg.MaxInputTokens {
		p.tooLarge(x, r, c, "max_input_tokens", &apiError{status: http.StatusRequestEntityTooLarge, code: codeInputTooLarge,
			message: "The input is estimated at more than " + strconv.FormatInt(p.cfg.MaxInputTokens, 10) + " tokens.",
			fields:  []field{{"max_input_tokens", p.cfg.MaxInputTokens}, {"estimated_tokens", est.Tokens}}})
		return false
	}

	// Forward the bytes received, with their exact length.
	r.Body = body.upstreamBody()
	r.ContentLength = body.size
	r.TransferEncoding = nil
	delete(r.Header, "Expect") // the body is here already: no 100-continue upstream
	return true
}

// identityOnly reports whether Content-Encoding values name no coding but
// identity ("", "identity", "Identity, identity").
func identityOnly(values []string) bool {
	for _, v := range values {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" && !strings.EqualFold(tok, "identity") {
				return false
			}
		}
	}
	return true
}

// tooLarge answers a 413 and logs the denial.
func (p *Proxy) tooLarge(x *exchange, r *http.Request, c caller, limit string, e *apiError) {
	x.decision = decTooLarge
	p.log.Info("request denied", "rule", limit, "key", "caller="+c.logged(), "path", r.URL.Path)
	p.writeError(x, r, e)
}

// invalid answers 400 invalid_request; message never quotes the body.
func (p *Proxy) invalid(x *exchange, r *http.Request, message string) {
	x.decision = decInvalid
	p.writeError(x, r, &apiError{status: http.StatusBadRequest, code: codeInvalidRequest, message: message})
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
func (p *Proxy) storeFailed(x *exchange, r *http.Request, c caller, now time.Time, err error) bool {
	p.metrics.storeErrors.Inc()
	x.decision = decStoreError
	if p.cfg.FailOpen != config.FailOpenFalse {
		p.log.Debug("rate limiter store failed; admitting (fail_open)", "err", err)
		return p.guardBody(x, r, c, now)
	}
	p.log.Info("request denied", "rule", "fail_open", "key", "caller="+c.logged(), "retry_after", 1, "path", r.URL.Path, "err", err)
	x.Header()["Retry-After"] = []string{"1"}
	p.writeError(x, r, &apiError{status: http.StatusServiceUnavailable, code: codeStoreDown,
		message: "The rate limiter is unavailable. Please retry shortly."})
	return false
}
