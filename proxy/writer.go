package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// exchange is one request's pass through the proxy: it wraps the
// ResponseWriter once, remembers the status for the metrics, and stamps the
// rate-limit headers on whatever response goes out (the upstream's, a 429,
// or the proxy's own errors after the limiter), replacing any the upstream
// sent under the same names. Exchanges are pooled; none outlives ServeHTTP.
type exchange struct {
	http.ResponseWriter
	status      int
	decision    string    // metrics label; set by the guard, refined on forwarding errors
	forwardedAt time.Time // zero until the request leaves for the upstream
	route       *routeMetrics
	routeName   string // the PROTECTED_PATHS entry matched, or routeUnprotected
	apiPath     string // protected: the canonical path that matched (error envelope, credential order)
	format      tokens.Format
	body        *spooled // the buffered body of a protected request
	now         func() time.Time

	limited bool // a rule decided this request: stamp its headers
	rule    *ruleHeaders
	dec     limits.Decision

	hits [1]limits.Hit
	out  [1]limits.Decision
}

// ruleHeaders is what never changes in a rule's headers, rendered once.
// The value slices are shared by every response and never written to (a
// later Header.Add on a full slice copies it).
type ruleHeaders struct {
	rule   *limits.Rule
	quoted string   // "chat_rpm", as a structured-field string
	limit  []string // X-RateLimit-Limit
	policy []string // RateLimit-Policy: "chat_rpm";q=20;w=60
}

func newRuleHeaders(r *limits.Rule) *ruleHeaders {
	q := strconv.Quote(r.Name) // names are [a-z0-9_.-]: no escapes needed
	return &ruleHeaders{
		rule:   r,
		quoted: q,
		limit:  []string{strconv.FormatInt(r.Limit, 10)},
		policy: []string{q + ";q=" + strconv.FormatInt(r.Limit, 10) + ";w=" + strconv.FormatInt(int64(r.Window/time.Second), 10)},
	}
}

// smallInts holds the header values of 0…1023, shared like ruleHeaders':
// remaining counts and resets in seconds are nearly always small.
var smallInts = func() (t [1024][]string) {
	for i := range t {
		t[i] = []string{strconv.Itoa(i)}
	}
	return t
}()

func intValue(n int64) []string {
	if n >= 0 && n < int64(len(smallInts)) {
		return smallInts[n]
	}
	return []string{strconv.FormatInt(n, 10)}
}

var _ http.ResponseWriter = (*exchange)(nil)

// Unwrap lets http.ResponseController reach the connection (Flush for
// streams, Hijack for upgrades).
func (e *exchange) Unwrap() http.ResponseWriter { return e.ResponseWriter }

func (e *exchange) WriteHeader(code int) {
	if e.status != 0 {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		e.ResponseWriter.WriteHeader(code) // informational: the final status follows
		return
	}
	e.status = code
	if !e.forwardedAt.IsZero() {
		e.route.upstream.Observe(e.now().Sub(e.forwardedAt).Seconds())
	}
	if e.limited {
		e.stamp(e.ResponseWriter.Header())
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *exchange) Write(b []byte) (int, error) {
	if e.status == 0 {
		e.WriteHeader(http.StatusOK)
	}
	return e.ResponseWriter.Write(b)
}

// stamp sets the X-RateLimit-* and RateLimit headers of SPEC §5.
func (e *exchange) stamp(h http.Header) {
	d := &e.dec
	remaining := intValue(d.Remaining)
	t := d.NextAfter
	if !d.Allowed {
		t = d.RetryAfter
	}
	limit, policy := e.rule.limit, e.rule.policy
	if d.Limit != e.rule.rule.Limit { // a limit of its own (FAIL_OPEN=local's share)
		limit = intValue(d.Limit)
		policy = []string{e.rule.quoted + ";q=" + limit[0] + ";w=" + strconv.FormatInt(int64(e.rule.rule.Window/time.Second), 10)}
	}
	h["X-Ratelimit-Limit"] = limit
	h["X-Ratelimit-Remaining"] = remaining
	h["X-Ratelimit-Reset"] = intValue(ceilSeconds(d.ResetAfter))
	h["Ratelimit-Policy"] = policy
	h["Ratelimit"] = []string{e.rule.quoted + ";r=" + remaining[0] + ";t=" + intValue(ceilSeconds(t))[0]}
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ceilMillis rounds d up to whole milliseconds.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
