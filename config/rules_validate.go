package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// validateRules checks the rules and the settings they use; each error
// names the rule and the field.
func (c *Config) validateRules() []error {
	var errs []error
	seen := map[string]bool{}
	if c.ChatRPMRule() {
		seen[BuiltinRule] = true
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		label := fmt.Sprintf("rule #%d", i+1)
		if r.Name != "" {
			label = "rule " + strconv.Quote(r.Name)
		}
		bad := reporter(label, &errs)
		checkRuleName(r, seen, bad)
		seen[r.Name] = true
		checkRuleMatch(r, bad)
		c.checkRuleKey(r, bad)
		c.checkRuleConditions(r, bad)
		if r.OnMissingKey != MissingSkip && r.OnMissingKey != MissingReject {
			bad("on_missing_key", r.OnMissingKey, `must be "skip" or "reject"`)
		}
		checkRuleAlgorithm(r, bad)
		c.checkRuleCost(r, bad)
		checkRuleAction(r, bad)
		if len(r.Tiers) > 0 && !c.plans() {
			bad("tiers", nil, "needs tier_from or api_keys_file (where a caller's plan comes from, e.g. tier_from = \"header:X-Plan\")")
		}
		for _, o := range r.Overrides {
			if err := checkOverrideKey(o.Key, r.Key); err != nil {
				bad("overrides", o.Key, "%v", err)
			}
		}
	}
	return errs
}

// badField reports one problem of one field (see reporter).
type badField = func(field string, value any, format string, args ...any)

func checkRuleName(r *Rule, seen map[string]bool, bad badField) {
	switch {
	case r.Name == "":
		bad("name", nil, "required ([a-z0-9_.-], at most 64 characters)")
	case !ruleName.MatchString(r.Name):
		bad("name", r.Name, "must be 1 to 64 of a-z, 0-9, _, . and -")
	case seen[r.Name] && r.Name == BuiltinRule:
		bad("name", r.Name, "taken by the built-in rule that chat_rpm makes")
	case seen[r.Name]:
		bad("name", r.Name, "used by an earlier rule")
	}
}

// checkRuleMatch checks the paths and methods the rule applies to.
func checkRuleMatch(r *Rule, bad badField) {
	if r.Paths != nil && len(r.Paths) == 0 {
		bad("paths", nil, "empty: leave it out for protected_paths, or list at least one path")
	}
	for _, p := range r.Paths {
		if err := checkProtectedPath(p); err != nil {
			bad("paths", p, "%v", err)
		}
	}
	if len(r.Methods) == 0 {
		bad("methods", nil, `empty: leave it out for ["POST"], or write ["*"] for any`)
	}
	for _, m := range r.Methods {
		if m != "*" && !isToken(m) || m == "*" && len(r.Methods) > 1 {
			bad("methods", m, `not a method (write ["POST"], or ["*"] alone for any)`)
		}
	}
}

func (c *Config) checkRuleKey(r *Rule, bad badField) {
	if len(r.Key) == 0 {
		bad("key", nil, `empty: leave it out for ["caller"]`)
	}
	for _, p := range r.Key {
		if err := CheckKeyPart(p); err != nil {
			bad("key", p, "%v", err)
		} else if strings.HasPrefix(p, "jwt:") && !c.JWT() {
			bad("key", p, "a jwt: key part needs verified JWT identity: set jwt_hs256_secret or jwt_jwks")
		}
		if p == "tier" && !c.plans() {
			bad("key", p, "needs tier_from or api_keys_file (where a caller's plan comes from)")
		}
	}
}

// checkRuleConditions checks when and unless.
func (c *Config) checkRuleConditions(r *Rule, bad badField) {
	for _, f := range []struct {
		name  string
		conds []Condition
	}{{"when", r.When}, {"unless", r.Unless}} {
		for _, w := range f.conds {
			if err := CheckKeyPart(w.Part); err == nil && strings.HasPrefix(w.Part, "jwt:") && !c.JWT() {
				bad(f.name, w.Part, "a jwt: condition needs verified JWT identity: set jwt_hs256_secret or jwt_jwks")
			} else if err != nil {
				bad(f.name, w.Part, "%v", err)
			}
			if w.Part == "tier" && !c.plans() {
				bad(f.name, w.Part, "needs tier_from or api_keys_file (where a caller's plan comes from)")
			}
			if w.Part != "ip" {
				continue
			}
			for _, v := range w.Values {
				if !strings.Contains(v, "/") {
					continue
				}
				if _, err := netip.ParsePrefix(v); err != nil {
					bad(f.name, v, "ip: not a CIDR (write \"10.0.0.0/8\" or \"2001:db8::/32\")")
				}
			}
		}
	}
}

// amountOf is a limit as written: dollars for a usd rule.
func amountOf(r *Rule, v int64) any {
	if r.Cost == CostUSD {
		return dollarAmount(v)
	}
	return v
}

// checkRuleAlgorithm checks the algorithm and the numbers it reads.
func checkRuleAlgorithm(r *Rule, bad badField) {
	switch r.Algorithm {
	case AlgTokenBucket:
	case AlgSlidingWindow, AlgCalendar, AlgConcurrency:
		if r.BurstSet {
			bad("burst", amountOf(r, r.Burst), `only with algorithm = "token_bucket"`)
		}
		if r.Algorithm == AlgConcurrency && r.Cost != CostRequests {
			bad("cost", r.Cost, `a concurrency rule counts requests in flight: its cost is "requests"`)
		}
	default:
		bad("algorithm", r.Algorithm, `must be "sliding_window", "token_bucket", "calendar" or "concurrency"`)
	}
	if r.Limit < 0 {
		bad("limit", amountOf(r, r.Limit), "must not be negative")
	}
	if r.BurstSet && r.Burst < 0 {
		bad("burst", amountOf(r, r.Burst), "must not be negative")
	}
	if r.Window < time.Second && r.Algorithm != AlgCalendar && r.Algorithm != AlgConcurrency {
		bad("window", durationText(r.Window), "must be at least 1s")
	}
}

// checkRuleCost checks cost, output and min_output.
func (c *Config) checkRuleCost(r *Rule, bad badField) {
	switch r.Cost {
	case CostRequests, CostInputTokens, CostTotalTokens:
	case CostUSD:
		if len(c.Prices) == 0 {
			bad("cost", r.Cost, `needs [price."MODEL"] entries: a usd rule charges each model at its price per million input and output tokens`)
		}
	default:
		bad("cost", r.Cost, `must be "requests", "input_tokens", "total_tokens" or "usd"`)
	}
	switch r.Output {
	case "", OutputReserve: // "": a rule built in code (chat_rpm)
	case OutputClamp:
		if r.Cost != CostTotalTokens && r.Cost != CostUSD {
			bad("output", r.Output, `"clamp" needs cost = "total_tokens" or "usd" (a budget that reserves output)`)
		}
	default:
		bad("output", r.Output, `must be "reserve" or "clamp"`)
	}
	if r.MinOutput < 0 {
		bad("min_output", r.MinOutput, "must be an integer ≥ 1 (output tokens)")
	}
}

// checkRuleAction checks action and max_delay.
func checkRuleAction(r *Rule, bad badField) {
	switch r.Action {
	case ActionReject, ActionShadow:
		if r.MaxDelay != 0 {
			bad("max_delay", durationText(r.MaxDelay), `only with action = "delay"`)
		}
	case ActionDelay:
		if r.MaxDelay < 0 {
			bad("max_delay", durationText(r.MaxDelay), "must be positive")
		} else if r.MaxDelay == 0 {
			bad("max_delay", nil, `required with action = "delay" (the longest a request is held, e.g. "5s")`)
		}
	default:
		bad("action", r.Action, `must be "reject", "delay" or "shadow"`)
	}
}

// checkOverrideKey checks that an override names a key of the rule's
// shape: its public form (SPEC §5), one name=value per key part, in order.
func checkOverrideKey(k string, parts []string) error {
	got := strings.Split(k, "&")
	if len(got) != len(parts) {
		return fmt.Errorf("not a key of this rule: write %s", keyShape(parts))
	}
	for i, g := range got {
		name, _, ok := strings.Cut(g, "=")
		if !ok || name != parts[i] {
			return fmt.Errorf("not a key of this rule: write %s", keyShape(parts))
		}
	}
	return nil
}

func keyShape(parts []string) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = p + "=…"
	}
	return strconv.Quote(strings.Join(s, "&"))
}

// ChatRPMRule reports whether the built-in chat_rpm rule exists: when the
// file defines no [[rule]], or when CHAT_RPM is set explicitly (SPEC §7.1).
func (c *Config) ChatRPMRule() bool {
	return len(c.Rules) == 0 || c.IsSet("chat_rpm")
}

// checkTierFrom checks TIER_FROM: header:NAME, or jwt:CLAIM when JWT
// verification is configured (jwt says whether it is).
func checkTierFrom(s string, jwt bool) error {
	kind, name, ok := strings.Cut(s, ":")
	switch {
	case !ok || name == "":
		return errors.New(`write "header:NAME"`)
	case kind == "header":
		if !isToken(name) {
			return errors.New("not a header name")
		}
		return nil
	case kind == "jwt":
		if !jwt {
			return errors.New("a plan from a JWT claim needs verified JWT identity: set jwt_hs256_secret or jwt_jwks")
		}
		return nil
	}
	return errors.New(`write "header:NAME" or "jwt:CLAIM"`)
}

// dollarAmount is micro-dollars shown in dollars in a message.
type dollarAmount int64

func (d dollarAmount) String() string { return Dollars(int64(d)) }
