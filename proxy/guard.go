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

// guard runs the guard chain of SPEC §4 and §7.3 on a request that is
// protected or that a rule applies to, as explicit steps:
//
//  1. identify the caller (401 with REQUIRE_AUTH, protected routes);
//  2. the applying rules that need no body: their keys, 400 missing_key;
//  3. when some applying rule needs the body: a peek (nothing recorded) at
//     the rules of step 2, so that a caller already over one is refused
//     before its body is read (with the token rules' state for its
//     headers);
//  4. read the body within the caps (415, 413) and, on a protected route,
//     count its tokens; body key parts are read in the same pass (400);
//  5. the rules that need the body: their keys;
//  6. decide every applying rule in one batch, all-or-nothing (429, or a
//     hold for delay rules);
//  7. the token cap (413);
//
// then the caller forwards. Without body rules step 6 comes right after
// step 2, before the body is read, as in the first release. It reports
// whether the request may be forwarded; when not, the answer has been
// written and x.decision says why.
func (p *Proxy) guard(x *exchange, r *http.Request, now time.Time, pol *policy, protected bool, cands []*rule) bool {
	// 1. Identify.
	c := pol.identify(r, anthropicPath(x.apiPath))
	if protected && pol.cfg.RequireAuth && !c.hasCred {
		x.decision = decUnauthorized
		msg := "An API key is required: send Authorization: Bearer <key>, X-API-Key or api-key."
		if c.refused != "" {
			msg = "The bearer token is not a valid JWT: " + c.refused + "."
			p.log.Info("request denied", "rule", "require_auth", "key", "caller="+c.logged(), "jwt", c.refused, "path", r.URL.Path)
		} else {
			p.log.Info("request denied", "rule", "require_auth", "key", "caller="+c.logged(), "path", r.URL.Path)
		}
		x.Header()["Www-Authenticate"] = []string{"Bearer"}
		p.writeError(x, r, &apiError{status: http.StatusUnauthorized, code: codeUnauthorized, message: msg})
		return false
	}
	in := &x.keys
	*in = keyInput{r: r, p: p, pol: pol, c: c, path: x.apiPath}
	if in.path == "" {
		in.path = canonicalPath(r.URL.Path)
	}
	in.plan = pol.planOf(r, &c)
	x.hits, x.out, x.rules = x.hitBuf[:0], x.outBuf[:0], x.ruleBuf[:0]

	// 2. The rules that need no body.
	bodyRules := false
	for _, ru := range cands {
		if ru.needsBody {
			bodyRules = true
			continue
		}
		if !p.addHit(x, r, in, pol, ru) {
			return false
		}
	}
	if !bodyRules {
		if len(x.hits) > 0 && !p.decide(x, r, in, now) {
			return false
		}
		if !protected {
			return true
		}
		return p.readBody(x, r, in, now, protected, false, nil, -1) && p.tokenCap(x, r, in)
	}

	// 3. A caller already over a rule that needs no body is refused
	// before its body is read.
	// The token rules' state is peeked too, for the headers of the 429.
	if n := len(x.hits); n > 0 {
		p.addShownHits(x, in, cands)
		x.sizeOut()
		ok, err := p.store.Peek(r.Context(), x.hits, now, x.out)
		ok = ok || shownOnly(x, n)
		switch {
		case err != nil:
			x.hits, x.rules = x.hits[:n], x.rules[:n]
			if !p.storeFailed(x, r, in, err) {
				return false
			}
		case !ok && !p.holdable(x, 0):
			p.observeRules(x, in, r, n) // the rules decided: counted as a decision would be
			p.refuse(x, r, in)
			return false
		}
		x.hits, x.rules = x.hits[:n], x.rules[:n]
	}

	// 4. The body, its size and (protected) its tokens, with the body key
	// parts in the same pass.
	if !p.readBody(x, r, in, now, protected, true, bodyFields(cands), countFor(cands)) {
		return false
	}

	// 5, 6. The rules that need the body, then the batch.
	for _, ru := range cands {
		if ru.needsBody && !p.addHit(x, r, in, pol, ru) {
			return false
		}
	}
	if len(x.hits) > 0 && !p.decide(x, r, in, now) {
		return false
	}
	// 7. The token cap.
	return !protected || p.tokenCap(x, r, in)
}

// addHit adds the rule's hit to the batch when the rule applies: its
// `when` conditions hold and its key can be built (a missing part skips
// the rule, or answers 400 missing_key with on_missing_key = "reject").
// The effective limit is the plan's tier, then the key's override; an
// "unlimited" one leaves the rule out. It reports false when it answered.
func (p *Proxy) addHit(x *exchange, r *http.Request, in *keyInput, pol *policy, ru *rule) bool {
	if !in.conditionsHold(ru) {
		if in.err != nil {
			p.invalid(x, r, "The request is ambiguous: "+in.err.Error()+".")
			return false
		}
		return true
	}
	key, missing, ok := in.key(ru)
	if in.err != nil {
		p.invalid(x, r, "The request is ambiguous: "+in.err.Error()+".")
		return false
	}
	if !ok {
		if !ru.reject {
			return true
		}
		ru.metrics.missing.Inc()
		x.decision = decInvalid
		p.log.Info("request denied", "rule", ru.lim.Name, "reason", "missing_key", "key_part", missing, "path", r.URL.Path)
		p.writeError(x, r, &apiError{status: http.StatusBadRequest, code: codeMissingKey,
			message: "The request lacks " + missing + ", which rule " + ru.lim.Name + " counts by.",
			fields:  []field{{"rule", ru.lim.Name}, {"key_part", missing}}})
		return false
	}
	h := limits.Hit{Rule: ru.lim, Key: key, Cost: 1}
	if eff, own := ru.effective(in.plan, key); own {
		if eff.unlimited {
			return true // before pricing: an unlimited key is never refused for it (hidden input, unpriced model)
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
				p.shadowWouldRefuse(in, r, ru, "hidden_input")
				return true
			}
			ru.metrics.refused.Inc()
			p.log.Info("request denied", "rule", ru.lim.Name, "reason", "hidden_input", "member", name, "path", r.URL.Path)
			p.invalid(x, r, "The request's "+name+" refers to input held by the provider, which a usd/total_tokens budget ("+
				ru.lim.Name+") cannot reserve; send the input itself.")
			return false
		}
	}
	if ru.cost.metered() {
		include, ok := p.meteredCost(x, r, in, pol, ru, &h)
		if !ok || !include {
			return ok
		}
	}
	x.hits = append(x.hits, h)
	x.rules = append(x.rules, ru)
	return true
}

// addShownHits adds to the batch, for the headers of a 429 answered
// before the body is read (SPEC §8: every answer a token rule applies to
// carries its headers), the applying token and money rules whose key and
// conditions need no body, at cost 0: their state is read, nothing of
// theirs is decided. A rule that cannot be placed so (an ambiguous part,
// a missing key, an unlimited key) is left to the decision after the body.
func (p *Proxy) addShownHits(x *exchange, in *keyInput, cands []*rule) {
	for _, ru := range cands {
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

// decide decides the batch at now, all-or-nothing, holding the request
// while delay rules allow it (SPEC §7.3), and answers 429 when refused.
func (p *Proxy) decide(x *exchange, r *http.Request, in *keyInput, now time.Time) bool {
	if i := oversized(x); i >= 0 {
		p.tooCostly(x, r, in, now, i)
		return false
	}
	arrived := now
	held := false
	for {
		x.sizeOut()
		allowed, err := p.store.Decide(r.Context(), x.hits, now, x.out)
		if err != nil {
			if held && r.Context().Err() != nil {
				return p.gone(x) // the client left during the decision
			}
			if held {
				x.endHeldRead(false)
				p.unhold(x, "admitted")
			}
			return p.storeFailed(x, r, in, err)
		}
		if allowed {
			p.observeRules(x, in, r, len(x.rules))
			x.decision = decAllowed // a failed peek before may have said store_error
			x.limited, x.show = p.fewestRemaining(x)
			if held {
				x.endHeldRead(false)
				p.unhold(x, "admitted")
			}
			p.admitted(x, r, in)
			return true
		}
		if !p.holdable(x, now.Sub(arrived)) {
			p.observeRules(x, in, r, len(x.rules))
			if held {
				x.endHeldRead(true)
				p.unhold(x, "rate_limited")
			}
			p.refuse(x, r, in)
			return false
		}
		if !held {
			if !p.hold(x) {
				p.observeRules(x, in, r, len(x.rules))
				p.refuse(x, r, in)
				return false
			}
			held = true
			p.readWhileHeld(x, r, now)
		}
		if !p.wait(r, longestWait(x)) {
			return p.gone(x)
		}
		now = p.now()
	}
}

// gone ends the hold of a request whose client left: nothing is recorded.
func (p *Proxy) gone(x *exchange) bool {
	x.endHeldRead(true)
	p.unhold(x, "client_closed")
	x.decision = decClientClosed
	return false
}

// holdable reports whether the refused batch may be held and decided
// again: every refusing enforcing rule is a delay rule, and the longest
// wait ends within the smallest of their max_delay, counted from the
// request's arrival (elapsed ago).
func (p *Proxy) holdable(x *exchange, elapsed time.Duration) bool {
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
func (p *Proxy) hold(x *exchange) bool {
	if p.delayed.Add(1) > x.pol.cfg.MaxDelayed {
		p.delayed.Add(-1)
		return false
	}
	p.ruleSet.held.Inc()
	x.heldBy = x.rules[firstRefusing(x)]
	return true
}

func (p *Proxy) unhold(x *exchange, outcome string) {
	p.delayed.Add(-1)
	p.ruleSet.held.Dec()
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
func (p *Proxy) wait(r *http.Request, d time.Duration) bool {
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
func (p *Proxy) fewestRemaining(x *exchange) (bool, int) {
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
func (p *Proxy) shadowWouldRefuse(in *keyInput, r *http.Request, ru *rule, reason string) {
	ru.metrics.refused.Inc()
	ru.metrics.shadowDenied.Inc()
	p.log.Info("shadow rule would refuse", "rule", ru.lim.Name, "reason", reason, "model", in.model, "path", r.URL.Path)
}

// observeRules counts the decision of each of the first n rules, logs and
// counts what shadow rules would have refused, and sets the usage ratios.
func (p *Proxy) observeRules(x *exchange, in *keyInput, r *http.Request, n int) {
	for i, ru := range x.rules[:n] {
		d := &x.out[i]
		m := ru.metrics
		if d.Allowed {
			m.allowed.Inc()
		} else {
			m.refused.Inc()
			if ru.action == actShadow {
				m.shadowDenied.Inc()
				p.log.Info("shadow rule would refuse", "rule", ru.lim.Name, "key", p.loggedKey(in, ru),
					"retry_after", max(ceilSeconds(d.RetryAfter), 1), "path", r.URL.Path)
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
func (p *Proxy) loggedKey(in *keyInput, ru *rule) string {
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

// invalid answers 400 invalid_request; message never quotes the body.
func (p *Proxy) invalid(x *exchange, r *http.Request, message string) {
	x.decision = decInvalid
	p.writeError(x, r, &apiError{status: http.StatusBadRequest, code: codeInvalidRequest, message: message})
}

// refuse answers 429 for a refused batch (SPEC §5, §7.3): denied_by,
// denied_key and limit of the first refusing rule in evaluation order,
// violated naming every refusing rule, the longest wait in
// retry_after_seconds and Retry-After.
func (p *Proxy) refuse(x *exchange, r *http.Request, in *keyInput) {
	x.decision = decRateLimited
	first := firstRefusing(x)
	show := -1
	var violated []string
	var wait time.Duration
	for i, ru := range x.rules {
		if x.out[i].Allowed || ru.action == actShadow {
			continue
		}
		violated = append(violated, ru.lim.Name)
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
	d := &x.out[first]
	retry := max(ceilSeconds(wait), 1)
	secs := strconv.FormatInt(retry, 10)
	// A spent money budget is OpenAI's insufficient_quota, its limit in
	// dollars (SPEC §8.1).
	code, message, limit := codeRateLimited, "Too many requests.", any(d.Limit)
	if x.rules[first].cost == costUSD {
		code, message, limit = codeInsufficientQuota, "The spend limit of rule "+h.Rule.Name+" is reached.", dollars(d.Limit)
	}
	hdr := x.Header()
	hdr["Retry-After"] = []string{secs}
	hdr["X-Ratelimit-Retry-After"] = []string{secs}
	hdr["Retry-After-Ms"] = []string{strconv.FormatInt(max(ceilMillis(wait), 1), 10)}
	if p.log.Enabled(r.Context(), slog.LevelInfo) {
		p.log.Info("request denied", "rule", h.Rule.Name, "key", p.loggedKey(in, x.rules[first]), "retry_after", retry, "path", r.URL.Path)
	}
	p.writeError(x, r, &apiError{
		status:  http.StatusTooManyRequests,
		code:    code,
		message: message + " Please retry after " + secs + " seconds.",
		fields: []field{
			{"retry_after_seconds", retry},
			{"denied_by", h.Rule.Name},
			{"denied_key", h.Key.String()},
			{"limit", limit},
			{"violated", violated},
		},
	})
}

// storeFailed applies FAIL_OPEN when the store could not decide: go on
// without rate-limit headers (true), or answer 503 (false).
func (p *Proxy) storeFailed(x *exchange, r *http.Request, in *keyInput, err error) bool {
	p.metrics.storeErrors.Inc()
	x.decision = decStoreError
	x.limited = false
	if p.boot.FailOpen != config.FailOpenFalse {
		p.log.Debug("rate limiter store failed; admitting (fail_open)", "err", err)
		return true
	}
	p.log.Info("request denied", "rule", "fail_open", "key", "caller="+in.c.logged(), "retry_after", 1, "path", r.URL.Path, "err", err)
	x.Header()["Retry-After"] = []string{"1"}
	p.writeError(x, r, &apiError{status: http.StatusServiceUnavailable, code: codeStoreDown,
		message: "The rate limiter is unavailable. Please retry shortly."})
	return false
}

// sizeOut makes out hold one decision per hit (allocating past
// maxInlineRules).
func (x *exchange) sizeOut() {
	if cap(x.out) < len(x.hits) {
		x.out = make([]limits.Decision, len(x.hits))
	}
	x.out = x.out[:len(x.hits)]
}
