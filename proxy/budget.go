package proxy

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// Token budgets (SPEC §8): a rule whose cost is input_tokens charges the
// request's input estimate at admission; one whose cost is total_tokens
// reserves the estimate plus the requested output, and when the response
// ends the charge is settled to the usage the upstream reported (or, when
// none came, the estimate plus the output text that passed).

// costKind is what a rule counts (SPEC §7.1 cost).
type costKind uint8

const (
	costRequests costKind = iota
	costInput             // input_tokens
	costTotal             // total_tokens
	costUSD               // usd: micro-dollars at the price tables' prices (SPEC §8.1)
)

// metered reports whether the rule counts tokens or money: it needs the
// body, and its charge is read from the response.
func (c costKind) metered() bool { return c != costRequests }

// settles reports whether the rule's charge is settled when the response
// ends.
func (c costKind) settles() bool { return c == costTotal || c == costUSD }

// unit is what a rule's limit counts, for the headers: requests, tokens
// or dollars.
func (c costKind) unit() costKind {
	if c == costTotal {
		return costInput
	}
	return c
}

// The body fields a total_tokens rule reads besides its key parts: the
// output the request asks for (§8), how many choices, whether it streams
// with usage, and whether the Responses API runs it in the background
// (its output is fetched later, past the proxy), and the members that
// refer to input the provider holds (hiddenInput). They are decided
// members: a body that repeats one is refused (SPEC §4.6).
var (
	outputJSON = []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n", "stream", "stream_options.include_usage",
		"background", "previous_response_id", "conversation", "conversation.id", "prompt.id"}
	outputForm = []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n", "stream"}
)

// maxReserve bounds a reservation so that sums never overflow.
const maxReserve = 1 << 50

// budget is one request's token accounting, kept in its exchange.
type budget struct {
	scan    bool          // a token rule admitted the request: its response is read for usage
	settle  bool          // a total_tokens charge was recorded: settle it when the response ends
	strip   bool          // stream_options.include_usage was added upstream: the client does not see that usage
	stream  bool          // the request asked for a stream
	price   *config.Price // the model's price, when a usd rule applies
	settled bool          // done (once)
	unsent  bool          // refused after admission, before leaving for the upstream: nothing is charged
	input   int64         // the input estimate
	model   string
	learn   bool // one answer of one choice: its output teaches OUTPUT_TOKEN_RESERVE = "learned"
	// clampable: 0 not known yet, 1 the body can carry an output cap the
	// proxy writes (output = "clamp"), -1 it cannot.
	clampable int8
	clamped   int64 // the output cap written into the body (0: none)
}

// meteredCost sets the cost of a token or money rule's hit. include is
// false when the rule is left out of the batch (a shadow rule that would
// refuse before deciding); the denial is 400 unpriced_model.
func (x *exchange) meteredCost(ru *rule, h *limits.Hit) (include bool, d *denial) {
	if ru.cost == costUSD {
		c, priced, d := x.usdCost(ru)
		if !priced || d != nil {
			return false, d
		}
		h.Cost = c
		if ru.clamp && x.clampable() {
			x.clampUSD(ru, h)
		}
	} else {
		h.Cost = x.tokenCost(ru.cost)
		if ru.clamp && x.clampable() {
			x.clampTokens(ru, h)
		}
	}
	if x.apiPath != "" && x.est.Stopped {
		// Past MAX_INPUT_TOKENS: the token cap refuses it, and a prompt
		// that never reaches the model is charged nothing; the rule still
		// shows its state.
		h.Cost, h.Clamp = 0, limits.Clamp{}
	}
	return true, nil
}

// hiddenInput names the member of a Responses API request that refers to
// input held by the provider (a previous response, a conversation, a
// stored prompt), which the estimate cannot count; "" when there is none.
func hiddenInput(in *keyInput) string {
	for _, name := range [...]string{"previous_response_id", "conversation", "conversation.id", "prompt.id"} {
		if in.bodyField(name) != "" {
			name, _, _ = strings.Cut(name, ".")
			return name
		}
	}
	return ""
}

// tokenCost is the cost of a token rule's hit: the input estimate, plus
// the requested output for total_tokens.
func (x *exchange) tokenCost(c costKind) int64 {
	cost := int64(x.est.Tokens)
	if c == costTotal {
		cost = min(cost+requestedOutput(&x.keys, x.outputReserve(), int64(x.est.Batch)), maxReserve)
	}
	return cost
}

// outputReserve is the output reserved for this request when it names no
// cap: OUTPUT_TOKEN_RESERVE, or what was learned for its model.
func (x *exchange) outputReserve() int64 {
	c := x.pol.cfg
	if !c.OutputReserveLearned {
		return c.OutputTokenReserve
	}
	return x.p.learner.reserve(x.keys.model, c.OutputTokenReserveMin)
}

// requestedOutput is the output a request may produce: the largest of
// max_tokens, max_completion_tokens and max_output_tokens (else reserve),
// times n choices.
func requestedOutput(in *keyInput, reserve, batch int64) int64 {
	out := int64(0)
	for _, name := range outputJSON[:3] {
		if n, ok := tokenNumber(in.bodyField(name)); ok {
			out = max(out, n)
		}
	}
	if out <= 0 {
		out = reserve
	}
	if n, ok := tokenNumber(in.bodyField("n")); ok && n > 1 {
		out = min(out*min(n, 1<<10), maxReserve) // both < 2^50, 2^10: no overflow
	}
	if batch > 1 {
		out = min(out*min(batch, 1<<10), maxReserve) // each request of a batch may produce it
	}
	return out
}

// bodyField is a JSON body's (else a form's) value of an output field.
func (in *keyInput) bodyField(name string) string {
	if in.fields == nil {
		return ""
	}
	if v := found(in.fields.JSON, in.values.JSON, name); v != "" {
		return v
	}
	return found(in.fields.Form, in.values.Form, name)
}

// tokenNumber reads a token count as sent: a JSON number (or its text in
// a form), rounded up and bounded; false when it is none.
func tokenNumber(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	return int64(min(max(math.Ceil(f), 0), maxReserve)), true
}

// oversized is the first enforcing token hit whose cost alone exceeds its
// limit (a token bucket: its burst): it can never pass (413), whatever
// the wait. -1 when there is none.
func oversized(x *exchange) int {
	for i, ru := range x.rules {
		if !ru.cost.metered() || ru.action == actShadow {
			continue
		}
		if fixedCost(&x.hits[i]) > capacity(&x.hits[i]) {
			return i
		}
	}
	return -1
}

// fixedCost is the part of a hit's cost no wait can lower: all of it,
// but for a clamping hit (SPEC §8.2) its input's, since its output is
// lowered to what remains.
func fixedCost(h *limits.Hit) int64 {
	if h.Clamp.Per > 0 {
		return h.Clamp.Base
	}
	return h.Cost
}

// capacity is the most a hit's rule can ever admit at once: its limit,
// or a token bucket's burst (nothing when its limit is 0).
func capacity(h *limits.Hit) int64 {
	limit, burst := h.Limits()
	if h.Rule.Algorithm == limits.TokenBucket && limit > 0 {
		return burst
	}
	return limit
}

// tooCostly is the 413 input_too_large of a request whose cost on rule i
// alone exceeds what the rule can ever admit (SPEC §8): no wait would
// help. The rate-limit headers show the rules' state from a peek; nothing
// is recorded.
func (x *exchange) tooCostly(i int) *denial {
	x.sizeOut()
	ru, h := x.rules[i], &x.hits[i]
	if _, err := x.p.batch.Peek(x.r.Context(), x.hits, x.start, x.out); err == nil {
		x.observeRules(len(x.rules)) // the peek refuses that hit: counted once
		x.limited, x.show = x.fewestRemaining()
	} else {
		ru.metrics.refused.Inc()
	}
	c, cost := capacity(h), fixedCost(h)
	if ru.cost == costUSD {
		return x.tooLarge(&x.keys.c, ru.lim.Name, codeInputTooLarge,
			"The request's reservation of $"+config.Dollars(cost)+" exceeds the limit of $"+
				config.Dollars(c)+" of rule "+ru.lim.Name+": it can never be admitted.").
			with(field{"denied_by", ru.lim.Name}, field{"limit", dollars(c)}, field{"estimated_cost_usd", dollars(cost)},
				field{"estimated_tokens", x.est.Tokens})
	}
	return x.tooLarge(&x.keys.c, ru.lim.Name, codeInputTooLarge,
		"The request's cost of "+strconv.FormatInt(cost, 10)+" tokens exceeds the limit of "+
			strconv.FormatInt(c, 10)+" of rule "+ru.lim.Name+": it can never be admitted.").
		with(field{"denied_by", ru.lim.Name}, field{"limit", c}, field{"estimated_tokens", cost})
}

// admitted prepares the accounting of a request the token rules admitted:
// its response is read for usage; with a total_tokens charge recorded, the
// charge is settled when the response ends, and an OpenAI streaming request
// that did not ask for usage is made to (the client does not see it).
func (x *exchange) admitted() *denial {
	r, in := x.r, &x.keys
	b := &x.budget
	for i, ru := range x.rules {
		if !ru.cost.metered() || !x.out[i].Allowed {
			continue
		}
		b.scan = true
		if !x.out[i].Ticket.IsZero() {
			if ru.cost != costUSD {
				ru.metrics.tokens.reserved.Add(float64(x.hits[i].Cost))
			}
			b.settle = b.settle || ru.cost.settles()
		}
	}
	if !b.scan {
		return nil
	}
	b.input = int64(x.est.Tokens)
	if b.price == nil { // a usd rule set the model it priced (a batch's members')
		b.model = in.model
	}
	b.stream = truthy(in.bodyField("stream"))
	n, named := tokenNumber(in.bodyField("n"))
	b.learn = x.pol.cfg.OutputReserveLearned && x.est.Batch == 0 && (!named || n <= 1)
	if x.est.Batch > 0 {
		// A batch's answer is an array with no usage of its own: its
		// reservation (every member's output) is its charge.
		b.settle = false
	}
	if truthy(in.bodyField("background")) {
		// A background response answers "queued" at once, with no usage;
		// its output is generated later and fetched past the proxy: the
		// reservation (input and requested output) is its charge.
		b.settle = false
	}
	// The usage is read from the bytes as they pass: they must not be
	// compressed. The client gets the same answer, uncompressed.
	r.Header["Accept-Encoding"] = []string{"identity"}
	if x.body == nil {
		return nil
	}
	sent := x.body.bytes()
	if b.clampable > 0 {
		capped, o, err := x.capOutput(sent)
		if err != nil {
			// Cannot happen (the body was checked before the decision):
			// nothing leaves that could produce more than was reserved.
			b.unsent = true
			return x.invalid("The request body could not carry an output cap: " + err.Error() + ".")
		}
		if o > 0 {
			sent, b.clamped = capped, o
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(sent)), int64(len(sent))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(sent)), nil }
		}
	}
	if !b.settle || (x.format != tokens.FormatChat && x.format != tokens.FormatCompletions) {
		return nil
	}
	if !b.stream || truthy(in.bodyField("stream_options.include_usage")) {
		return nil
	}
	edits, err := tokens.IncludeUsage(sent)
	if err != nil {
		return nil // the output that passes is counted instead
	}
	body, size := tokens.Edited(sent, edits)
	r.Body, r.ContentLength = io.NopCloser(body), size
	r.GetBody = func() (io.ReadCloser, error) { // a retry (SPEC §9) sends the same edited bytes
		body, _ := tokens.Edited(sent, edits)
		return io.NopCloser(body), nil
	}
	b.strip = true
	return nil
}

// exchangeKey carries a request's exchange to the response hook.
type exchangeKey struct{}

// withBudget is r carrying x, when x's response must be read for usage.
func withBudget(x *exchange, r *http.Request) *http.Request {
	if !x.budget.scan {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x))
}

// modifyResponse is the forwarding's response hook: the body of a response
// to a token-budgeted request is wrapped to find the usage it reports as
// it passes, unbuffered (upstream/usage).
func (p *Proxy) modifyResponse(res *http.Response) error {
	x, _ := res.Request.Context().Value(exchangeKey{}).(*exchange)
	if x == nil || !x.budget.scan || x.budget.settled {
		return nil
	}
	b := &x.budget
	if res.StatusCode < 200 {
		return nil // an upgrade (101): no body to read; the estimate is charged when it ends
	}
	if ce := res.Header.Values("Content-Encoding"); len(ce) > 0 && !identityOnly(ce) {
		// Compressed although identity was asked: nothing can be read,
		// so the reservation stands as the charge.
		b.settle = false
		p.settle(x, usage.Result{})
		return nil
	}
	mt, _, _ := strings.Cut(res.Header.Get("Content-Type"), ";")
	// A stream is what the request asked for, whatever the upstream calls
	// it (some send SSE as text/plain or with no type), unless the answer
	// says it is one JSON document.
	mt = strings.ToLower(strings.TrimSpace(mt))
	stream := mt == "text/event-stream" || b.stream && mt != "application/json"
	o := usage.Options{API: usageAPI(x.format), Stream: stream, Strip: b.strip && stream,
		Count: func(text []byte) int { return p.tokens.CountText(b.model, text) }}
	if o.Strip {
		res.Header.Del("Content-Length") // the client gets fewer bytes than the upstream sent
		res.ContentLength = -1
	}
	failed := res.StatusCode < 200 || res.StatusCode > 299
	if failed {
		o.Strip = false // an error answer: no usage to take out
	}
	res.Body = usage.NewReader(res.Body, o, func(u usage.Result) {
		if failed && !u.Reported {
			u.Output = 0 // an error answer returns no output (SPEC §8), whatever its page says
		}
		p.settle(x, u)
	})
	return nil
}

// usageAPI is the response shape of a request format.
func usageAPI(f tokens.Format) usage.API {
	switch f {
	case tokens.FormatChat:
		return usage.OpenAIChat
	case tokens.FormatCompletions:
		return usage.OpenAICompletions
	case tokens.FormatResponses:
		return usage.OpenAIResponses
	case tokens.FormatEmbeddings:
		return usage.OpenAIEmbeddings
	case tokens.FormatMessages:
		return usage.Anthropic
	}
	return usage.Generic
}

// settle settles the request's total_tokens charges, once, to what the
// response reported (SPEC §8): the usage, else the input estimate plus the
// output that passed (nothing for a response that never came). It runs
// when the response body is closed (ReverseProxy always closes it) or,
// without a response, when forwarding returns.
func (p *Proxy) settle(x *exchange, res usage.Result) {
	b := &x.budget
	if b.settled || !b.scan {
		return
	}
	b.settled = true
	actual := b.input + res.Output
	if b.unsent {
		actual = 0 // refused before it left (503 upstream_busy, client gone in the queue)
	}
	if res.Reported {
		actual = res.Usage.Total()
		p.ruleSet.budget.estimateError(b.model, res.Usage.Input-b.input)
		if b.learn && !b.unsent {
			p.learner.learn(b.model, res.Usage.Output, x.pol.cfg.OutputTokenReserveMin)
		}
	}
	var spent int64
	if b.price != nil && !b.unsent {
		spent = settleUSD(b.price, b.input, res)
	}
	if !b.settle {
		// The reservation stands as the charge (a batch, a background
		// response, a compressed answer): that is the spend.
		p.observeSpend(x, -1)
		return
	}
	p.observeSpend(x, spent)
	var buf [maxInlineRules]limits.Settlement
	ss := buf[:0]
	for i, ru := range x.rules {
		t := x.out[i].Ticket
		if !ru.cost.settles() || t.IsZero() {
			continue
		}
		h := &x.hits[i]
		if ru.cost == costUSD {
			ss = append(ss, limits.Settlement{Hit: *h, Ticket: t, Actual: spent})
			continue
		}
		m := &ru.metrics.tokens
		m.settled.Add(float64(actual))
		if actual < h.Cost {
			m.refunded.Add(float64(h.Cost - actual))
		} else {
			m.overrun.Add(float64(actual - h.Cost))
		}
		ss = append(ss, limits.Settlement{Hit: *h, Ticket: t, Actual: actual})
	}
	if len(ss) == 0 {
		return
	}
	// The request may be gone (a client that left): the settlement is not.
	ctx, cancel := context.WithTimeout(context.Background(), max(p.boot.RedisTimeout, 50*time.Millisecond))
	defer cancel()
	if err := p.store.Settle(ctx, ss, p.now()); err != nil {
		p.metrics.storeErrors.Inc()
		p.log.Warn("settling token charges failed", "err", err, "tokens", actual)
	}
}

// truthy reports whether a body field's value reads as true to a lenient
// upstream (pydantic coerces these to True).
func truthy(v string) bool {
	switch strings.ToLower(v) {
	case "true", "1", "yes", "on", "t", "y":
		return true
	}
	return false
}

// countFor is how far an unprotected route's body is counted for the
// applying token rules: past the largest limit any of them can admit at
// once, the cost is refused whatever it is. A usd rule counts it all. -1
// when none applies.
func countFor(cands []*rule) int64 {
	n := int64(-1)
	for _, ru := range cands {
		switch {
		case ru.cost == costUSD:
			// Its limit is dollars, not tokens: count the whole body
			// (bounded by MAX_BODY_BYTES).
			return math.MaxInt32
		case ru.cost.metered():
			n = max(n, ru.maxCost)
		}
	}
	return n
}
