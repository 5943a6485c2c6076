package proxy

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// identify is the chain's first step (SPEC §4.1): the caller, 401 on a
// protected route with REQUIRE_AUTH and no credential; then what the key
// parts are read from.
func (x *exchange) identify() *denial {
	r, pol := x.r, x.pol
	c := pol.identify(r, anthropicPath(x.apiPath))
	if x.protected && pol.cfg.RequireAuth && !c.hasCred {
		d := x.refuse(decUnauthorized, http.StatusUnauthorized, codeUnauthorized,
			"An API key is required: send Authorization: Bearer <key>, X-API-Key or api-key.")
		if c.refused != "" {
			d.e.message = "The bearer token is not a valid JWT: " + c.refused + "."
			d.logged("rule", "require_auth", "key", "caller="+c.logged(), "jwt", c.refused, "path", r.URL.Path)
		} else {
			d.logged("rule", "require_auth", "key", "caller="+c.logged(), "path", r.URL.Path)
		}
		return d.header("Www-Authenticate", []string{"Bearer"})
	}
	in := &x.keys
	*in = keyInput{r: r, p: x.p, pol: pol, c: c, path: x.apiPath}
	if in.path == "" {
		in.path = canonicalPath(r.URL.Path)
	}
	in.plan = pol.planOf(r, &c)
	x.hits, x.out, x.rules = x.hitBuf[:0], x.outBuf[:0], x.ruleBuf[:0]
	return nil
}

// addHits adds the hits of the applying rules that need no body.
func (x *exchange) addHits() *denial {
	for _, ru := range x.cands {
		if !ru.needsBody {
			if d := x.addHit(ru); d != nil {
				return d
			}
		}
	}
	return nil
}

// addBodyHits adds the hits of the applying rules that need the body,
// once it has been read.
func (x *exchange) addBodyHits() *denial {
	for _, ru := range x.cands {
		if ru.needsBody {
			if d := x.addHit(ru); d != nil {
				return d
			}
		}
	}
	return nil
}

// peek refuses, before its body is read, a caller already over a rule
// that needs no body: the batch so far is peeked (nothing recorded), with
// the token rules' state for the headers of the 429.
func (x *exchange) peek() *denial {
	n := len(x.hits)
	if n == 0 {
		return nil
	}
	x.addShownHits()
	x.sizeOut()
	ok, err := x.p.batch.Peek(x.r.Context(), x.hits, x.start, x.out)
	ok = ok || shownOnly(x, n)
	var d *denial
	switch {
	case err != nil:
		x.hits, x.rules = x.hits[:n], x.rules[:n]
		d = x.storeFailed(err)
	case !ok && !x.holdable(0):
		x.observeRules(n) // the rules decided: counted as a decision would be
		return x.rateLimited()
	}
	x.hits, x.rules = x.hits[:n], x.rules[:n]
	return d
}

// addHit adds the rule's hit to the batch when the rule applies: its
// `when` conditions hold and its key can be built (a missing part skips
// the rule, or answers 400 missing_key with on_missing_key = "reject").
// The effective limit is the plan's tier, then the key's override; an
// "unlimited" one leaves the rule out.
func (x *exchange) addHit(ru *rule) *denial {
	in, r := &x.keys, x.r
	if !in.conditionsHold(ru) {
		if in.err != nil {
			return x.invalid("The request is ambiguous: " + in.err.Error() + ".")
		}
		return nil
	}
	key, missing, ok := in.key(ru)
	if in.err != nil {
		return x.invalid("The request is ambiguous: " + in.err.Error() + ".")
	}
	if !ok {
		if !ru.reject {
			return nil
		}
		return x.refuse(decInvalid, http.StatusBadRequest, codeMissingKey,
			"The request lacks "+missing+", which rule "+ru.lim.Name+" counts by.").
			with(field{"rule", ru.lim.Name}, field{"key_part", missing}).
			counted(ru.metrics.missing).
			logged("rule", ru.lim.Name, "reason", "missing_key", "key_part", missing, "path", r.URL.Path)
	}
	h := limits.Hit{Rule: ru.lim, Key: key, Cost: 1}
	if eff, own := ru.effective(in.plan, key); own {
		if eff.unlimited {
			return nil // before pricing: an unlimited key is never refused for it (hidden input, unpriced model)
		}
		h.Own, h.Limit, h.Burst = true, eff.limit, eff.limit
		if ru.burstSet {
			h.Burst = ru.lim.Burst
		}
	}
	if ru.cost.settles() {
		if name := hiddenInput(in); name != "" {
			// Input the proxy cannot see cannot be reserved: the budget
			// would be overshot by it.
			if ru.action == actShadow {
				x.shadowWouldRefuse(ru, "hidden_input")
				return nil
			}
			return x.invalid("The request's "+name+" refers to input held by the provider, which a usd/total_tokens budget ("+
				ru.lim.Name+") cannot reserve; send the input itself.").
				counted(ru.metrics.refused).
				logged("rule", ru.lim.Name, "reason", "hidden_input", "member", name, "path", r.URL.Path)
		}
	}
	if ru.cost.metered() {
		include, d := x.meteredCost(ru, &h)
		if d != nil || !include {
			return d
		}
	}
	x.hits = append(x.hits, h)
	x.rules = append(x.rules, ru)
	return nil
}

// addShownHits adds to the batch, for the headers of a 429 answered
// before the body is read (SPEC §8: every answer a token rule applies to
// carries its headers), the applying token and money rules whose key and
// conditions need no body, at cost 0: their state is read, nothing of
// theirs is decided. A rule that cannot be placed so (an ambiguous part,
// a missing key, an unlimited key) is left to the decision after the body.
func (x *exchange) addShownHits() {
	in := &x.keys
	for _, ru := range x.cands {
		if !ru.cost.metered() || ru.keyBody || ru.action == actShadow {
			continue
		}
		hold := in.err
		key, _, ok := in.key(ru)
		ok = ok && in.conditionsHold(ru) && in.err == nil
		in.err = hold // found again, and answered, when the rule is added for real
		if !ok {
			continue
		}
		h := limits.Hit{Rule: ru.lim, Key: key}
		if eff, own := ru.effective(in.plan, key); own {
			if eff.unlimited {
				continue
			}
			h.Own, h.Limit, h.Burst = true, eff.limit, eff.limit
			if ru.burstSet {
				h.Burst = ru.lim.Burst
			}
		}
		x.hits = append(x.hits, h)
		x.rules = append(x.rules, ru)
	}
}

// shownOnly marks the hits from n on (addShownHits') as admitting, since
// they decide nothing, and reports whether the hits before n admit.
func shownOnly(x *exchange, n int) bool {
	for i := n; i < len(x.out); i++ {
		x.out[i].Allowed, x.out[i].RetryAfter = true, 0
	}
	for i, ru := range x.rules[:n] {
		if !x.out[i].Allowed && ru.action != actShadow {
			return false
		}
	}
	return true
}

// decide decides the batch, all-or-nothing, holding the request while
// delay rules allow it (SPEC §7.3): 429 when refused. Nothing to decide
// passes.
func (x *exchange) decide() *denial {
	if len(x.hits) == 0 {
		return nil
	}
	if i := oversized(x); i >= 0 {
		return x.tooCostly(i)
	}
	p, r := x.p, x.r
	now := x.start
	held := false
	for {
		x.sizeOut()
		allowed, err := p.batch.Decide(r.Context(), x.hits, now, x.out)
		if err != nil {
			if held && r.Context().Err() != nil {
				return x.leftWhileHeld() // the client left during the decision
			}
			if held {
				x.endHeldRead(false)
				x.unhold("admitted")
			}
			return x.storeFailed(err)
		}
		if allowed {
			x.observeRules(len(x.rules))
			x.decision = decAllowed // a failed peek before may have said store_error
			x.limited, x.show = x.fewestRemaining()
			x.keepPlaces()
			if held {
				x.endHeldRead(false)
				x.unhold("admitted")
			}
			return x.admitted()
		}
		if !x.holdable(now.Sub(x.start)) {
			x.observeRules(len(x.rules))
			if held {
				x.endHeldRead(true)
				x.unhold("rate_limited")
			}
			return x.rateLimited()
		}
		if !held {
			if !x.hold() {
				x.observeRules(len(x.rules))
				return x.rateLimited()
			}
			held = true
			x.readWhileHeld()
		}
		if !wait(r, longestWait(x)) {
			return x.leftWhileHeld()
		}
		now = p.now()
	}
}

// keepPlaces keeps the places the admitted batch took, for release.
func (x *exchange) keepPlaces() {
	for i := range x.hits {
		if x.hits[i].Rule.Algorithm == limits.Concurrency && !x.out[i].Ticket.IsZero() {
			if x.placed == nil {
				x.placed = x.placeBuf[:0]
			}
			x.placed = append(x.placed, limits.Place{Hit: x.hits[i], Ticket: x.out[i].Ticket})
		}
	}
}

// leftWhileHeld ends the hold of a request whose client left: nothing is
// recorded, nothing answered.
func (x *exchange) leftWhileHeld() *denial {
	x.endHeldRead(true)
	x.unhold("client_closed")
	return x.gone()
}

// holdable reports whether the refused batch may be held and decided
// again: every refusing enforcing rule is a delay rule, and the longest
// wait ends within the smallest of their max_delay, counted from the
// request's arrival (elapsed ago).
func (x *exchange) holdable(elapsed time.Duration) bool {
	budget := time.Duration(-1)
	for i, ru := range x.rules {
		if x.out[i].Allowed || ru.action == actShadow {
			continue
		}
		if ru.action != actDelay {
			return false
		}
		if budget < 0 || ru.maxDelay < budget {
			budget = ru.maxDelay
		}
	}
	return budget >= 0 && elapsed+longestWait(x) <= budget
}

// longestWait is the longest RetryAfter among the refusing enforcing hits.
func longestWait(x *exchange) time.Duration {
	var w time.Duration
	for i, ru := range x.rules {
		if !x.out[i].Allowed && ru.action != actShadow {
			w = max(w, x.out[i].RetryAfter)
		}
	}
	return w
}

// hold takes one of MAX_DELAYED places; false when none is free.
func (x *exchange) hold() bool {
	p := x.p
	if p.delayed.Add(1) > x.pol.cfg.MaxDelayed {
		p.delayed.Add(-1)
		return false
	}
	p.ruleSet.held.Inc()
	x.heldBy = x.rules[firstRefusing(x)]
	return true
}

func (x *exchange) unhold(outcome string) {
	x.p.delayed.Add(-1)
	x.p.ruleSet.held.Dec()
	m := x.heldBy.metrics
	switch outcome {
	case "admitted":
		m.delayedAdmitted.Inc()
	case "rate_limited":
		m.delayedRefused.Inc()
	default:
		m.delayedGone.Inc()
	}
}

// wait sleeps d, or less when the client leaves (false). A client gone
// as the wait ends is gone too: the decision after it would record it.
func wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(max(d, time.Millisecond))
	defer t.Stop()
	select {
	case <-t.C:
		return r.Context().Err() == nil
	case <-r.Context().Done():
		return false
	}
}

// firstRefusing is the index of the first refusing enforcing hit, in
// evaluation order.
func firstRefusing(x *exchange) int {
	for i, ru := range x.rules {
		if !x.out[i].Allowed && ru.action != actShadow {
			return i
		}
	}
	return 0
}

// fewestRemaining picks the applying enforcing rule X-RateLimit-* describe
// (SPEC §7.3, §8): the request rule with the fewest remaining, else the
// token rule; false when only shadow rules applied (no headers).
func (x *exchange) fewestRemaining() (bool, int) {
	if i := fewest(x, costRequests); i >= 0 {
		return true, i
	}
	i := fewest(x, costInput)
	if i < 0 {
		i = fewest(x, costUSD)
	}
	return i >= 0, max(i, 0)
}

// shadowWouldRefuse logs and counts what a shadow rule would have refused
// before deciding (an unpriced model, input it cannot reserve): a shadow
// rule never refuses, so it is left out of the batch (SPEC §7.3).
func (x *exchange) shadowWouldRefuse(ru *rule, reason string) {
	ru.metrics.refused.Inc()
	ru.metrics.shadowDenied.Inc()
	x.p.log.Info("shadow rule would refuse", "rule", ru.lim.Name, "reason", reason, "model", x.keys.model, "path", x.r.URL.Path)
}

// observeRules counts the decision of each of the first n rules, logs and
// counts what shadow rules would have refused, and sets the usage ratios.
func (x *exchange) observeRules(n int) {
	for i, ru := range x.rules[:n] {
		d := &x.out[i]
		m := ru.metrics
		if d.Allowed {
			m.allowed.Inc()
		} else {
			m.refused.Inc()
			if ru.action == actShadow {
				m.shadowDenied.Inc()
				x.p.log.Info("shadow rule would refuse", "rule", ru.lim.Name, "key", x.keys.loggedKey(ru),
					"retry_after", max(ceilSeconds(d.RetryAfter), 1), "path", x.r.URL.Path)
			}
		}
		if d.Limit > 0 {
			m.usage.Set(float64(d.Limit-min(d.Remaining, d.Limit)) / float64(d.Limit))
		} else {
			m.usage.Set(1)
		}
	}
}

// loggedKey is a hit's key in its log form: IPs truncated (SPEC §6).
func (in *keyInput) loggedKey(ru *rule) string {
	var b strings.Builder
	for i := range ru.key {
		kp := &ru.key[i]
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(kp.label)
		b.WriteByte('=')
		switch kp.kind {
		case partCaller:
			b.WriteString(in.c.logged())
		case partIP:
			b.WriteString(strings.TrimPrefix(caller{ip: in.pol.ips.clientIP(in.r)}.logged(), "ip:"))
		default:
			v, _ := in.value(kp)
			b.WriteString(limits.KeyOf("", v).String()[1:])
		}
	}
	return b.String()
}

// invalid is a 400 invalid_request; message never quotes the body.
func (x *exchange) invalid(message string) *denial {
	return x.refuse(decInvalid, http.StatusBadRequest, codeInvalidRequest, message)
}

// rateLimited is the 429 of a refused batch (SPEC §5, §7.3): denied_by,
// denied_key and limit of the first refusing rule in evaluation order,
// violated naming every refusing rule, the longest wait in
// retry_after_seconds and Retry-After. When the same answer was rendered
// before (refusal.go), the denial carries it and nothing is rendered.
func (x *exchange) rateLimited() *denial {
	first := firstRefusing(x)
	show := -1
	var wait time.Duration
	for i, ru := range x.rules {
		if x.out[i].Allowed || ru.action == actShadow {
			continue
		}
		wait = max(wait, x.out[i].RetryAfter)
		if !ru.cost.metered() {
			x.out[i].Remaining = 0 // a token rule shows what is left: a smaller request may fit
			if show < 0 {
				show = i
			}
		}
	}
	// X-RateLimit-* describe the first refusing request rule, else the
	// request rule with the fewest remaining, else the first refusing
	// rule (SPEC §8); Remaining is 0 on a 429 whichever it is (§5).
	if show < 0 {
		show = fewest(x, costRequests)
	}
	if show < 0 {
		show = first
	}
	x.limited, x.show, x.refused = true, show, true
	h := &x.hits[first]
	retry := max(ceilSeconds(wait), 1)
	den := x.refuse(decRateLimited, http.StatusTooManyRequests, codeRateLimited, "")
	den.first, den.retryMs = first, retryAfterMs(wait)
	if x.p.log.Enabled(x.r.Context(), slog.LevelInfo) {
		den.logged("rule", h.Rule.Name, "key", x.keys.loggedKey(x.rules[first]), "retry_after", retry, "path", x.r.URL.Path)
	}
	sig := &x.sig
	if x.p.prepared == nil || !x.sign(sig) {
		sig = nil
	} else if den.prepared = x.p.prepared.get(preparedKey{x.rules[first], h.Key}, sig); den.prepared != nil {
		return den
	}
	den.sig = sig

	var violated []string
	for i, ru := range x.rules {
		if !x.out[i].Allowed && ru.action != actShadow {
			violated = append(violated, ru.lim.Name)
		}
	}
	d := &x.out[first]
	secs := strconv.FormatInt(retry, 10)
	// A spent money budget is OpenAI's insufficient_quota, its limit in
	// dollars (SPEC §8.1).
	code, message, limit := codeRateLimited, "Too many requests.", any(d.Limit)
	if x.rules[first].cost == costUSD {
		code, message, limit = codeInsufficientQuota, "The spend limit of rule "+h.Rule.Name+" is reached.", dollars(d.Limit)
	}
	den.e.code, den.e.message = code, message+" Please retry after "+secs+" seconds."
	return den.with(field{"retry_after_seconds", retry},
		field{"denied_by", h.Rule.Name},
		field{"denied_key", h.Key.String()},
		field{"limit", limit},
		field{"violated", violated}).
		header("Retry-After", []string{secs}).
		header("X-Ratelimit-Retry-After", []string{secs})
}

// storeFailed applies FAIL_OPEN when the store could not decide: go on
// without rate-limit headers (nil), or answer 503.
func (x *exchange) storeFailed(err error) *denial {
	p := x.p
	p.metrics.storeErrors.Inc()
	x.decision = decStoreError
	x.limited = false
	if p.boot.FailOpen != config.FailOpenFalse {
		p.log.Debug("rate limiter store failed; admitting (fail_open)", "err", err)
		return nil
	}
	return x.refuse(decStoreError, http.StatusServiceUnavailable, codeStoreDown,
		"The rate limiter is unavailable. Please retry shortly.").
		header("Retry-After", []string{"1"}).
		logged("rule", "fail_open", "key", "caller="+x.keys.c.logged(), "retry_after", 1, "path", x.r.URL.Path, "err", err)
}

// sizeOut makes out hold one decision per hit (allocating past
// maxInlineRules).
func (x *exchange) sizeOut() {
	if cap(x.out) < len(x.hits) {
		x.out = make([]limits.Decision, len(x.hits))
	}
	x.out = x.out[:len(x.hits)]
}
