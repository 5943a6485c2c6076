package proxy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/knadh/koanf/parsers/toml/v2"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// The admin API (SPEC §10): JSON in and out, on ADMIN_ADDR only, behind
// ADMIN_TOKEN when it is set. Live changes compile a new policy from the
// running configuration plus the changes and swap it in, as a reload does;
// they are never written to the file, and a reload drops them.

// adminAuth refuses a request without the bearer ADMIN_TOKEN (when one is
// set). The token is read from the running policy, so a reload can rotate
// it. The comparison takes the same time whatever the token sent.
func (p *Proxy) adminAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := p.policy.Load().cfg.AdminToken
		if want != "" {
			got := sha256.Sum256([]byte(bearer(r)))
			exp := sha256.Sum256([]byte(want))
			if subtle.ConstantTimeCompare(got[:], exp[:]) != 1 {
				p.log.Info("admin request refused: missing or wrong ADMIN_TOKEN", "path", r.URL.Path, "peer", r.RemoteAddr)
				w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit-proxy admin"`)
				adminError(w, http.StatusUnauthorized, codeUnauthorized, "This endpoint needs Authorization: Bearer <ADMIN_TOKEN>.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// adminRoutes mounts the admin API on r (under /admin).
func (p *Proxy) adminRoutes(r chi.Router) {
	r.Use(p.adminAuth)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		adminError(w, http.StatusNotFound, "not_found", "No such admin endpoint: see GET /admin/config, /admin/rules, /admin/limits/{rule}?key=K.")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		adminError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path+".")
	})
	r.Get("/config", p.adminConfig)
	r.Get("/rules", p.adminRules)
	r.Get("/rules/{rule}", p.adminRule)
	r.Put("/rules/{rule}", p.adminSetRule)
	r.Get("/limits/{rule}", p.adminLimits)
	r.Delete("/limits/{rule}", p.adminResetKey)
	r.Put("/limits/{rule}", p.adminOverride)
	r.Post("/reload", p.adminReload)
	r.Post("/tokens", p.adminTokens)
}

// adminError answers an admin request with {"error":code,"message":…}.
func adminError(w http.ResponseWriter, status int, code, message string, extra ...field) {
	m := map[string]any{"error": code, "message": message}
	for _, f := range extra {
		m[f.name] = f.value
	}
	writeAdminJSON(w, status, m)
}

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		b.Reset()
		b.WriteString(`{"error":"internal","message":"could not encode the answer"}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// adminConfig is GET /admin/config: the effective configuration as -check
// prints it (secrets redacted), as JSON, with the live changes applied and
// listed.
func (p *Proxy) adminConfig(w http.ResponseWriter, _ *http.Request) {
	pol := p.policy.Load()
	c := *pol.cfg
	c.Rules = slices.Clone(c.Rules)
	for i := range c.Rules {
		pol.live.apply(&c.Rules[i])
	}
	if lr, ok := pol.live.rules[config.BuiltinRule]; ok && lr.limit != nil && c.ChatRPMRule() {
		c.ChatRPM = *lr.limit
	}
	var b bytes.Buffer
	if err := c.Write(&b); err != nil {
		adminError(w, http.StatusInternalServerError, "internal", "could not render the configuration")
		return
	}
	m, err := toml.Parser().Unmarshal(b.Bytes())
	if err != nil {
		adminError(w, http.StatusInternalServerError, "internal", "could not render the configuration: "+err.Error())
		return
	}
	live := pol.live.describe()
	if live == nil {
		live = []string{}
	}
	m["live_changes"] = live
	writeAdminJSON(w, http.StatusOK, m)
}

// ruleView is a rule with its live parameters (GET /admin/rules).
type ruleView struct {
	Name          string         `json:"name"`
	Builtin       bool           `json:"builtin,omitempty"`
	Index         int            `json:"index"` // evaluation order
	Paths         []string       `json:"paths"`
	Methods       []string       `json:"methods"`
	When          map[string]any `json:"when,omitempty"`
	Unless        map[string]any `json:"unless,omitempty"`
	Key           []string       `json:"key"`
	OnMissingKey  string         `json:"on_missing_key"`
	Algorithm     string         `json:"algorithm"`
	Limit         json.Number    `json:"limit"`
	Window        string         `json:"window"`
	WindowSeconds json.Number    `json:"window_seconds"`
	Timezone      string         `json:"timezone,omitempty"` // calendar rules
	Burst         *json.Number   `json:"burst,omitempty"`
	Cost          string         `json:"cost"`
	Output        string         `json:"output,omitempty"`     // total_tokens and usd rules: "reserve" or "clamp"
	MinOutput     int64          `json:"min_output,omitempty"` // clamping rules
	// OutputReserve is what a request naming no output cap reserves on
	// a total_tokens or usd rule: a number of tokens, or "learned".
	OutputReserve any            `json:"output_reserve,omitempty"`
	Action        string         `json:"action"`
	MaxDelay      string         `json:"max_delay,omitempty"`
	Tiers         map[string]any `json:"tiers,omitempty"`
	Overrides     map[string]any `json:"overrides,omitempty"`
	// Live names the fields the admin API changed since the last load.
	Live []string `json:"live,omitempty"`
}

// conditionsView is a when or unless table as the file writes it: a part's
// one value as a string, several as an array.
func conditionsView(conds []config.Condition) map[string]any {
	if len(conds) == 0 {
		return nil
	}
	m := map[string]any{}
	for _, w := range conds {
		if len(w.Values) == 1 {
			m[w.Part] = w.Values[0]
		} else {
			m[w.Part] = w.Values
		}
	}
	return m
}

func (pol *policy) view(ru *rule) ruleView {
	c := &ru.conf
	amount := func(n int64) json.Number {
		if ru.cost == costUSD {
			return dollars(n)
		}
		return json.Number(strconv.FormatInt(n, 10))
	}
	limitValue := func(n int64, unlimited bool) any {
		if unlimited {
			return "unlimited"
		}
		return amount(n)
	}
	v := ruleView{Name: c.Name, Builtin: c.Name == config.BuiltinRule && pol.cfg.ChatRPMRule(), Index: ru.index,
		Paths: c.Paths, Methods: c.Methods, Key: c.Key, OnMissingKey: c.OnMissingKey, Algorithm: c.Algorithm,
		Limit: amount(c.Limit), Window: durationString(c.Window), WindowSeconds: seconds(c.Window), Cost: c.Cost,
		Action: c.Action}
	if ru.cost.settles() {
		v.Output = config.OutputReserve
		v.OutputReserve = pol.cfg.OutputTokenReserve
		if pol.cfg.OutputReserveLearned {
			v.OutputReserve = config.OutputReserveLearned
		}
		if ru.clamp {
			v.Output, v.MinOutput = config.OutputClamp, ru.minOutput
		}
	}
	if v.Paths == nil {
		v.Paths = pol.cfg.ProtectedPaths
	}
	v.When, v.Unless = conditionsView(c.When), conditionsView(c.Unless)
	if c.Algorithm == config.AlgTokenBucket {
		b := amount(ru.lim.Burst)
		v.Burst = &b
	}
	if c.Algorithm == config.AlgCalendar {
		// The period's name, and the current period's length.
		s, e := ru.lim.Bounds(time.Now())
		v.Window, v.WindowSeconds, v.Timezone = c.Period, seconds(e.Sub(s)), c.Timezone
	}
	if c.Action == config.ActionDelay {
		v.MaxDelay = durationString(c.MaxDelay)
	}
	if len(c.Tiers) > 0 {
		v.Tiers = map[string]any{}
		for _, t := range c.Tiers {
			v.Tiers[t.Plan] = limitValue(t.Limit, t.Unlimited)
		}
	}
	if len(c.Overrides) > 0 {
		v.Overrides = map[string]any{}
		for _, o := range c.Overrides {
			v.Overrides[o.Key] = limitValue(o.Limit, o.Unlimited)
		}
	}
	if lr, ok := pol.live.rules[c.Name]; ok {
		if lr.limit != nil {
			v.Live = append(v.Live, "limit")
		}
		if lr.burst != nil {
			v.Live = append(v.Live, "burst")
		}
		if lr.action != "" {
			v.Live = append(v.Live, "action")
		}
		if lr.maxDelay > 0 {
			v.Live = append(v.Live, "max_delay")
		}
	}
	if len(pol.live.overrides[c.Name]) > 0 {
		v.Live = append(v.Live, "overrides")
	}
	return v
}

// durationString writes a duration as the configuration does ("60s",
// "24h0m0s" is "86400s").
func durationString(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// seconds is d in seconds: whole when it is, else with up to 3 decimals.
func seconds(d time.Duration) json.Number {
	if d%time.Second == 0 {
		return json.Number(strconv.FormatInt(int64(d/time.Second), 10))
	}
	return json.Number(strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
}

func (p *Proxy) adminRules(w http.ResponseWriter, _ *http.Request) {
	pol := p.policy.Load()
	out := make([]ruleView, 0, len(pol.rules))
	for _, ru := range pol.rules {
		out = append(out, pol.view(ru))
	}
	groups := make([]groupView, 0, len(pol.cfg.UpstreamGroups))
	for i := range pol.cfg.UpstreamGroups {
		groups = append(groups, groupViewOf(&pol.cfg.UpstreamGroups[i], pol.cfg.ProtectedPaths))
	}
	writeAdminJSON(w, http.StatusOK, map[string]any{"rules": out, "upstream_groups": groups})
}

// groupView is an upstream group's limits and turns (GET /admin/rules).
type groupView struct {
	Name        string           `json:"name"`
	Paths       []string         `json:"paths"`
	MaxInFlight int64            `json:"max_in_flight"`
	Rate        int64            `json:"rate"`
	Per         string           `json:"per"`
	Queue       int64            `json:"queue"`
	MaxWait     string           `json:"max_wait"`
	Priorities  []string         `json:"priorities"`
	FairBy      string           `json:"fair_by"`
	FairWeights map[string]int64 `json:"fair_weights,omitempty"`
}

func groupViewOf(g *config.UpstreamGroup, protected []string) groupView {
	v := groupView{Name: g.Name, Paths: g.Paths, MaxInFlight: g.MaxInFlight, Rate: g.Rate, Per: durationString(g.Per),
		Queue: g.Queue, MaxWait: durationString(g.MaxWait), Priorities: g.Priorities, FairBy: g.FairBy,
		FairWeights: g.FairWeights}
	if v.Paths == nil {
		v.Paths = protected
	}
	return v
}

// ruleOf finds the {rule} of the path, answering 404 when there is none.
func (p *Proxy) ruleOf(w http.ResponseWriter, r *http.Request) (*policy, *rule) {
	pol := p.policy.Load()
	name := chi.URLParam(r, "rule")
	if ru := pol.ruleNamed(name); ru != nil {
		return pol, ru
	}
	adminError(w, http.StatusNotFound, "unknown_rule", "No rule is named "+strconv.Quote(name)+".", field{"rule", name})
	return nil, nil
}

func (p *Proxy) adminRule(w http.ResponseWriter, r *http.Request) {
	if pol, ru := p.ruleOf(w, r); ru != nil {
		writeAdminJSON(w, http.StatusOK, pol.view(ru))
	}
}

// maxAdminBody bounds the JSON bodies of live changes.
const maxAdminBody = 64 << 10

// readChange decodes a live change's JSON object, refusing unknown
// members (a misspelt field must not be silently ignored).
func readChange(w http.ResponseWriter, r *http.Request, allowed ...string) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err := dec.Decode(&m); err != nil || m == nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			adminError(w, http.StatusRequestEntityTooLarge, codeBodyTooLarge, "An admin request body is at most 64 KiB.")
			return nil, false
		}
		adminError(w, http.StatusBadRequest, codeInvalidRequest, "The body must be a JSON object, such as {\"limit\": 10}.")
		return nil, false
	}
	if dec.More() {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, "The body must be one JSON object.")
		return nil, false
	}
	for k := range m {
		if !slices.Contains(allowed, k) {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf("Unknown member %q: this endpoint takes %s.", k, strings.Join(allowed, ", ")))
			return nil, false
		}
	}
	if len(m) == 0 {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, "Nothing to change: give "+strings.Join(allowed, ", ")+".")
		return nil, false
	}
	return m, true
}

// amountOf reads a limit or burst of a rule: a whole number ≥ 0, or for a
// usd rule an amount of dollars (a number or a decimal string); with
// unlimited, also the string "unlimited".
func amountOf(raw json.RawMessage, ru *rule, unlimitedOK bool) (n int64, unlimited bool, err error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if unlimitedOK && s == "unlimited" {
			return 0, true, nil
		}
		if ru.cost != costUSD {
			if unlimitedOK {
				return 0, false, errors.New(`must be a whole number ≥ 0 or "unlimited"`)
			}
			return 0, false, errors.New("must be a whole number ≥ 0")
		}
	} else {
		var num json.Number
		if err := json.Unmarshal(raw, &num); err != nil {
			return 0, false, errors.New("must be a number")
		}
		s = num.String()
	}
	if ru.cost == costUSD {
		n, err = config.ParseDollars(s)
		if errors.Is(err, config.ErrTooPrecise) {
			return 0, false, errors.New("must be dollars with at most 6 decimals")
		}
	} else {
		n, err = strconv.ParseInt(s, 10, 64)
	}
	if err != nil || n < 0 {
		return 0, false, errors.New("must be a whole number ≥ 0 (dollars for a usd rule)")
	}
	return n, false, nil
}

// adminSetRule is PUT /admin/rules/{rule} {"limit","burst","action","max_delay"}:
// a live change of the rule's parameters; its counters are kept.
func (p *Proxy) adminSetRule(w http.ResponseWriter, r *http.Request) {
	_, ru := p.ruleOf(w, r)
	if ru == nil {
		return
	}
	m, ok := readChange(w, r, "limit", "burst", "action", "max_delay")
	if !ok {
		return
	}
	var lr liveRule
	if raw, ok := m["limit"]; ok {
		n, _, err := amountOf(raw, ru, false)
		if err != nil {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, "limit "+err.Error()+".")
			return
		}
		lr.limit = &n
	}
	if raw, ok := m["burst"]; ok {
		if ru.lim.Algorithm != limits.TokenBucket {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, "burst applies to token_bucket rules only.")
			return
		}
		n, _, err := amountOf(raw, ru, false)
		if err != nil {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, "burst "+err.Error()+".")
			return
		}
		lr.burst = &n
	}
	if raw, ok := m["action"]; ok {
		if json.Unmarshal(raw, &lr.action) != nil || !slices.Contains([]string{config.ActionReject, config.ActionDelay, config.ActionShadow}, lr.action) {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, `action must be "reject", "delay" or "shadow".`)
			return
		}
	}
	if raw, ok := m["max_delay"]; ok {
		var s string
		d, err := time.Duration(0), error(nil)
		if json.Unmarshal(raw, &s) == nil {
			d, err = time.ParseDuration(s)
		} else {
			err = errors.New("not a string")
		}
		if err != nil || d <= 0 {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, `max_delay must be a positive duration such as "5s".`)
			return
		}
		lr.maxDelay = d
	}
	action, maxDelay := ru.conf.Action, ru.conf.MaxDelay
	if lr.action != "" {
		action = lr.action
	}
	if lr.maxDelay > 0 {
		maxDelay = lr.maxDelay
	}
	if action == config.ActionDelay && maxDelay <= 0 {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, `action "delay" needs max_delay, the longest a request is held.`)
		return
	}
	name := ru.lim.Name
	pol, err := p.change(func(cur *policy, live *liveChanges) error {
		prev := live.rules[name]
		if lr.limit == nil {
			lr.limit = prev.limit
		}
		if lr.burst == nil {
			lr.burst = prev.burst
		}
		if lr.action == "" {
			lr.action = prev.action
		}
		if lr.maxDelay == 0 {
			lr.maxDelay = prev.maxDelay
		}
		live.rules[name] = lr
		return nil
	})
	if err != nil {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, err.Error())
		return
	}
	nru := pol.ruleNamed(name)
	p.log.Info("admin: rule changed live", "rule", name, "change", string(mustJSON(m)),
		"was", ruleDiffValues(ru), "now", ruleDiffValues(nru))
	writeAdminJSON(w, http.StatusOK, pol.view(nru))
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// ruleDiffValues is what a live change may touch, for the log: a usd
// rule's amounts in dollars.
func ruleDiffValues(ru *rule) string {
	c := &ru.conf
	amount := func(n int64) string {
		if ru.cost == costUSD {
			return config.Dollars(n)
		}
		return strconv.FormatInt(n, 10)
	}
	s := "limit=" + amount(c.Limit) + " action=" + c.Action
	if c.BurstSet {
		s += " burst=" + amount(c.Burst)
	}
	if c.MaxDelay > 0 {
		s += " max_delay=" + c.MaxDelay.String()
	}
	return s
}

func (pol *policy) ruleNamed(name string) *rule {
	for _, ru := range pol.rules {
		if ru.lim.Name == name {
			return ru
		}
	}
	return nil
}

// change applies a live change: f edits a copy of the live changes, the
// policy is compiled again from the running configuration with them, and
// swapped in. One change or reload at a time.
func (p *Proxy) change(f func(cur *policy, live *liveChanges) error) (*policy, error) {
	p.reload.Lock()
	defer p.reload.Unlock()
	cur := p.policy.Load()
	live := cur.live.clone()
	if err := f(cur, live); err != nil {
		return nil, err
	}
	pol, err := p.compile(cur.cfg, live, cur)
	if err != nil {
		return nil, err
	}
	p.swap(cur, pol)
	return pol, nil
}

// adminReload is POST /admin/reload.
func (p *Proxy) adminReload(w http.ResponseWriter, r *http.Request) {
	res, err := p.Reload("admin API")
	var bad *InvalidConfigError
	switch {
	case errors.As(err, &bad):
		adminError(w, http.StatusBadRequest, "invalid_configuration",
			"The configuration was not reloaded; nothing changed: "+strings.Join(bad.Errs, "; "), field{"errors", bad.Errs})
	case err != nil:
		adminError(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		if res.Changed == nil {
			res.Changed = []string{}
		}
		if res.RestartRequired == nil {
			res.RestartRequired = []string{}
		}
		if res.DroppedLive == nil {
			res.DroppedLive = []string{}
		}
		writeAdminJSON(w, http.StatusOK, map[string]any{"status": "reloaded", "changed": res.Changed,
			"restart_required": res.RestartRequired, "dropped_live_changes": res.DroppedLive})
	}
}

// adminTokens is POST /admin/tokens?model=M[&path=P]: the §4.4 estimate of
// the body, as the token cap counts it (whole, not stopped at the cap).
func (p *Proxy) adminTokens(w http.ResponseWriter, r *http.Request) {
	pol := p.policy.Load()
	path := r.URL.Query().Get("path")
	if path == "" {
		path = "/v1/chat/completions"
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, pol.cfg.MaxBodyBytes))
	if err != nil {
		adminError(w, http.StatusRequestEntityTooLarge, codeBodyTooLarge, "The body exceeds max_body_bytes.", field{"max_body_bytes", pol.cfg.MaxBodyBytes})
		return
	}
	est, err := p.tokens.Estimate(tokens.Request{Format: tokens.FormatForPath(canonicalPath(path)), ContentType: ct,
		Body: body, Model: r.URL.Query().Get("model")}, -1)
	if err != nil {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, "The body could not be read: "+oneLine(err)+".")
		return
	}
	writeAdminJSON(w, http.StatusOK, map[string]any{"estimated_tokens": est.Tokens, "encoding": est.Encoding,
		"model": est.Model, "path": path})
}
