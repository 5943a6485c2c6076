// Package limits decides whether a request may pass a set of rate-limit
// rules. It knows nothing of HTTP: callers describe a request as a batch of
// hits (rule, key, cost) and pass the current time; a store decides the batch
// in one atomic step and answers with one Decision per hit.
package limits

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Algorithm names how a rule counts.
type Algorithm string

// SlidingWindow admits at most Limit cost units in any rolling Window.
const SlidingWindow Algorithm = "sliding_window"

// Rule is the counting policy of one named limit.
type Rule struct {
	Name      string        // unique; names the counters of every key of this rule
	Algorithm Algorithm     // SlidingWindow
	Limit     int64         // cost units admitted per Window; 0 refuses everything
	Window    time.Duration // rolling window, > 0
}

// Validate reports a rule the stores cannot evaluate.
func (r *Rule) Validate() error {
	switch {
	case r.Name == "":
		return errors.New("rule has no name")
	case r.Algorithm != SlidingWindow:
		return errors.New("rule " + r.Name + ": unknown algorithm " + string(r.Algorithm))
	case r.Limit < 0:
		return errors.New("rule " + r.Name + ": negative limit")
	case r.Window <= 0:
		return errors.New("rule " + r.Name + ": window must be positive")
	}
	return nil
}

// Part is one component of a key: what it is taken from and its value, such
// as {"caller", "ip:203.0.113.7"} or {"header:X-Env", "prod"}.
type Part struct {
	Name  string
	Value string
}

// Key identifies the counter a rule keeps for one caller (or issuer, route,
// …). It is built from parts and its string is the public form of SPEC §5:
// name=value for each part, joined by '&', with '%', '&' and '=' and control
// bytes in values percent-escaped so that distinct part lists never collide.
type Key struct{ s string }

// NewKey builds a key from its parts, in order.
func NewKey(parts ...Part) Key {
	var b strings.Builder
	n := 0
	for _, p := range parts {
		n += len(p.Name) + len(p.Value) + 2
	}
	b.Grow(n)
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p.Name)
		b.WriteByte('=')
		writeEscaped(&b, p.Value)
	}
	return Key{s: b.String()}
}

// KeyOf builds the common single-part key without a variadic slice.
func KeyOf(name, value string) Key { return NewKey(Part{Name: name, Value: value}) }

// String is the key's public form (denied_key of SPEC §5).
func (k Key) String() string { return k.s }

// IsZero reports whether k was never built.
func (k Key) IsZero() bool { return k.s == "" }

func writeEscaped(b *strings.Builder, v string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '%' || c == '&' || c == '=' || c < 0x20 || c == 0x7f {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// Hit asks one rule to count one request under one key.
type Hit struct {
	Rule *Rule
	Key  Key
	Cost int64 // units the request consumes; 1 for a request-counting rule
}

// Decision is a rule's answer for one hit. Its fields map onto the
// X-RateLimit-* and RateLimit headers.
type Decision struct {
	Allowed bool // this rule admits the hit (the batch passes only if all do)
	Limit   int64
	// Remaining is what is left in the window after this decision: after
	// recording the hit when the batch was admitted, as it was otherwise.
	Remaining int64
	// RetryAfter is, when Allowed is false, the wait until this hit's cost
	// would be admitted; at least 1 ns. Zero when Allowed.
	RetryAfter time.Duration
	// ResetAfter is the wait until every counted unit has left the window.
	ResetAfter time.Duration
	// NextAfter is the wait until more quota is made available (the oldest
	// counted unit leaves the window); zero when nothing is counted.
	NextAfter time.Duration
}

// ErrBatch reports a malformed batch (no hits, a nil or invalid rule, a
// negative cost). It is a caller's bug, never a store failure.
var ErrBatch = errors.New("limits: invalid batch")

// Store decides batches of hits atomically. Implementations are safe for
// concurrent use.
type Store interface {
	// Decide evaluates hits at now. When every rule admits, all hits are
	// recorded together and allowed is true; otherwise nothing is recorded.
	// out must have len(hits) elements and receives each hit's decision.
	Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (allowed bool, err error)
}

func checkBatch(hits []Hit, out []Decision) error {
	if len(hits) == 0 || len(out) < len(hits) {
		return ErrBatch
	}
	for i := range hits {
		h := &hits[i]
		if h.Rule == nil || h.Cost < 0 || h.Rule.Window <= 0 || h.Rule.Limit < 0 {
			return ErrBatch
		}
	}
	return nil
}
