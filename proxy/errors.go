package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error codes of SPEC §5.
const (
	codeUnauthorized        = "unauthorized"
	codeRateLimited         = "rate_limited"
	codeBodyTooLarge        = "body_too_large"
	codeFileTooLarge        = "file_too_large"
	codeInputTooLarge       = "input_too_large"
	codeInvalidRequest      = "invalid_request"
	codeUnsupportedEncoding = "unsupported_encoding"
	codeUpstreamDown        = "upstream_unavailable"
	codeUpstreamTimeout     = "upstream_timeout"
	codeStoreDown           = "rate_limiter_unavailable"
	codeMissingKey          = "missing_key"
)

// field is one top-level member an error body adds to its envelope.
type field struct {
	name  string
	value any
}

// apiError is an error the proxy answers itself.
type apiError struct {
	status  int
	code    string
	message string
	fields  []field // top-level members besides the envelope, in order
}

// envelope is the error format a path's clients parse (SPEC §5).
type envelope int

const (
	envFlat envelope = iota
	envOpenAI
	envAnthropic
)

func envelopeFor(path string, flat bool) envelope {
	switch {
	case flat:
		return envFlat
	case path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/"):
		return envAnthropic
	case strings.HasPrefix(path, "/v1/"):
		return envOpenAI
	default:
		return envFlat
	}
}

// errorType is both providers' name for the category of a status.
func errorType(status int) string {
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnsupportedMediaType:
		return "invalid_request_error"
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "api_error"
	default:
		return "invalid_request_error"
	}
}

// body renders e in env. Values are marshalled one by one so the members
// keep a stable, readable order.
func (e *apiError) body(env envelope) []byte {
	var b bytes.Buffer
	b.Grow(384)
	b.WriteByte('{')
	switch env {
	case envAnthropic:
		b.WriteString(`"type":"error","error":{"type":`)
		writeJSON(&b, errorType(e.status))
		b.WriteString(`,"code":`)
		writeJSON(&b, e.code)
		b.WriteString(`,"message":`)
		writeJSON(&b, e.message)
		b.WriteByte('}')
	case envOpenAI:
		b.WriteString(`"error":{"message":`)
		writeJSON(&b, e.message)
		b.WriteString(`,"type":`)
		writeJSON(&b, errorType(e.status))
		b.WriteString(`,"code":`)
		writeJSON(&b, e.code)
		b.WriteString(`,"param":null}`)
	default:
		b.WriteString(`"error":`)
		writeJSON(&b, e.code)
		b.WriteString(`,"message":`)
		writeJSON(&b, e.message)
	}
	for _, f := range e.fields {
		b.WriteByte(',')
		writeJSON(&b, f.name)
		b.WriteByte(':')
		writeJSON(&b, f.value)
	}
	b.WriteString("}\n")
	return b.Bytes()
}

func writeJSON(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case string:
		// Strings here are our own codes, messages and key forms, but a key
		// part may carry client bytes: escape whatever needs it, as
		// json.Marshal does; the usual plain ASCII is copied as it is (the
		// refusal is the attacker's hot path).
		if plainJSON(x) {
			b.WriteByte('"')
			b.WriteString(x)
			b.WriteByte('"')
			return
		}
		out, _ := json.Marshal(x)
		b.Write(out)
	case []string: // violated: rule names, plain ASCII
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, e)
		}
		b.WriteByte(']')
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case int:
		b.WriteString(strconv.Itoa(x))
	default:
		out, err := json.Marshal(x)
		if err != nil {
			b.WriteString("null")
			return
		}
		b.Write(out)
	}
}

// plainJSON reports whether s is printable ASCII that json.Marshal writes
// unchanged between quotes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// writeError answers e in the envelope of r's path: on a protected route,
// of the canonical path that matched (/V1/Messages is Anthropic's). Headers
// already set on w (rate-limit headers, Retry-After) are kept.
func (p *Proxy) writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	x, _ := w.(*exchange)
	env := envelopeFor(r.URL.Path, p.policy.Load().flatErrors)
	if x != nil {
		x.discardIfUnread(r)
		env = x.envelope()
	}
	body := e.body(env)
	contentHeaders(w.Header(), len(body))
	w.WriteHeader(e.status)
	w.Write(body)
}

// envelope is the error format of x's answers: of the canonical path that
// matched on a protected route, else of the path as sent.
func (x *exchange) envelope() envelope {
	path := x.r.URL.Path
	if x.apiPath != "" {
		path = x.apiPath
	}
	return envelopeFor(path, x.pol.flatErrors)
}

// The content headers of an error body; the values are shared by every
// answer and never written to.
var (
	jsonType = []string{"application/json"}
	noStore  = []string{"no-store"}
	noSniff  = []string{"nosniff"}
)

func contentHeaders(h http.Header, n int) {
	h["Content-Type"] = jsonType
	h["Content-Length"] = intValue(int64(n))
	h["Cache-Control"] = noStore
	h["X-Content-Type-Options"] = noSniff
}

// discardIfUnread reads what has arrived of a body no guard read before
// answering (discardUnread), unless the request was forwarded.
func (x *exchange) discardIfUnread(r *http.Request) {
	if x.body == nil && !x.bodyRead && x.forwardedAt.IsZero() && r.ContentLength != 0 {
		discardUnread(x, r)
	}
}

// Answering before the body was read (401, 415, 429, 400 missing_key),
// Go's server first reads up to 256 KiB of the body, with no deadline, to
// keep the connection: a client trickling its body would wait for its
// answer as long as it likes, holding the connection. discardUnread reads
// what has arrived within a short deadline instead; a body that has not
// all arrived by then (or is larger) ends the connection after the answer.
// A client that sent Expect: 100-continue is waiting for permission to send its
// body: reading would send it 100 Continue (Go's server sends it on the
// first read), inviting a body the proxy will not look at, so it gets the
// answer alone and the connection ends (SPEC §4.3).
const (
	unreadWait = 50 * time.Millisecond
	unreadMax  = 256 << 10
)

func discardUnread(x *exchange, r *http.Request) {
	if r.ContentLength > unreadMax || expectsContinue(r) {
		x.Header()["Connection"] = []string{"close"}
		return
	}
	rc := http.NewResponseController(x.ResponseWriter)
	if rc.SetReadDeadline(time.Now().Add(unreadWait)) != nil {
		return // no deadline to bound the read with: left to the server
	}
	x.drain = io.LimitedReader{R: r.Body, N: unreadMax + 1}
	n, err := io.Copy(io.Discard, &x.drain)
	x.drain.R = nil
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil || n > unreadMax {
		x.Header()["Connection"] = []string{"close"}
	}
}

// expectsContinue reports whether the client waits for 100 Continue
// before it sends its body.
func expectsContinue(r *http.Request) bool {
	for _, v := range r.Header["Expect"] {
		if strings.EqualFold(strings.TrimSpace(v), "100-continue") {
			return true
		}
	}
	return false
}
