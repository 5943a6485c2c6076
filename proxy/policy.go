package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// policy is the configuration compiled once: the settings a reload can
// change, the protected routes, the trust model, the upstream groups and
// the rules in evaluation order, each with its matchers and key
// extractors. It is immutable; the proxy reads it through an
// atomic.Pointer, so a reload or a live change is one swap and a request
// sees one policy from start to end.
type policy struct {
	cfg        *config.Config // as loaded, live changes not applied (they are in live)
	live       *liveChanges   // the admin API's changes since the last load
	routes     *routes        // PROTECTED_PATHS
	ips        clientIPs
	flatErrors bool
	groups     *groups // upstream groups (SPEC §9); nil when none
	rules      []*rule
	// ownPaths: some rule matches paths of its own (not PROTECTED_PATHS)
	// or methods besides POST, so an unprotected request may still be
	// limited.
	ownPaths  bool
	tierFrom  string // canonical header name of the caller's plan, "" none
	tierClaim string // or the verified JWT's claim naming it
	// jwt verifies bearer tokens shaped like JWTs (SPEC §7.5); nil when
	// no secret or key set is configured.
	jwt        *jwtauth.Verifier
	jwtResults *jwtMetrics
	prices     config.Prices
	// keys are API_KEYS_FILE's (SPEC §7.7): when set, only they are API
	// keys. now tells whether one has expired.
	keys config.APIKeys
	now  func() time.Time
	// upstreamAuth is UPSTREAM_AUTHORIZATION as a header value, nil when
	// unset; upstreamAuthAnthropic: it is no Bearer token, so Anthropic's
	// paths get it as X-API-Key.
	upstreamAuth          []string
	upstreamAuthAnthropic bool
}

// action is what a rule does past its limit (SPEC §7.1).
type action uint8

const (
	actReject action = iota
	actDelay
	actShadow
)

// rule is one compiled rule.
type rule struct {
	lim      *limits.Rule
	headers  *ruleHeaders
	index    int     // evaluation order (file order, chat_rpm first)
	paths    *routes // nil: the protected routes (PROTECTED_PATHS)
	methods  []string
	anyMeth  bool
	when     []condition
	unless   []condition
	key      []keyPart
	reject   bool // on_missing_key = "reject"
	action   action
	maxDelay time.Duration
	burstSet bool // burst given: it stays when a tier or override changes the limit
	tiers    map[string]tierLimit
	override map[string]tierLimit
	// needsBody: the cost, a key part or a condition is read from the
	// body (keyBody: a key part or condition), so the rule is decided
	// after the body has been read.
	needsBody bool
	keyBody   bool
	// fields are the rule's body key parts (and a total_tokens rule's
	// output fields), for the body reader.
	fields  tokens.Fields
	cost    costKind
	maxCost int64 // a token rule's largest limit, burst, tier or override
	// clamp: output = "clamp" (SPEC §8.2), a total_tokens or usd rule
	// whose admissions leave with an output cap no larger than what was
	// reserved; minOutput the smallest cap it sends.
	clamp     bool
	minOutput int64
	metrics   *ruleMetrics
	conf      config.Rule // what it was compiled from, live changes applied
}

// tierLimit is a limit that replaces a rule's for one plan or key.
type tierLimit struct {
	limit     int64
	unlimited bool
}

type condition struct {
	part   keyPart
	values []condValue // any of them
}

// condValue is one value a condition accepts: exact, a prefix (written
// with a trailing *), or, for the ip part, a CIDR holding the client IP.
type condValue struct {
	value  string
	prefix bool
	cidr   netip.Prefix // valid for a CIDR
}

// partKind is where a key part's value comes from (SPEC §7.2).
type partKind uint8

const (
	partGlobal partKind = iota
	partCaller
	partAPIKey
	partIP
	partMethod
	partPath
	partModel
	partTier
	partHeader
	partQuery
	partJSON
	partXML
	partForm
	partJWT
)

// keyPart is one compiled key part.
type keyPart struct {
	label string // as written in the rule: the name in the key's public form
	kind  partKind
	name  string // header (canonical), query, form, XML name or JSON path
	alt   string // a header's name with '_' for '-' (canonical), "" when the same
}

func (k *keyPart) body() bool {
	return k.kind == partModel || k.kind == partJSON || k.kind == partXML || k.kind == partForm
}

// compilePolicy builds the rules of a validated configuration, with the
// admin API's live changes applied.
func compilePolicy(c *config.Config, live *liveChanges, rm *ruleMetricSet) (*policy, error) {
	pol := &policy{cfg: c, live: live, prices: c.Prices}
	if tf, ok := strings.CutPrefix(c.TierFrom, "header:"); ok {
		pol.tierFrom = http.CanonicalHeaderKey(tf)
	}
	pol.tierClaim, _ = strings.CutPrefix(c.TierFrom, "jwt:")
	var rules []config.Rule
	if c.ChatRPMRule() {
		rules = append(rules, config.Rule{Name: config.BuiltinRule, Methods: []string{http.MethodPost},
			Key: []string{"caller"}, OnMissingKey: config.MissingSkip, Algorithm: config.AlgSlidingWindow,
			Limit: c.ChatRPM, Window: time.Minute, Cost: config.CostRequests, Action: config.ActionReject})
	}
	rules = append(rules, c.Rules...)
	for i := range rules {
		live.apply(&rules[i])
		ru, err := pol.compileRule(&rules[i], i, rm)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", rules[i].Name, err)
		}
		pol.rules = append(pol.rules, ru)
	}
	return pol, nil
}

func (pol *policy) compileRule(cr *config.Rule, index int, rm *ruleMetricSet) (*rule, error) {
	alg := limits.SlidingWindow
	var period limits.Period
	switch cr.Algorithm {
	case config.AlgTokenBucket:
		alg = limits.TokenBucket
	case config.AlgConcurrency:
		alg = limits.Concurrency
	case config.AlgCalendar:
		alg = limits.Calendar
		period, _ = limits.ParsePeriod(cr.Period)
	}
	burst := cr.Limit
	if cr.BurstSet {
		burst = cr.Burst
	}
	lim := &limits.Rule{Name: cr.Name, Algorithm: alg, Limit: cr.Limit, Window: cr.Window, Burst: burst,
		Shadow: cr.Action == config.ActionShadow, Period: period, Location: cr.Location}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	// A refund can shorten a refusal's wait (SPEC §4.2).
	lim.Settles = cr.Cost == config.CostTotalTokens || cr.Cost == config.CostUSD
	ru := &rule{lim: lim, index: index, reject: cr.OnMissingKey == config.MissingReject,
		maxDelay: cr.MaxDelay, burstSet: cr.BurstSet, metrics: rm.rule(cr.Name), conf: *cr}
	switch cr.Cost {
	case config.CostInputTokens:
		ru.cost = costInput
	case config.CostTotalTokens, config.CostUSD:
		ru.cost = costTotal
		if cr.Cost == config.CostUSD {
			ru.cost = costUSD
			// A batch's model is its members' (which must agree): it
			// is read like a key part.
			ru.fields.JSON = append(ru.fields.JSON, "model")
		}
		ru.fields.JSON = append(ru.fields.JSON, outputJSON...)
		ru.fields.Form = append(ru.fields.Form, outputForm...)
		if cr.Output == config.OutputClamp && cr.Action != config.ActionShadow {
			// A shadow rule never refuses: it clamps nothing either.
			ru.clamp, ru.minOutput = true, cr.MinOutput
			if ru.minOutput < 1 {
				ru.minOutput = config.DefaultMinOutput
			}
		}
	}
	ru.needsBody = ru.cost.metered() // the estimate is the cost
	if ru.cost.metered() {
		ru.metrics.tokens = rm.budget.rule(cr.Name)
	}
	if ru.clamp {
		ru.metrics.tokens.clamped = rm.budget.clamped.WithLabelValues(cr.Name) // the series exists from the start
	}
	ru.headers = newRuleHeaders(lim, ru.cost)
	switch cr.Action {
	case config.ActionDelay:
		ru.action = actDelay
	case config.ActionShadow:
		ru.action = actShadow
	}
	if cr.Paths != nil {
		ru.paths = newRoutes(cr.Paths, nil)
		pol.ownPaths = true
	}
	for _, m := range cr.Methods {
		if m == "*" {
			ru.anyMeth = true
		}
		if m != http.MethodPost {
			pol.ownPaths = true
		}
		ru.methods = append(ru.methods, strings.ToUpper(m))
	}
	for _, part := range cr.Key {
		kp, err := ru.compilePart(part)
		if err != nil {
			return nil, err
		}
		ru.key = append(ru.key, kp)
		ru.keyBody = ru.keyBody || kp.body()
	}
	for _, f := range []struct {
		from []config.Condition
		to   *[]condition
	}{{cr.When, &ru.when}, {cr.Unless, &ru.unless}} {
		for _, w := range f.from {
			kp, err := ru.compilePart(w.Part)
			if err != nil {
				return nil, err
			}
			cond := condition{part: kp}
			for _, v := range w.Values {
				cv := condValue{value: v}
				if p, err := netip.ParsePrefix(v); err == nil && kp.kind == partIP {
					cv.cidr = p.Masked()
				} else if pre, ok := strings.CutSuffix(v, "*"); ok {
					cv.value, cv.prefix = pre, true
				}
				cond.values = append(cond.values, cv)
			}
			*f.to = append(*f.to, cond)
			ru.keyBody = ru.keyBody || kp.body()
		}
	}
	ru.needsBody = ru.needsBody || ru.keyBody
	if len(cr.Tiers) > 0 {
		ru.tiers = map[string]tierLimit{}
		for _, t := range cr.Tiers {
			ru.tiers[t.Plan] = tierLimit{limit: t.Limit, unlimited: t.Unlimited}
		}
	}
	if len(cr.Overrides) > 0 {
		ru.override = map[string]tierLimit{}
		for _, o := range cr.Overrides {
			ru.override[o.Key] = tierLimit{limit: o.Limit, unlimited: o.Unlimited}
		}
	}
	ru.maxCost = max(lim.Limit, lim.Burst)
	for _, t := range ru.tiers {
		ru.maxCost = max(ru.maxCost, t.limit)
	}
	for _, o := range ru.override {
		ru.maxCost = max(ru.maxCost, o.limit)
	}
	return ru, nil
}

// effective is the limit in force for a key of the plan: the key's
// override, else the plan's tier; own is false when neither applies (the
// rule's limit holds).
func (ru *rule) effective(plan string, key limits.Key) (eff tierLimit, own bool) {
	if ru.tiers != nil && plan != "" {
		eff, own = ru.tiers[plan]
	}
	if ru.override != nil {
		if o, ok := ru.override[key.String()]; ok {
			eff, own = o, true
		}
	}
	return eff, own
}

// compilePart compiles a validated key part, registering body parts in
// the rule's field lists (once each).
func (ru *rule) compilePart(part string) (keyPart, error) {
	kp := keyPart{label: part}
	simple := map[string]partKind{"global": partGlobal, "caller": partCaller, "api_key": partAPIKey, "ip": partIP,
		"method": partMethod, "path": partPath, "model": partModel, "tier": partTier}
	if k, ok := simple[part]; ok {
		kp.kind = k
		return kp, nil
	}
	kind, name, _ := strings.Cut(part, ":")
	kp.name = name
	field := func(list *[]string) { // once each; a total_tokens rule's output fields may be among them
		if !slices.Contains(*list, name) {
			*list = append(*list, name)
		}
	}
	switch kind {
	case "header":
		kp.kind, kp.name = partHeader, http.CanonicalHeaderKey(name)
		if alt := http.CanonicalHeaderKey(strings.ReplaceAll(kp.name, "-", "_")); alt != kp.name {
			kp.alt = alt
		}
	case "query":
		kp.kind = partQuery
	case "json":
		kp.kind = partJSON
		field(&ru.fields.JSON)
	case "xml":
		kp.kind = partXML
		field(&ru.fields.XML)
	case "form":
		kp.kind = partForm
		field(&ru.fields.Form)
	case "jwt":
		kp.kind = partJWT
	default:
		return kp, fmt.Errorf("key part %q: %w", part, config.CheckKeyPart(part))
	}
	return kp, nil
}

// matches reports whether the rule applies to r by method and path.
// route is r's protected route (nil when it has none); ruleRoute matches
// r's path against every PROTECTED_PATHS entry whatever the method.
func (ru *rule) matches(r *http.Request, protected bool, onProtectedPath func() bool) bool {
	if ru.paths == nil {
		if len(ru.methods) == 1 && ru.methods[0] == http.MethodPost {
			return protected // the common case: decided by the route already
		}
		if !ru.methodMatches(r) {
			return false
		}
		return protected || onProtectedPath()
	}
	if !ru.methodMatches(r) {
		return false
	}
	rt, _ := ru.paths.match(r)
	return rt != nil
}

func (ru *rule) methodMatches(r *http.Request) bool {
	if ru.anyMeth {
		return true
	}
	for _, m := range ru.methods {
		// HEAD is served by GET's handler in most routers.
		if methodLike(r, m) || m == http.MethodGet && methodLike(r, http.MethodHead) {
			return true
		}
	}
	return false
}

// ruleMetricSet is the per-rule families (SPEC §6, §7.3): decisions by
// rule and result, shadow denials, usage ratio, delayed requests.
type ruleMetricSet struct {
	decisions *prometheus.CounterVec
	shadow    *prometheus.CounterVec
	usage     *prometheus.GaugeVec
	delayed   *prometheus.CounterVec
	held      prometheus.Gauge
	budget    *budgetMetrics
	spend     *spendMetrics
}

// ruleMetrics are one rule's children, resolved once.
type ruleMetrics struct {
	allowed, refused, missing prometheus.Counter
	shadowDenied              prometheus.Counter
	usage                     prometheus.Gauge
	delayedAdmitted           prometheus.Counter
	delayedRefused            prometheus.Counter
	delayedGone               prometheus.Counter
	tokens                    tokenMetrics // token rules only
}

func newRuleMetricSet(reg prometheus.Registerer) (*ruleMetricSet, error) {
	m := &ruleMetricSet{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_rule_decisions_total",
			Help: "Decisions per rule: allowed (the rule admitted the request), rate_limited (it refused), missing_key (a key part was missing and on_missing_key = \"reject\"). Shadow rules count what they would have decided.",
		}, []string{"rule", "result"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_shadow_denials_total",
			Help: "Requests a shadow rule would have refused (they were not refused for it).",
		}, []string{"rule"}),
		usage: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_rule_usage_ratio",
			Help: "Used share of the limit (0 to 1) of the key a rule decided last, right after that decision.",
		}, []string{"rule"}),
		delayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_delayed_requests_total",
			Help: "Requests held by delay rules, by the first refusing rule and outcome: admitted after the hold, rate_limited (refused after it), client_closed (left while held, not counted).",
		}, []string{"rule", "outcome"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_delayed_requests",
			Help: "Requests held by delay rules now (at most MAX_DELAYED).",
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.shadow, m.usage, m.delayed, m.held} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	var err error
	if m.budget, err = newBudgetMetrics(reg); err != nil {
		return nil, err
	}
	m.spend, err = newSpendMetrics(reg)
	return m, err
}

func (m *ruleMetricSet) rule(name string) *ruleMetrics {
	return &ruleMetrics{
		allowed:         m.decisions.WithLabelValues(name, "allowed"),
		refused:         m.decisions.WithLabelValues(name, "rate_limited"),
		missing:         m.decisions.WithLabelValues(name, "missing_key"),
		shadowDenied:    m.shadow.WithLabelValues(name),
		usage:           m.usage.WithLabelValues(name),
		delayedAdmitted: m.delayed.WithLabelValues(name, "admitted"),
		delayedRefused:  m.delayed.WithLabelValues(name, "rate_limited"),
		delayedGone:     m.delayed.WithLabelValues(name, "client_closed"),
	}
}

// policyItem renders a rule's RateLimit-Policy item for an effective
// limit: "name";q=L;w=W, with ;qu="tokens" or ;qu="usd" for token and
// money rules (their amounts in dollars), ;burst=B for a token bucket.
func policyItem(ru *limits.Rule, quoted string, limit, burst int64, c costKind) string {
	var period time.Duration
	if ru.Algorithm == limits.Calendar {
		s, e := ru.Bounds(time.Now())
		period = e.Sub(s)
	}
	return policyItemFor(ru, quoted, limit, burst, c, period)
}

// policyItemFor is policyItem with w the given period's length when it
// is not 0 (a calendar rule's current period: a day of 23 to 25 hours, a
// week, a month).
func policyItemFor(ru *limits.Rule, quoted string, limit, burst int64, c costKind, period time.Duration) string {
	amount := func(n int64) string { return strconv.FormatInt(n, 10) }
	if c == costUSD {
		amount = config.Dollars // the counters are micro-dollars
	}
	w := ru.Window
	if period > 0 {
		w = period
	}
	s := quoted + ";q=" + amount(limit) + ";w=" + strconv.FormatInt(ceilSeconds(w), 10)
	switch c.unit() {
	case costInput:
		s += `;qu="tokens"`
	case costUSD:
		s += `;qu="usd"`
	}
	if ru.Algorithm == limits.TokenBucket {
		s += ";burst=" + amount(burst)
	}
	return s
}

// applying appends the rules whose methods and paths match r, in
// evaluation order. protected says r is a POST to a PROTECTED_PATHS entry;
// protectedPaths matches r's path against those entries whatever its
// method (for rules on other methods of those paths).
func (pol *policy) applying(r *http.Request, protected bool, protectedPaths *routes, out []*rule) []*rule {
	checked, onPath := false, false
	onProtectedPath := func() bool {
		if !checked {
			rt, _ := protectedPaths.match(r)
			checked, onPath = true, rt != nil
		}
		return onPath
	}
	for _, ru := range pol.rules {
		if ru.matches(r, protected, onProtectedPath) {
			out = append(out, ru)
		}
	}
	return out
}

// bodyFields are the body key parts the applying rules read: the one body
// rule's own list (the common case, no allocation), or the union of
// several. Rules that do not apply never make their fields read, so a body
// they would not parse cannot be refused for them.
func bodyFields(cands []*rule) *tokens.Fields {
	var one *rule
	var union *tokens.Fields
	for _, ru := range cands {
		if !ru.needsBody || len(ru.fields.JSON)+len(ru.fields.XML)+len(ru.fields.Form) == 0 {
			continue
		}
		if one == nil {
			one = ru
			continue
		}
		if union == nil {
			union = &tokens.Fields{}
			merge(union, &one.fields)
		}
		merge(union, &ru.fields)
	}
	switch {
	case union != nil:
		return union
	case one != nil:
		return &one.fields
	}
	return nil
}

func merge(dst, src *tokens.Fields) {
	add := func(d *[]string, s []string) {
		for _, n := range s {
			if !slices.Contains(*d, n) {
				*d = append(*d, n)
			}
		}
	}
	add(&dst.JSON, src.JSON)
	add(&dst.XML, src.XML)
	add(&dst.Form, src.Form)
}
