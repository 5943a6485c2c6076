package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// exchange is one request's pass through the proxy, and everything the
// guard chain knows of it: the policy it started under, the caller and
// the key parts read, the applying rules and their batch, the body, the
// token reservations. Each guard is a method of it that returns a denial
// or nil (chain below); x.deny alone answers a denial.
//
// It also wraps the ResponseWriter once, remembers the status for the
// metrics, and stamps the rate-limit headers on whatever response goes out
// (the upstream's, a 429, or the proxy's own errors after the limiter),
// replacing any the upstream sent under the same names (writer.go).
// Exchanges are pooled; none outlives ServeHTTP.
type exchange struct {
	http.ResponseWriter
	p           *Proxy
	r           *http.Request // the request as it arrived (its body replaced by the spooled copy once read)
	start       time.Time     // when it arrived, by the proxy's clock
	status      int
	written     int64     // response body bytes written to the client
	forwarded   bool      // sent to the upstream
	decision    string    // metrics label; set by the guard, refined on forwarding errors
	forwardedAt time.Time // zero until the request leaves for the upstream
	route       *routeMetrics
	drain       io.LimitedReader // discardUnread's reader, kept here so a refusal allocates none
	routeName   string           // the PROTECTED_PATHS entry matched, or routeUnprotected
	apiPath     string           // protected: the canonical path that matched (error envelope, credential order)
	protected   bool             // the path is a PROTECTED_PATHS entry's
	format      tokens.Format
	body        *spooled // the buffered body of a protected request
	bodyRead    bool     // the body was read while held: body, or bodyErr
	bodyErr     error
	heldRead    *heldRead      // the body being read while a delay rule holds the request
	ticket      *gate.Ticket   // the upstream group's slot, released as ServeHTTP returns
	placed      []limits.Place // the concurrency rules' places taken, released as ServeHTTP returns
	placeBuf    [maxInlineRules]limits.Place
	now         func() time.Time
	pol         *policy // the configuration this request started under

	// cands are the rules whose paths and methods match; bodyRules says
	// one of them reads the body (the batch is then decided after it).
	cands     []*rule
	bodyRules bool

	// The rate-limit batch: hits[i] was decided by rules[i] as out[i].
	// limited says an enforcing rule decided: stamp the headers, with
	// X-RateLimit-* from out[show].
	limited bool
	show    int
	refused bool // a 429: X-RateLimit-Remaining is 0 whatever rule it describes
	hits    []limits.Hit
	out     []limits.Decision
	rules   []*rule
	heldBy  *rule           // the first refusing rule when a delay rule held the request
	keys    keyInput        // what key parts are read from; keys.c is the caller
	est     tokens.Estimate // the token count of a protected body
	budget  budget          // token accounting (SPEC §8)
	den     denial          // the answer of the step that refused, when one did
	sig     refusalSig      // a 429's signature (refusal.go)
	candBuf [maxInlineRules]*rule
	hitBuf  [maxInlineRules]limits.Hit
	outBuf  [maxInlineRules]limits.Decision
	ruleBuf [maxInlineRules]*rule
}

// step is one guard of the chain: nil lets the request go on, a denial
// ends it (x.deny answers it).
type step func(*exchange) *denial

// The guard chain of SPEC §4 and §7.3, as data. Each step knows when it
// does not apply (no hits to decide, an unprotected route's body or cap)
// and passes.
//
// Without an applying rule that reads the body, the batch is decided
// before the body is read, as in the first release: identify (401), the
// rules' hits (400 missing_key), decide (429, or a hold for delay rules),
// read the body (415, 413, 400) and count its tokens, the token cap (413).
//
// With one, a caller already over a rule that needs no body is refused
// before its body is read (peek: nothing recorded, the token rules' state
// read for the headers of its 429); the body is read with the body key
// parts in the same pass, then the rules that need it get their hits, and
// the whole batch is decided.
var (
	decideFirst = [...]step{(*exchange).identify, (*exchange).addHits, (*exchange).decide,
		(*exchange).readBody, (*exchange).tokenCap}
	bodyFirst = [...]step{(*exchange).identify, (*exchange).addHits, (*exchange).peek,
		(*exchange).readBody, (*exchange).addBodyHits, (*exchange).decide, (*exchange).tokenCap}
)

// guard runs the chain on a request that is protected or that a rule
// applies to, and returns the denial of the step that refused it, if one
// did.
func (x *exchange) guard() *denial {
	chain := decideFirst[:]
	if x.bodyRules {
		chain = bodyFirst[:]
	}
	for _, s := range chain {
		if d := s(x); d != nil {
			return d
		}
	}
	return nil
}

// denial is a refused request's answer, with its log line and its
// counter: a step fills x.den (x.refuse) and returns it; x.deny writes it.
type denial struct {
	decision string   // the requests metric's decision label
	e        apiError // status 0: no answer (the client left)
	headers  [3]struct {
		name  string // canonical: set by direct map assignment
		value []string
	}
	nh int
	// A 429 is written from its prepared answer (refusal.go): prepared
	// when one was ready, made from this denial otherwise (prepare).
	prepared *prepared
	sig      *refusalSig        // what keeps it; nil: not kept
	first    int                // the first refusing hit
	retryMs  int64              // its Retry-After-Ms
	count    prometheus.Counter // a rule's counter of this refusal; nil none
	level    slog.Level
	msg      string // the log line, "" none
	log      []any  // its attributes
}

// refuse makes x's denial: decision for the metrics, answered with status,
// code and message.
func (x *exchange) refuse(decision string, status int, code, message string) *denial {
	x.den = denial{decision: decision, e: apiError{status: status, code: code, message: message}, level: slog.LevelInfo}
	return &x.den
}

// gone is the denial of a request whose client left: nothing is answered.
func (x *exchange) gone() *denial {
	x.den = denial{decision: decClientClosed}
	return &x.den
}

// with adds top-level members to the error body.
func (d *denial) with(fields ...field) *denial {
	d.e.fields = fields
	return d
}

// header sets a header of the answer (name canonical).
func (d *denial) header(name string, value []string) *denial {
	d.headers[d.nh].name, d.headers[d.nh].value = name, value
	d.nh++
	return d
}

// logged sets the denial's log line: "request denied" with args.
func (d *denial) logged(args ...any) *denial {
	d.msg, d.log = "request denied", args
	return d
}

// counted names the rule counter the denial adds one to.
func (d *denial) counted(c prometheus.Counter) *denial {
	d.count = c
	return d
}

// deny answers d: its decision for the requests metric, its counter, its
// log line, its headers and its JSON error body. Every refusal of the
// guards, of the upstream group and of the forwarding is written here.
func (x *exchange) deny(d *denial) {
	x.decision = d.decision
	if d.count != nil {
		d.count.Inc()
	}
	if d.msg != "" {
		x.p.log.Log(context.Background(), d.level, d.msg, d.log...)
	}
	if d.e.status == 0 {
		return
	}
	if d.e.status == http.StatusTooManyRequests {
		if d.prepared == nil {
			d.prepared = x.prepare(d, d.first, d.sig)
		}
		x.writePrepared(d)
		return
	}
	h := x.Header()
	for _, kv := range d.headers[:d.nh] {
		h[kv.name] = kv.value
	}
	x.p.writeError(x, x.r, &d.e)
}
