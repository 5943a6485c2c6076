package proxy

import (
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// The body guards (SPEC §4.3, §4.4, §4.6): reading the body within the
// caps, counting its tokens, and the 413, 415 and 400 they answer.

// readBody is the chain's reading of the body (guards 3 and 4): a
// compressed body is refused unread (SPEC §4.6), the body is read within
// MAX_BODY_BYTES and its files within MAX_FILE_BYTES, and on a protected
// route its input tokens are counted. When some applying rule reads the
// body, its fields are read in the same pass. The admitted body is then
// forwarded from that copy, byte for byte. An unprotected route's body is
// read only for such rules.
//
// On an unprotected route the tokens are counted too when a token rule
// applies, up to countFor.
func (x *exchange) readBody() *denial {
	if !x.protected && !x.bodyRules {
		return nil
	}
	r, in := x.r, &x.keys
	var fields *tokens.Fields
	count := int64(-1)
	if x.bodyRules {
		fields, count = bodyFields(x.cands), countFor(x.cands)
	}
	if compressed(r) {
		return x.refuse(decUnsupportedEncoding, http.StatusUnsupportedMediaType, codeUnsupportedEncoding,
			"Compressed request bodies are not accepted: send the body without a Content-Encoding.").
			header("Accept-Encoding", []string{"identity"}).
			logged("rule", "content_encoding", "key", "caller="+in.c.logged(), "path", r.URL.Path)
	}

	if d := x.spool(&in.c); d != nil {
		return d
	}
	body := x.body
	ct := r.Header.Get("Content-Type")
	big, err := oversizedFile(ct, body.bytes(), x.pol.cfg.MaxFileBytes)
	if err != nil {
		return x.invalid("The request body is not valid multipart/form-data: " + err.Error() + ".")
	}
	if big {
		return x.tooLarge(&in.c, "max_file_bytes", codeFileTooLarge,
			"An uploaded file exceeds "+strconv.FormatInt(x.pol.cfg.MaxFileBytes, 10)+" bytes.").
			with(field{"max_file_bytes", x.pol.cfg.MaxFileBytes})
	}

	req := tokens.Request{Format: x.format, ContentType: ct, Body: body.bytes(), Fields: fields}
	in.fields = fields
	switch {
	case x.protected || count >= 0:
		if !x.protected {
			count = min(count, math.MaxInt32)
			x.format = tokens.FormatForPath(in.path)
			req.Format = x.format
		} else {
			count = x.pol.cfg.MaxInputTokens
		}
		est, err := x.p.tokens.Estimate(req, int(count))
		if err != nil {
			return x.unreadable(err)
		}
		if est.Limited != "" {
			// Over the cap by construction (Tokens past count): the
			// guards ahead answer the 413.
			x.p.metrics.costLimitedBy[est.Limited].Inc()
		}
		x.est = est
		in.model, in.values = est.Model, est.Values
	case x.bodyRules:
		model, values, err := x.p.tokens.ReadFields(req)
		if err != nil {
			return x.unreadable(err)
		}
		in.model, in.values = model, values
	}
	return nil
}

// compressed reports whether r's body has a Content-Encoding other than
// identity.
func compressed(r *http.Request) bool {
	// Content_Encoding: CGI and WSGI servers read the _ spelling as the same header.
	ce := slices.Concat(r.Header["Content-Encoding"], r.Header["Content_encoding"])
	return len(ce) > 0 && !identityOnly(ce)
}

// spool reads the body within MAX_BODY_BYTES into x.body, and makes the
// bytes received, with their exact length, what is forwarded. Its
// denials: 413 body_too_large (logged with caller c), 400 for a body that
// broke off, no answer when the client left. A body read while a delay
// rule held the request (readWhileHeld) is taken as it was read.
func (x *exchange) spool(c *caller) *denial {
	r := x.r
	body, err := x.body, x.bodyErr
	if !x.bodyRead {
		body, err = readBody(x.ResponseWriter, r, x.pol.cfg.MaxBodyBytes)
	}
	switch {
	case errors.Is(err, errBodyTooLarge):
		return x.tooLarge(c, "max_body_bytes", codeBodyTooLarge,
			"The request body exceeds "+strconv.FormatInt(x.pol.cfg.MaxBodyBytes, 10)+" bytes.").
			with(field{"max_body_bytes", x.pol.cfg.MaxBodyBytes})
	case err != nil:
		if r.Context().Err() != nil {
			return x.gone()
		}
		return x.invalid("The request body could not be read completely.")
	}
	x.body = body
	r.Body = body.upstreamBody()
	r.ContentLength = body.size
	r.TransferEncoding = nil
	delete(r.Header, "Expect") // the body is here already: no 100-continue upstream
	return nil
}

// unreadable is the 400 for a body the token counter or the key part
// reader could not parse (the message says where, never what).
func (x *exchange) unreadable(err error) *denial {
	if errors.Is(err, tokens.ErrInvalid) {
		return x.invalid("The request body could not be parsed: " + strings.TrimPrefix(err.Error(), tokens.ErrInvalid.Error()+"\n") + ".")
	}
	x.p.log.Error("reading the request body failed", "err", err)
	return x.invalid("The request body could not be counted.")
}

// tokenCap is guard 4's cap on a protected route: 413 past
// MAX_INPUT_TOKENS.
func (x *exchange) tokenCap() *denial {
	if !x.protected {
		return nil
	}
	est := &x.est
	x.p.metrics.inputTokens.Observe(float64(est.Tokens))
	if int64(est.Tokens) > x.pol.cfg.MaxInputTokens {
		return x.tooLarge(&x.keys.c, "max_input_tokens", codeInputTooLarge,
			"The input is estimated at more than "+strconv.FormatInt(x.pol.cfg.MaxInputTokens, 10)+" tokens.").
			with(field{"max_input_tokens", x.pol.cfg.MaxInputTokens}, field{"estimated_tokens", est.Tokens})
	}
	return nil
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

// tooLarge is a 413 for limit, logged with the caller.
func (x *exchange) tooLarge(c *caller, limit, code, message string) *denial {
	return x.refuse(decTooLarge, http.StatusRequestEntityTooLarge, code, message).
		logged("rule", limit, "key", "caller="+c.logged(), "path", x.r.URL.Path)
}
