package proxy

import (
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// The body guards (SPEC §4.3, §4.4, §4.6): reading the body within the
// caps, counting its tokens, and the 413, 415 and 400 they answer.

// readBody runs guards 3 and 4's reading: a compressed body is refused
// unread (SPEC §4.6), the body is read within MAX_BODY_BYTES and its files
// within MAX_FILE_BYTES, and on a protected route its input tokens are
// counted. fields, when some applying rule reads the body, are read in the
// same pass. The admitted body is then forwarded from that copy, byte for
// byte.
//
// On an unprotected route, count >= 0 asks for the tokens too (a token
// rule applies), counted up to count.
func (p *Proxy) readBody(x *exchange, r *http.Request, in *keyInput, now time.Time, protected, needBody bool, fields *tokens.Fields, count int64) bool {
	if compressed(r) {
		x.decision = decUnsupportedEncoding
		p.log.Info("request denied", "rule", "content_encoding", "key", "caller="+in.c.logged(), "path", r.URL.Path)
		x.Header()["Accept-Encoding"] = []string{"identity"}
		p.writeError(x, r, &apiError{status: http.StatusUnsupportedMediaType, code: codeUnsupportedEncoding,
			message: "Compressed request bodies are not accepted: send the body without a Content-Encoding."})
		return false
	}

	if !p.spool(x, r, &in.c, now) {
		return false
	}
	body := x.body
	ct := r.Header.Get("Content-Type")
	big, err := oversizedFile(ct, body.bytes(), x.pol.cfg.MaxFileBytes)
	if err != nil {
		p.invalid(x, r, "The request body is not valid multipart/form-data: "+err.Error()+".")
		return false
	}
	if big {
		p.tooLarge(x, r, &in.c, "max_file_bytes", &apiError{status: http.StatusRequestEntityTooLarge, code: codeFileTooLarge,
			message: "An uploaded file exceeds " + strconv.FormatInt(x.pol.cfg.MaxFileBytes, 10) + " bytes.",
			fields:  []field{{"max_file_bytes", x.pol.cfg.MaxFileBytes}}})
		return false
	}

	req := tokens.Request{Format: x.format, ContentType: ct, Body: body.bytes(), Fields: fields}
	in.fields = fields
	switch {
	case protected || count >= 0:
		if !protected {
			count = min(count, math.MaxInt32)
			x.format = tokens.FormatForPath(in.path)
			req.Format = x.format
		} else {
			count = x.pol.cfg.MaxInputTokens
		}
		est, err := p.tokens.Estimate(req, int(count))
		if err != nil {
			return p.unreadable(x, r, err)
		}
		if est.Limited != "" {
			// Over the cap by construction (Tokens past count): the
			// guards ahead answer the 413.
			p.metrics.costLimitedBy[est.Limited].Inc()
		}
		x.est = est
		in.model, in.values = est.Model, est.Values
	case needBody:
		model, values, err := p.tokens.ReadFields(req)
		if err != nil {
			return p.unreadable(x, r, err)
		}
		in.model, in.values = model, values
	}
	return true
}

// compressed reports whether r's body has a Content-Encoding other than
// identity.
func compressed(r *http.Request) bool {
	// Content_Encoding: CGI and WSGI servers read the _ spelling as the same header.
	ce := slices.Concat(r.Header["Content-Encoding"], r.Header["Content_encoding"])
	return len(ce) > 0 && !identityOnly(ce)
}

// spool reads r's body within MAX_BODY_BYTES into x.body, and makes the
// bytes received, with their exact length, what is forwarded. False when
// it answered: 413 body_too_large (logged with caller c), 400 for a body
// that broke off, nothing when the client left. A body read while a delay
// rule held the request (readWhileHeld) is taken as it was read.
func (p *Proxy) spool(x *exchange, r *http.Request, c *caller, now time.Time) bool {
	body, err := x.body, x.bodyErr
	if !x.bodyRead {
		body, err = readBody(x.ResponseWriter, r, x.pol.cfg.MaxBodyBytes, now)
	}
	switch {
	case errors.Is(err, errBodyTooLarge):
		p.tooLarge(x, r, c, "max_body_bytes", &apiError{status: http.StatusRequestEntityTooLarge, code: codeBodyTooLarge,
			message: "The request body exceeds " + strconv.FormatInt(x.pol.cfg.MaxBodyBytes, 10) + " bytes.",
			fields:  []field{{"max_body_bytes", x.pol.cfg.MaxBodyBytes}}})
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
	r.Body = body.upstreamBody()
	r.ContentLength = body.size
	r.TransferEncoding = nil
	delete(r.Header, "Expect") // the body is here already: no 100-continue upstream
	return true
}

// unreadable answers 400 for a body the token counter or the key part
// reader could not parse (the message says where, never what).
func (p *Proxy) unreadable(x *exchange, r *http.Request, err error) bool {
	if errors.Is(err, tokens.ErrInvalid) {
		p.invalid(x, r, "The request body could not be parsed: "+strings.TrimPrefix(err.Error(), tokens.ErrInvalid.Error()+"\n")+".")
		return false
	}
	p.log.Error("reading the request body failed", "err", err)
	p.invalid(x, r, "The request body could not be counted.")
	return false
}

// tokenCap is guard 4's cap: 413 past MAX_INPUT_TOKENS.
func (p *Proxy) tokenCap(x *exchange, r *http.Request, in *keyInput) bool {
	est := &x.est
	p.metrics.inputTokens.Observe(float64(est.Tokens))
	if int64(est.Tokens) > x.pol.cfg.MaxInputTokens {
		p.tooLarge(x, r, &in.c, "max_input_tokens", &apiError{status: http.StatusRequestEntityTooLarge, code: codeInputTooLarge,
			message: "The input is estimated at more than " + strconv.FormatInt(x.pol.cfg.MaxInputTokens, 10) + " tokens.",
			fields:  []field{{"max_input_tokens", x.pol.cfg.MaxInputTokens}, {"estimated_tokens", est.Tokens}}})
		return false
	}
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
func (p *Proxy) tooLarge(x *exchange, r *http.Request, c *caller, limit string, e *apiError) {
	x.decision = decTooLarge
	p.log.Info("request denied", "rule", limit, "key", "caller="+c.logged(), "path", r.URL.Path)
	p.writeError(x, r, e)
}
