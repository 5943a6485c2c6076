package upstream

// Reading how long an upstream that answered 429 or 503 wants us to wait
// (SPEC §9), and telling our own caller the same.
//
// Every header read here comes from the upstream, or from whatever sits
// between it and us, so a value may be anything: each parser accepts only
// its documented grammar, saturates instead of overflowing and reports a
// value it cannot read as absent, so that the next source is tried.

import (
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxReset bounds any pause an upstream header can ask for: one broken or
// hostile header must not stop all traffic to the upstream for days.
const MaxReset = time.Hour

// ResetAfter is how long the upstream asks to wait, read from a 429/503
// answer's headers at now; ok is false when no header says.
//
// Sources, first readable one wins:
//  1. retry-after-ms: a decimal number of milliseconds (OpenAI); it is the
//     most precise, which is why OpenAI's SDKs read it first too.
//  2. Retry-After: delta seconds (integer or decimal) or an HTTP-date in any
//     of the three forms http.ParseTime accepts (RFC 9110 §10.2.3).
//  3. The per-limit reset headers (see resetSources): the longest reset
//     among the limits whose remaining header is "0", since those are the
//     limits that refused; when none is known to be exhausted, the longest
//     of all, since any of them may be the one that refused.
//
// A negative value or a past date is 0 with ok true: the reset has passed.
// Every value is capped at MaxReset. Only the first value of a header
// counts (h.Get), surrounding whitespace is ignored.
func ResetAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if d, ok := parseNumber(value(h, "retry-after-ms"), time.Millisecond); ok {
		return d, true
	}
	if d, ok := parseRetryAfter(value(h, "retry-after"), now); ok {
		return d, true
	}
	return resetHeaders(h, now)
}

// SetRetryAfter rewrites h's Retry-After to d in whole seconds and
// retry-after-ms to d in whole milliseconds, both rounded up and at least
// 1: rounding down would send the caller back before the reset, and 0
// would invite an immediate retry. retry-after-ms is set too because
// OpenAI's SDKs read it before Retry-After.
func SetRetryAfter(h http.Header, d time.Duration) {
	h.Set("Retry-After", strconv.FormatInt(ceilDiv(d, time.Second), 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(ceilDiv(d, time.Millisecond), 10))
}

// ceilDiv is d/unit rounded up, at least 1. It rounds by remainder rather
// than by adding unit-1 first, which could overflow near the largest
// Duration.
func ceilDiv(d, unit time.Duration) int64 {
	q := d / unit
	if d%unit > 0 {
		q++
	}
	return max(int64(q), 1)
}

// value is the first value of header name, trimmed. Go's HTTP client trims
// what it reads off the wire, but a header set in code need not be.
func value(h http.Header, name string) string {
	return strings.TrimSpace(h.Get(name))
}

// resetSource is one per-limit reset header, the header telling how much of
// that limit is left, and the reset header's grammar.
type resetSource struct {
	reset, remaining string
	parse            func(v string, now time.Time) (time.Duration, bool)
}

// resetSources are the per-limit reset headers OpenAI (durations) and
// Anthropic (RFC 3339 timestamps) send.
var resetSources = []resetSource{
	{"x-ratelimit-reset-requests", "x-ratelimit-remaining-requests", parseResetDuration},
	{"x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens", parseResetDuration},
	{"anthropic-ratelimit-requests-reset", "anthropic-ratelimit-requests-remaining", parseTimestamp},
	{"anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-tokens-remaining", parseTimestamp},
	{"anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-input-tokens-remaining", parseTimestamp},
	{"anthropic-ratelimit-output-tokens-reset", "anthropic-ratelimit-output-tokens-remaining", parseTimestamp},
}

// resetHeaders picks among the readable per-limit resets: the longest of
// the exhausted limits, else the longest of all. Waiting only for a limit
// that still has room would send the retry into the one that refused.
func resetHeaders(h http.Header, now time.Time) (time.Duration, bool) {
	var longest, exhausted time.Duration
	var found, anyExhausted bool
	for _, s := range resetSources {
		d, ok := s.parse(value(h, s.reset), now)
		if !ok {
			continue
		}
		longest, found = max(longest, d), true
		if value(h, s.remaining) == "0" {
			exhausted, anyExhausted = max(exhausted, d), true
		}
	}
	if anyExhausted {
		return exhausted, true
	}
	return longest, found
}

// parseRetryAfter reads Retry-After: delta seconds, or an HTTP-date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if d, ok := parseNumber(v, time.Second); ok {
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return until(t, now), true
}

// parseTimestamp reads an RFC 3339 timestamp (Anthropic's resets).
func parseTimestamp(v string, now time.Time) (time.Duration, bool) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, false
	}
	return until(t, now), true
}

// until is the wait from now to t, between 0 (t has passed) and MaxReset.
// Time.Sub saturates, so a date centuries away cannot overflow.
func until(t, now time.Time) time.Duration {
	return min(max(t.Sub(now), 0), MaxReset)
}

// parseNumber reads an optionally negative decimal number of units. A
// negative wait means the reset has passed, hence 0 and not an error.
func parseNumber(v string, unit time.Duration) (time.Duration, bool) {
	s, neg := strings.CutPrefix(v, "-")
	d, ok := scale(s, unit)
	if neg && ok {
		return 0, true
	}
	return d, ok
}

// resetUnits are the units parseResetDuration knows: Go's (OpenAI formats
// its resets with Go's Duration.String) plus days. "ms" precedes "m" so
// that the longer unit is matched first.
var resetUnits = []struct {
	name string
	unit time.Duration
}{
	{"ns", time.Nanosecond},
	{"us", time.Microsecond},
	{"µs", time.Microsecond}, // U+00B5 micro sign, what Duration.String writes
	{"μs", time.Microsecond}, // U+03BC Greek mu
	{"ms", time.Millisecond},
	{"s", time.Second},
	{"m", time.Minute},
	{"h", time.Hour},
	{"d", 24 * time.Hour},
}

// parseResetDuration reads OpenAI's reset durations ("1s", "6m0s", "20ms",
// "1h2m3.5s", "2d3h"), or a plain number of seconds, which some
// OpenAI-compatible servers send. time.ParseDuration is not used because it
// knows no days and fails on overflow rather than saturating.
func parseResetDuration(v string, _ time.Time) (time.Duration, bool) {
	if d, ok := parseNumber(v, time.Second); ok {
		return d, true
	}
	s, neg := strings.CutPrefix(v, "-")
	if s == "" {
		return 0, false
	}
	var total time.Duration
	for s != "" {
		n := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		if n <= 0 {
			return 0, false // no number, or a number without a unit
		}
		size, unit := unitPrefix(s[n:])
		if size == 0 {
			return 0, false
		}
		d, ok := scale(s[:n], unit)
		if !ok {
			return 0, false
		}
		// Each term is at most MaxReset, so the sum cannot overflow.
		total = min(total+d, MaxReset)
		s = s[n+size:]
	}
	if neg {
		return 0, true
	}
	return total, true
}

// unitPrefix is the length and value of the unit s starts with; size 0 when
// none.
func unitPrefix(s string) (size int, unit time.Duration) {
	for _, u := range resetUnits {
		if strings.HasPrefix(s, u.name) {
			return len(u.name), u.unit
		}
	}
	return 0, 0
}

// scale is the unsigned decimal s (digits, optionally a '.' and more
// digits; at least one digit) times unit, rounded up to the nanosecond and
// capped at MaxReset. Exponents, signs, hex, NaN and Inf are refused.
// Integer arithmetic keeps it exact: with floats "1.2" seconds could come
// out a nanosecond over, and SetRetryAfter would then say 1201 ms.
func scale(s string, unit time.Duration) (time.Duration, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" || !digits(whole) || !digits(frac) {
		return 0, false
	}
	limit := uint64(MaxReset / unit) // whole units that fit under the cap
	var w uint64
	for _, c := range []byte(whole) {
		w = w*10 + uint64(c-'0') // w ≤ limit ≤ 3.6e12 here, so this cannot overflow
		if w > limit {
			return MaxReset, true
		}
	}
	// w×unit ≤ MaxReset and the fraction adds less than one unit (≤ a day).
	return min(time.Duration(w)*unit+fraction(frac, unit), MaxReset), true
}

// fraction is 0.frac × unit rounded up to the nanosecond, computed as
// num×unit/den in 128 bits. Eighteen digits keep num and den within
// uint64; any nonzero digit past them still rounds up.
func fraction(frac string, unit time.Duration) time.Duration {
	num, den, rest := uint64(0), uint64(1), false
	for _, c := range []byte(frac) {
		if den < 1e18 {
			num, den = num*10+uint64(c-'0'), den*10
		} else if c != '0' {
			rest = true
		}
	}
	hi, lo := bits.Mul64(num, uint64(unit))
	q, r := bits.Div64(hi, lo, den) // num < den, so the quotient fits: no panic
	if r != 0 || rest {
		q++
	}
	return time.Duration(q)
}

// digits reports whether s is only ASCII digits (true for "").
func digits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
