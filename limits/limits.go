// Package limits decides whether a request may pass a set of rate-limit
// rules. It knows nothing of HTTP: callers describe a request as a batch of
// hits (rule, key, cost, and the limits in force for that key) and pass the
// current time; a store decides the batch in one atomic step and answers
// with one Decision per hit.
//
// A rule counts with a sliding window (at most Limit units in any rolling
// Window), a token bucket (Burst tokens that refill at Limit per Window) or
// a calendar quota (at most Limit units per day, ISO week or month, from
// midnight in the rule's time zone). A concurrency rule counts requests in
// flight instead: its places are held by Places, which WithPlaces joins to
// a store so that a batch mixing both is still decided all-or-nothing.
// The batch is admitted when every enforcing hit admits; a shadow hit never
// vetoes it and is recorded only when it fits. A refused batch records
// nothing. Stores also Peek (the same evaluation, recording nothing) and
// Reset a key's counters. Memory keeps the counters in process, Redis
// shares them between instances; Remember and Fallback wrap either.
//
// A cost known only when the response ends (token budgets, SPEC §8) is
// reserved at admission and settled later: each recorded hit's Decision
// carries a Ticket, and Settle corrects that hit's charge to what it
// really cost, giving the difference back to the slot (or bucket) it was
// taken from or charging the extra at the time of the settlement, without
// a second decision.
package limits

import (
	"context"
	"errors"
	"math"
	"strings"
	"time"
)

// Algorithm names how a rule counts.
type Algorithm string

const (
	// SlidingWindow admits at most Limit cost units in any rolling Window.
	SlidingWindow Algorithm = "sliding_window"
	// TokenBucket keeps a bucket of Burst tokens, full at first, refilled
	// continuously at Limit per Window and never above Burst; a hit is
	// admitted when the bucket holds its cost, which it then takes.
	TokenBucket Algorithm = "token_bucket"
	// Calendar admits at most Limit cost units in each calendar Period
	// (a day, an ISO week, a month) that starts at midnight in Location;
	// the count starts again from zero at every boundary.
	Calendar Algorithm = "calendar"
	// Concurrency admits at most Limit requests of a key in flight at
	// once: a place is taken at admission and released when the request
	// ends (Places); Window is not used and every hit costs 1.
	Concurrency Algorithm = "concurrency"
)

// Rule is the counting policy of one named limit.
type Rule struct {
	Name      string        // unique; names the counters of every key of this rule
	Algorithm Algorithm     // SlidingWindow, TokenBucket, Calendar or Concurrency
	Limit     int64         // cost units admitted (TokenBucket: refilled) per Window (Calendar: Period); 0 refuses everything
	Window    time.Duration // > 0; a Calendar rule ignores it
	// Period and Location are a Calendar rule's: the period counted and
	// the zone whose midnight starts it (UTC when nil).
	Period   Period
	Location *time.Location
	// Burst is a TokenBucket's capacity (>= 0), set by the caller; a
	// SlidingWindow ignores it.
	Burst int64
	// Shadow makes the rule count and report without ever refusing: its
	// hits do not veto a batch, and are recorded only when they fit.
	Shadow bool
	// Settles says that charges of this rule are settled later
	// (total_tokens, usd): a refusal under it is remembered at most 1 s,
	// since a refund can shorten the wait (SPEC §4.2).
	Settles bool
}

// Validate reports a rule the stores cannot evaluate.
func (r *Rule) Validate() error {
	switch {
	case r.Name == "":
		return errors.New("rule has no name")
	case r.Algorithm != SlidingWindow && r.Algorithm != TokenBucket && r.Algorithm != Calendar && r.Algorithm != Concurrency:
		return errors.New("rule " + r.Name + ": unknown algorithm " + string(r.Algorithm))
	case r.Algorithm == Calendar && (r.Period < Day || r.Period > Month):
		return errors.New("rule " + r.Name + ": a calendar rule's period is a day, a week or a month")
	case r.Limit < 0:
		return errors.New("rule " + r.Name + ": negative limit")
	case r.Burst < 0:
		return errors.New("rule " + r.Name + ": negative burst")
	case r.Window < time.Microsecond && r.Algorithm != Calendar && r.Algorithm != Concurrency:
		return errors.New("rule " + r.Name + ": window must be at least 1µs")
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

// ParseKey reads a key's public form back, as an operator copies it from
// a 429's denied_key or a log line: name=value parts joined by '&'. Values
// may be percent-escaped as String writes them or left as they are (an
// '&' inside a value must be written %26); the key comes back in
// String's canonical form.
func ParseKey(s string) (Key, error) {
	parts, err := ParseKeyParts(s)
	if err != nil {
		return Key{}, err
	}
	return NewKey(parts...), nil
}

// ParseKeyParts reads a key's public form into its parts, as ParseKey.
func ParseKeyParts(s string) ([]Part, error) {
	if s == "" {
		return nil, errors.New("empty key")
	}
	var parts []Part
	for _, seg := range strings.Split(s, "&") {
		name, value, ok := strings.Cut(seg, "=")
		if !ok || name == "" {
			return nil, errors.New("each part of a key is name=value, parts joined by &")
		}
		v, err := unescape(value)
		if err != nil {
			return nil, err
		}
		parts = append(parts, Part{Name: name, Value: v})
	}
	return parts, nil
}

// PartNames are the names of the key's parts, in order.
func (k Key) PartNames() []string {
	var names []string
	for _, seg := range strings.Split(k.s, "&") {
		name, _, _ := strings.Cut(seg, "=")
		names = append(names, name)
	}
	return names
}

func unescape(v string) (string, error) {
	if !strings.Contains(v, "%") {
		return v, nil
	}
	b := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			b = append(b, v[i])
			continue
		}
		if i+2 >= len(v) || unhex(v[i+1]) < 0 || unhex(v[i+2]) < 0 {
			return "", errors.New("a % in a key value starts an escape of two hex digits (%25 for % itself)")
		}
		b = append(b, byte(unhex(v[i+1])<<4|unhex(v[i+2])))
		i += 2
	}
	return string(b), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
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
	// Own makes Limit and Burst this hit's effective limit and capacity
	// (a plan's tier, a per-key override) instead of the rule's.
	Own   bool
	Limit int64
	Burst int64
	// Clamp, when its Per is > 0 on an enforcing hit, lets the store lower
	// Cost to what the key has left (output = "clamp", SPEC §8.2).
	Clamp Clamp
}

// Clamp describes a hit whose cost is a base plus a price per output
// token, for an output the store may lower to fit what remains: Cost is
// Base + ⌈Max·Per⌉. When some clamping hit of a batch does not have that
// much left, the batch's output is lowered to the largest o ≤ Max with
// Base + ⌈o·Per⌉ within what remains on every clamping hit (the smallest
// remaining wins), and every clamping hit is charged Base + ⌈o·Per⌉ —
// in the same atomic step as the decision, so no other batch can take
// what was counted as remaining. An o below Min is not lowered to: the
// batch is decided at its full cost (and refused). An admitted batch
// whose output was lowered has its clamping hits' Cost set to what was
// charged (Decide only; Peek leaves hits alone) and their Decision's
// Output set to o.
type Clamp struct {
	Base int64   // the cost of no output at all (the input's)
	Per  float64 // the cost of one output token (> 0 to clamp)
	Max  int64   // the output asked for
	Min  int64   // the smallest output it may be lowered to (≥ 1)
}

// cost is the hit's cost for an output of o.
func (c *Clamp) cost(o int64) int64 { return c.Base + int64(math.Ceil(float64(o)*c.Per)) }

// fits is the largest output within avail (at most max), computed with
// the same float operations redis.lua uses; below 0 when none fits.
func (c *Clamp) fits(avail, max int64) int64 {
	q := math.Floor(float64(avail-c.Base) / c.Per)
	if q >= float64(max) {
		return max
	}
	if q < -1 {
		return -1
	}
	o := int64(q)
	for n := 0; o >= 0 && c.cost(o) > avail; n++ {
		if n == 2 {
			return -1 // rounding cannot be this far off: refuse rather than overshoot
		}
		o--
	}
	return o
}

// clamps reports whether h may be lowered by its Clamp.
func (h *Hit) clamps() bool { return h.Clamp.Per > 0 && !h.Rule.Shadow }

// clampBounds are the batch's output bounds: the smallest Max and largest
// Min of its clamping hits; ok false when none clamps.
func clampBounds(hits []Hit) (maxOut, minOut int64, ok bool) {
	for i := range hits {
		if !hits[i].clamps() {
			continue
		}
		c := &hits[i].Clamp
		if !ok || c.Max < maxOut {
			maxOut = c.Max
		}
		minOut = max(minOut, c.Min, 1)
		ok = true
	}
	return maxOut, minOut, ok
}

// clampOutput is the batch's output given what remains on each hit
// (avail(i), for the clamping hits), and whether it is lowered (below
// the asked-for output and at least the minimum).
func clampOutput(hits []Hit, avail func(i int) int64) (o int64, lowered bool) {
	maxOut, minOut, ok := clampBounds(hits)
	if !ok {
		return 0, false
	}
	o = maxOut
	for i := range hits {
		if hits[i].clamps() {
			o = min(o, hits[i].Clamp.fits(avail(i), maxOut))
		}
	}
	return o, o < maxOut && o >= minOut
}

// Limits returns the hit's effective limit and burst: its own when Own,
// else its rule's.
func (h *Hit) Limits() (limit, burst int64) {
	if h.Own {
		return h.Limit, h.Burst
	}
	return h.Rule.Limit, h.Rule.Burst
}

// Decision is a rule's answer for one hit. Its fields map onto the
// X-RateLimit-* and RateLimit headers.
type Decision struct {
	// Allowed says this rule admits the hit; the batch passes only if
	// every enforcing (non-shadow) hit does. For a shadow hit it says
	// whether the hit would have been admitted. A hit of cost 0 is always
	// admitted: it takes nothing.
	Allowed bool
	Limit   int64 // the hit's effective limit
	// Remaining is what is left after this decision: after recording the
	// hit when it was recorded, as it was otherwise. For a token bucket,
	// the tokens it holds rounded down (0 when the limit is 0). Never
	// negative, though a settled charge may take a counter past its limit.
	Remaining int64
	// RetryAfter is, when Allowed is false, the wait until this hit's cost
	// would be admitted (the whole window when it never can: a cost above
	// the limit or the burst, a limit of 0); at least 1 ns. Zero when
	// Allowed.
	RetryAfter time.Duration
	// ResetAfter is the wait until the key is back to its fresh state:
	// every counted unit has left the window, or the bucket is full.
	ResetAfter time.Duration
	// NextAfter is the wait until Remaining grows: the oldest counted unit
	// leaves the window, or the bucket gains a whole token; zero when
	// nothing is counted (a full bucket).
	NextAfter time.Duration
	// Period is, for a Calendar rule, the length of the period the
	// decision was made in (a day of 23, 24 or 25 hours, a week, a
	// month); zero for the other algorithms.
	Period time.Duration
	// Ticket is what Decide recorded for this hit, for Settle (zero when
	// nothing was).
	Ticket Ticket
	// Output is, for an admitted clamping hit (Hit.Clamp), the output
	// its charge covers: Clamp.Max, or less when it was lowered to fit.
	Output int64
	// pending is set on a refusal that may not last: its counter holds a
	// charge that a split batch on a Redis Cluster may still roll back
	// (Remember does not remember it).
	pending bool
}

// Ticket names what Decide recorded for one hit, for Settle: the slot of a
// window admission, a bucket's take, and which store recorded it
// (Fallback). The zero Ticket: nothing was recorded (a refusal, a Peek, a
// cost of 0, a shadow hit that did not fit).
type Ticket struct {
	// at is when a window admission was counted (Memory: unix ns, Redis:
	// unix µs); a settlement gives nothing back once it has left the window.
	// For a calendar admission, the start of its period (unix s): a
	// settlement lands only in that period, never in a later one.
	at int64
	// rec is what redis.lua recorded: for a window the time it was
	// counted at (µs, as at: its slot is the first at or after it), 1 for
	// a bucket, the period's start (unix s) for a calendar counter.
	rec int64
	// gen is the generation of Memory's counter: a counter reset or
	// restarted since is another one.
	gen   uint32
	set   bool
	local bool // decided by Fallback's local store
}

// IsZero reports whether nothing was recorded.
func (t Ticket) IsZero() bool { return !t.set }

// Settlement corrects the charge of one admitted hit.
type Settlement struct {
	Hit    Hit    // the hit as decided: rule, key, effective limits; Hit.Cost is what was charged
	Ticket Ticket // the Ticket of its Decision
	Actual int64  // what it should have cost, >= 0
}

// ErrBatch reports a malformed batch (no hits, a nil or invalid rule, a
// negative cost, limit or burst). It is a caller's bug, never a store
// failure.
var ErrBatch = errors.New("limits: invalid batch")

// Store decides batches of hits atomically. Implementations are safe for
// concurrent use. A batch names each (rule, key) at most once.
type Store interface {
	// Decide evaluates hits at now. When every enforcing (non-shadow) hit
	// admits, allowed is true and the hits are recorded together: every
	// enforcing hit, and each shadow hit that fits. Otherwise nothing is
	// recorded. out must have len(hits) elements and receives each hit's
	// decision.
	Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (allowed bool, err error)
	// Peek evaluates hits at now exactly as Decide would (same costs, same
	// answers in out and allowed) but records nothing. A hit of cost 0
	// reads its key's state.
	Peek(ctx context.Context, hits []Hit, now time.Time, out []Decision) (allowed bool, err error)
	// Reset forgets the counters of key under rule (both algorithms').
	Reset(ctx context.Context, rule *Rule, key Key) error
	// Settle corrects charges of hits admitted by earlier Decides, at now:
	// a hit charged more than Actual gets the difference back (a window:
	// taken out of the slot its admission was counted in, when that slot
	// is still in the window, never more than the slot holds; a bucket:
	// tokens given back, never above its burst); a hit charged less is
	// charged the difference at now, without a decision: it may take the
	// counter past its limit (a budget is overshot only by what the
	// reservation did not cover). Settlements with a zero Ticket or with
	// Actual == Hit.Cost are skipped. It never refuses; an error means
	// some corrections may not have been made.
	Settle(ctx context.Context, s []Settlement, now time.Time) error
}

// checkHit reports a hit no store can evaluate.
func checkHit(h *Hit) error {
	if h.Rule == nil || h.Cost < 0 {
		return ErrBatch
	}
	switch h.Rule.Algorithm {
	case SlidingWindow, TokenBucket:
		if h.Rule.Window < time.Microsecond {
			return ErrBatch
		}
	case Calendar:
		if h.Rule.Period < Day || h.Rule.Period > Month {
			return ErrBatch
		}
	default:
		return ErrBatch
	}
	if limit, burst := h.Limits(); limit < 0 || burst < 0 {
		return ErrBatch
	}
	if c := &h.Clamp; c.Per != 0 && (!(c.Per > 0) || math.IsInf(c.Per, 1) || c.Base < 0 || c.Max < 0) {
		return ErrBatch
	}
	return nil
}

// checkSettlements reports a malformed settlement (its hit malformed, a
// negative Actual).
func checkSettlements(s []Settlement) error {
	for i := range s {
		if err := checkHit(&s[i].Hit); err != nil || s[i].Actual < 0 {
			return ErrBatch
		}
	}
	return nil
}

// needsSettling reports whether x corrects anything.
func (x *Settlement) needsSettling() bool { return !x.Ticket.IsZero() && x.Actual != x.Hit.Cost }

func checkBatch(hits []Hit, out []Decision) error {
	if len(hits) == 0 || len(out) < len(hits) {
		return ErrBatch
	}
	for i := range hits {
		if err := checkHit(&hits[i]); err != nil {
			return err
		}
	}
	return nil
}
