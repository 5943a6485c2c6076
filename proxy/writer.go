package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// maxInlineRules is how many applying rules a request holds without
// allocating.
const maxInlineRules = 8

// ruleHeaders is what never changes in a rule's headers, rendered once.
// The value slices are shared by every response and never written to (a
// later Header.Add on a full slice copies it).
type ruleHeaders struct {
	rule   *limits.Rule
	quoted string   // "chat_rpm", as a structured-field string
	limit  []string // X-RateLimit-Limit
	policy []string // RateLimit-Policy: "chat_rpm";q=20;w=60
	cost   costKind
}

func newRuleHeaders(r *limits.Rule, c costKind) *ruleHeaders {
	q := strconv.Quote(r.Name) // names are [a-z0-9_.-]: no escapes needed
	rh := &ruleHeaders{
		rule:   r,
		quoted: q,
		policy: []string{policyItem(r, q, r.Limit, r.Burst, c)},
		cost:   c,
	}
	rh.limit = rh.amount(r.Limit)
	return rh
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
	if e.forwarded && e.budget.clamped > 0 {
		// The request left with the output cap it was lowered to, or
		// given (SPEC §8.2): its answer says so, whatever the upstream's.
		e.ResponseWriter.Header()["X-Ratelimit-Output-Clamped"] = []string{strconv.FormatInt(e.budget.clamped, 10)}
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *exchange) Write(b []byte) (int, error) {
	if e.status == 0 {
		e.WriteHeader(http.StatusOK)
	}
	n, err := e.ResponseWriter.Write(b)
	e.written += int64(n)
	return n, err
}

// stamp sets the X-RateLimit-* and RateLimit headers of SPEC §5, §7.3 and
// §8: X-RateLimit-* from the applying enforcing rule out[show] (the request
// rule with the fewest remaining, else the token rule; on a 429 the
// refusing rule), OpenAI's x-ratelimit-*-requests and -tokens from the
// request rule and the token rule with the fewest remaining,
// RateLimit-Policy and RateLimit listing every applying enforcing rule, in
// evaluation order. Shadow rules add nothing.
func (e *exchange) stamp(h http.Header) {
	d := &e.out[e.show]
	rh := e.rules[e.show].headers
	remaining := rh.amount(d.Remaining)
	h["X-Ratelimit-Limit"] = rh.limitValue(d.Limit)
	if e.refused {
		h["X-Ratelimit-Remaining"] = smallInts[0]
	} else {
		h["X-Ratelimit-Remaining"] = remaining
	}
	h["X-Ratelimit-Reset"] = intValue(ceilSeconds(d.ResetAfter))
	if i := fewest(e, costRequests); i >= 0 {
		e.openAI(h, i, "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests")
	}
	if i := fewest(e, costInput); i >= 0 {
		e.openAI(h, i, "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens")
	}
	if i := fewest(e, costUSD); i >= 0 {
		e.openAI(h, i, "X-Ratelimit-Limit-Usd", "X-Ratelimit-Remaining-Usd", "X-Ratelimit-Reset-Usd")
	}
	n := 0
	for _, ru := range e.rules {
		if ru.action != actShadow {
			n++
		}
	}
	if n == 1 {
		h["Ratelimit-Policy"] = rh.policyValue(&e.hits[e.show], d)
		h["Ratelimit"] = []string{rh.quoted + ";r=" + remaining[0] + ";t=" + intValue(ceilSeconds(nextAfter(d)))[0]}
		return
	}
	var pol, state strings.Builder
	for i, ru := range e.rules {
		if ru.action == actShadow {
			continue
		}
		if pol.Len() > 0 {
			pol.WriteString(", ")
			state.WriteString(", ")
		}
		di := &e.out[i]
		pol.WriteString(ru.headers.policyValue(&e.hits[i], di)[0])
		state.WriteString(ru.headers.quoted)
		state.WriteString(";r=")
		state.WriteString(ru.headers.amount(di.Remaining)[0])
		state.WriteString(";t=")
		state.WriteString(intValue(ceilSeconds(nextAfter(di)))[0])
	}
	h["Ratelimit-Policy"] = []string{pol.String()}
	h["Ratelimit"] = []string{state.String()}
}

// openAI sets OpenAI's rate-limit headers (limit, remaining, reset as a
// duration such as 6m0s) from out[i].
func (e *exchange) openAI(h http.Header, i int, limit, remaining, reset string) {
	d := &e.out[i]
	h[limit] = e.rules[i].headers.limitValue(d.Limit)
	h[remaining] = e.rules[i].headers.amount(d.Remaining)
	h[reset] = durationValue(d.ResetAfter)
}

// wholeSeconds holds the header values "0s" … "1h0m0s", shared like
// smallInts': a reset of a second or more is rounded up to whole seconds.
var wholeSeconds = func() (t [3601][]string) {
	for i := range t {
		t[i] = []string{(time.Duration(i) * time.Second).String()}
	}
	return t
}()

// durationValue is a Go-style duration header value (OpenAI's reset
// headers, "6m0s"): whole seconds rounded up from one second on, else
// milliseconds rounded up ("350ms").
func durationValue(d time.Duration) []string {
	if d < time.Second {
		if d <= 0 {
			return wholeSeconds[0]
		}
		return []string{(time.Duration(ceilMillis(d)) * time.Millisecond).String()}
	}
	if s := ceilSeconds(d); s < int64(len(wholeSeconds)) {
		return wholeSeconds[s]
	}
	return []string{(time.Duration(ceilSeconds(d)) * time.Second).String()}
}

// fewest is the applying enforcing rule counting requests (c is
// costRequests) or tokens (otherwise) with the fewest remaining, the first
// in evaluation order among equals; -1 when none applies.
func fewest(x *exchange, c costKind) int {
	best := -1
	for i, ru := range x.rules {
		if ru.action == actShadow || ru.cost.unit() != c.unit() {
			continue
		}
		if best < 0 || x.out[i].Remaining < x.out[best].Remaining {
			best = i
		}
	}
	return best
}

// nextAfter is the RateLimit t parameter: the wait until the request
// would be admitted when refused, else until more quota is available.
func nextAfter(d *limits.Decision) time.Duration {
	if !d.Allowed {
		return d.RetryAfter
	}
	return d.NextAfter
}

// limitValue is X-RateLimit-Limit for an effective limit.
func (rh *ruleHeaders) limitValue(limit int64) []string {
	if limit == rh.rule.Limit {
		return rh.limit
	}
	return rh.amount(limit)
}

// amount is a header value in the rule's unit: a count, or dollars for a
// usd rule (its counters are micro-dollars).
func (rh *ruleHeaders) amount(n int64) []string {
	if rh.cost == costUSD {
		return []string{config.Dollars(n)}
	}
	return intValue(n)
}

// policyValue is the rule's RateLimit-Policy item for a hit's effective
// limit (a tier, an override, FAIL_OPEN=local's share) and, for a
// calendar rule, the length of the decision's period (w).
func (rh *ruleHeaders) policyValue(h *limits.Hit, d *limits.Decision) []string {
	_, burst := h.Limits()
	if d.Limit == rh.rule.Limit && burst == rh.rule.Burst && d.Period == 0 {
		return rh.policy
	}
	return []string{policyItemFor(rh.rule, rh.quoted, d.Limit, burst, rh.cost, d.Period)}
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
