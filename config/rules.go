package config

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Rule is one [[rule]] table of the file (SPEC §7.1), decoded and with its
// defaults applied. Validate checks it; the proxy compiles it.
type Rule struct {
	Name         string
	Paths        []string    // nil: PROTECTED_PATHS
	Methods      []string    // upper case; ["*"] for any
	When         []Condition // sorted by part: all must hold for the rule to apply
	Unless       []Condition // sorted by part: when all hold, the rule does not apply
	Key          []string    // key parts (SPEC §7.2), in order
	OnMissingKey string      // "skip" or "reject"
	Algorithm    string      // "sliding_window", "token_bucket", "calendar" or "concurrency"
	Limit        int64
	Window       time.Duration // not used by calendar
	// Period is a calendar rule's window: "day", "week" (ISO, from
	// Monday) or "month"; Timezone the IANA zone whose midnight starts a
	// period ("UTC" by default) and Location that zone loaded.
	Period   string
	Timezone string
	Location *time.Location
	Burst    int64 // token_bucket: capacity; meaningful when BurstSet
	BurstSet bool
	Cost     string // CostRequests, CostInputTokens or CostTotalTokens
	// Output is what a total_tokens or usd rule does with the output a
	// request may produce: OutputReserve (reserve what it asks for) or
	// OutputClamp (lower its output cap to what the budget has left).
	// MinOutput is the smallest cap a clamping rule sends (default 16).
	Output    string
	MinOutput int64
	Action    string // "reject", "delay" or "shadow"
	MaxDelay  time.Duration
	Tiers     []Tier     // sorted by plan
	Overrides []Override // sorted by key
}

// Condition is one entry of a rule's `when` or `unless`: a key part and
// the values it may have (any of them), each exact or, ending in *, a
// prefix; for the ip part also a CIDR ("10.0.0.0/8").
type Condition struct {
	Part   string
	Values []string
}

// Tier is a plan's limit on one rule (SPEC §7.4).
type Tier struct {
	Plan      string
	Limit     int64
	Unlimited bool
}

// Override is one key's limit on one rule, in the key's public form.
type Override struct {
	Key       string
	Limit     int64
	Unlimited bool
}

// Rule field values of SPEC §7.1.
const (
	AlgSlidingWindow = "sliding_window"
	AlgTokenBucket   = "token_bucket"
	AlgCalendar      = "calendar"
	AlgConcurrency   = "concurrency"

	// A calendar rule's periods.
	PeriodDay       = "day"
	PeriodWeek      = "week"
	PeriodMonth     = "month"
	ActionReject    = "reject"
	ActionDelay     = "delay"
	ActionShadow    = "shadow"
	MissingSkip     = "skip"
	MissingReject   = "reject"
	CostRequests    = "requests"
	CostInputTokens = "input_tokens" // the input estimate, charged at admission (SPEC §8)
	CostTotalTokens = "total_tokens" // estimate plus requested output, settled to the reported usage
	CostUSD         = "usd"          // dollars at the [price] tables' prices, reserved and settled (SPEC §8.1)
	OutputReserve   = "reserve"      // the requested output is reserved, never shrunk (SPEC §8)
	OutputClamp     = "clamp"        // the output cap is lowered to what the budget has left (SPEC §8.2)
	// DefaultMinOutput is a clamping rule's smallest output cap.
	DefaultMinOutput = 16
)

// BuiltinRule is the name of the rule CHAT_RPM makes.
const BuiltinRule = "chat_rpm"

var ruleName = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)

// ruleFields are the keys a [[rule]] table may have.
var ruleFields = []string{"name", "paths", "methods", "when", "unless", "key", "on_missing_key", "algorithm", "limit", "window",
	"timezone", "burst", "cost", "output", "min_output", "action", "max_delay", "tiers", "overrides"}

// decodeRules reads the file's [[rule]] tables. Each problem is one error
// naming the rule and the field: rule "sifen-per-ruc": window "10": missing unit.
func decodeRules(raw any) ([]Rule, []error) {
	var tables []map[string]any
	switch x := raw.(type) {
	case []map[string]any:
		tables = x
	case []any:
		for _, e := range x {
			m, ok := e.(map[string]any)
			if !ok {
				return nil, []error{errors.New("rule: must be an array of tables ([[rule]])")}
			}
			tables = append(tables, m)
		}
	default:
		return nil, []error{errors.New("rule: must be an array of tables ([[rule]])")}
	}
	var rules []Rule
	var errs []error
	for i, t := range tables {
		r, rerrs := decodeRule(i, t)
		rules = append(rules, r)
		errs = append(errs, rerrs...)
	}
	return rules, errs
}

func decodeRule(i int, t map[string]any) (Rule, []error) {
	r := Rule{Methods: []string{http.MethodPost}, Key: []string{"caller"}, OnMissingKey: MissingSkip,
		Algorithm: AlgSlidingWindow, Window: time.Minute, Cost: CostRequests, Action: ActionReject, Limit: -1,
		Output: OutputReserve, MinOutput: DefaultMinOutput}
	label := fmt.Sprintf("rule #%d", i+1)
	if s, ok := t["name"].(string); ok && s != "" {
		r.Name = s
		label = "rule " + strconv.Quote(s)
	}
	var errs []error
	bad := reporter(label, &errs)
	for _, k := range unknownKeys(t, ruleFields) {
		bad(k, nil, "unknown field (a rule has %s)", strings.Join(ruleFields, ", "))
	}
	if v, ok := t["name"]; ok {
		if _, isStr := v.(string); !isStr {
			bad("name", v, "not a string")
		}
	}
	strField := func(field string, dst *string) {
		if v, ok := t[field]; ok {
			s, ok := v.(string)
			if !ok {
				bad(field, v, "not a string")
				return
			}
			*dst = s
		}
	}
	strList := func(field string, dst *[]string) {
		v, ok := t[field]
		if !ok {
			return
		}
		out, err := readStrings(v)
		if err != nil {
			bad(field, v, "%v", err)
			return
		}
		*dst = out
	}
	durField := func(field string, dst *time.Duration) {
		v, ok := t[field]
		if !ok {
			return
		}
		d, err := readDuration(v)
		if err != nil {
			bad(field, v, "%v", err)
			return
		}
		*dst = d
	}
	strList("paths", &r.Paths)
	if _, ok := t["paths"]; ok && r.Paths == nil {
		r.Paths = []string{}
	}
	strList("methods", &r.Methods)
	for j, m := range r.Methods {
		r.Methods[j] = strings.ToUpper(strings.TrimSpace(m))
	}
	strList("key", &r.Key)
	strField("on_missing_key", &r.OnMissingKey)
	strField("algorithm", &r.Algorithm)
	strField("cost", &r.Cost)
	strField("output", &r.Output)
	if v, ok := t["min_output"]; ok {
		n, err := wholeNumber(v)
		switch {
		case err != nil || n < 1:
			bad("min_output", v, "must be an integer ≥ 1 (output tokens)")
		case r.Output != OutputClamp:
			bad("min_output", v, `only with output = "clamp"`)
		default:
			r.MinOutput = n
		}
	}
	strField("action", &r.Action)
	if r.Algorithm == AlgCalendar {
		r.Window = 0
		if v, ok := t["window"]; ok {
			p, isStr := v.(string)
			if !isStr || (p != PeriodDay && p != PeriodWeek && p != PeriodMonth) {
				bad("window", v, `a calendar rule's window is "day", "week" or "month"`)
			} else {
				r.Period = p
			}
		} else {
			bad("window", nil, `required with algorithm = "calendar": "day", "week" or "month"`)
		}
		r.Timezone = "UTC"
		strField("timezone", &r.Timezone)
		loc, err := time.LoadLocation(r.Timezone)
		if err != nil || r.Timezone == "" || r.Timezone == "Local" {
			bad("timezone", r.Timezone, "not an IANA time zone (such as \"Europe/Rome\")")
			loc = time.UTC
		}
		r.Location = loc
	} else {
		durField("window", &r.Window)
		if v, ok := t["timezone"]; ok {
			bad("timezone", v, `only with algorithm = "calendar"`)
		}
	}
	durField("max_delay", &r.MaxDelay)
	// A usd rule's amounts are dollars, kept as integers of 10⁻⁶ USD.
	amount := wholeNumber
	if r.Cost == CostUSD {
		amount = microDollars
	}
	if v, ok := t["limit"]; ok {
		n, err := amount(v)
		if err != nil {
			bad("limit", v, "%v", err)
			r.Limit = 0 // reported: no second error about it
		} else {
			r.Limit = n
		}
	} else {
		bad("limit", nil, "required (admissions per window, an integer ≥ 0)")
		r.Limit = 0
	}
	if v, ok := t["burst"]; ok {
		n, err := amount(v)
		if err != nil {
			bad("burst", v, "%v", err)
		} else {
			r.Burst, r.BurstSet = n, true
		}
	}
	conditions := func(field string) []Condition {
		v, ok := t[field]
		if !ok {
			return nil
		}
		m, ok := v.(map[string]any)
		if !ok {
			bad(field, v, `not a table ({ "header:X-Env" = "prod", ip = ["10.0.0.0/8"] })`)
			return nil
		}
		var out []Condition
		for part, pv := range m {
			var values []string
			switch x := pv.(type) {
			case string:
				values = []string{x}
			case []any:
				for _, e := range x {
					s, ok := e.(string)
					if !ok {
						bad(field, pv, "%s: every value must be a string", part)
						values = nil
						break
					}
					values = append(values, s)
				}
				if len(x) == 0 {
					bad(field, pv, "%s: an empty list (no value could match)", part)
				}
			default:
				bad(field, pv, "%s: the value is not a string or a list of strings", part)
			}
			if len(values) > 0 {
				out = append(out, Condition{Part: part, Values: values})
			}
		}
		sort.Slice(out, func(a, b int) bool { return out[a].Part < out[b].Part })
		return out
	}
	r.When, r.Unless = conditions("when"), conditions("unless")
	limitTable := func(field string, add func(name string, n int64, unlimited bool)) {
		v, ok := t[field]
		if !ok {
			return
		}
		m, ok := v.(map[string]any)
		if !ok {
			bad(field, v, "not a table")
			return
		}
		for name, lv := range m {
			if s, ok := lv.(string); ok && s == "unlimited" {
				add(name, 0, true)
				continue
			}
			n, err := amount(lv)
			if err != nil || n < 0 {
				what := "an integer"
				if r.Cost == CostUSD {
					what = "an amount of dollars"
				}
				bad(field, lv, "%s: must be %s ≥ 0 or \"unlimited\"", name, what)
				continue
			}
			add(name, n, false)
		}
	}
	limitTable("tiers", func(name string, n int64, u bool) {
		r.Tiers = append(r.Tiers, Tier{Plan: name, Limit: n, Unlimited: u})
	})
	sort.Slice(r.Tiers, func(a, b int) bool { return r.Tiers[a].Plan < r.Tiers[b].Plan })
	limitTable("overrides", func(name string, n int64, u bool) {
		r.Overrides = append(r.Overrides, Override{Key: name, Limit: n, Unlimited: u})
	})
	sort.Slice(r.Overrides, func(a, b int) bool { return r.Overrides[a].Key < r.Overrides[b].Key })
	return r, errs
}

// readStrings reads a TOML array of strings.
func readStrings(v any) ([]string, error) {
	var out []string
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, errors.New("not a list of strings")
			}
			out = append(out, s)
		}
	case []string:
		out = x
	default:
		return nil, errors.New("not a list of strings")
	}
	return out, nil
}

// readDuration reads a duration of a [[rule]] or [[upstream_group]]
// table: a string with a unit ("10s", "5m"); a bare number is "missing unit".
func readDuration(v any) (time.Duration, error) {
	s, ok := v.(string)
	if !ok {
		return 0, errors.New("missing unit")
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		if _, numErr := strconv.ParseFloat(strings.TrimSpace(s), 64); numErr == nil {
			return 0, errors.New("missing unit")
		}
		return 0, errors.New("not a duration")
	}
	return d, nil
}

// reporter returns the function that records a table's problems as
// "<label>: <field>[ <value>]: <message>", the form every error about a
// [[rule]], [price] or [[upstream_group]] takes.
func reporter(label string, errs *[]error) func(field string, v any, format string, args ...any) {
	return func(field string, v any, format string, args ...any) {
		where := field
		if v != nil {
			where += " " + showValue(v)
		}
		*errs = append(*errs, fmt.Errorf("%s: %s: %s", label, where, fmt.Sprintf(format, args...)))
	}
}

// unknownKeys are the keys of t that allowed lacks, sorted.
func unknownKeys(t map[string]any, allowed []string) []string {
	var out []string
	for k := range t {
		if !slices.Contains(allowed, k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// wholeNumber reads an integer given as a TOML integer (or a float with no
// fraction, or a numeric string).
func wholeNumber(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case int:
		return int64(x), nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), nil
		}
	case string:
		if n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
			return n, nil
		}
	}
	return 0, errors.New("not an integer")
}

func showValue(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case []any, map[string]any:
		return fmt.Sprintf("%v", x)
	default:
		return fmt.Sprint(x)
	}
}

// KeyPartKinds are the key parts of SPEC §7.2 that take no name.
var KeyPartKinds = []string{"global", "caller", "api_key", "ip", "method", "path", "model", "tier"}

// CheckKeyPart reports whether part is a key part of SPEC §7.2:
// a bare kind, or header:NAME, query:NAME, json:a.b.c, xml:Name, form:NAME.
// or jwt:CLAIM (a claim of the verified JWT, SPEC §7.5).
func CheckKeyPart(part string) error {
	if slices.Contains(KeyPartKinds, part) {
		return nil
	}
	kind, name, ok := strings.Cut(part, ":")
	if !ok {
		return fmt.Errorf("unknown key part (one of %s, or header:, query:, json:, xml:, form:, jwt:)", strings.Join(KeyPartKinds, ", "))
	}
	if name == "" {
		return errors.New("a name is missing after " + kind + ":")
	}
	switch kind {
	case "header":
		if !isToken(name) {
			return errors.New("not a header name")
		}
	case "query", "form":
		// any name
	case "json":
		for seg := range strings.SplitSeq(name, ".") {
			if seg == "" {
				return errors.New("an empty segment in the JSON path (write json:a.b.c)")
			}
		}
	case "xml":
		if strings.ContainsAny(name, " \t\r\n<>/&\"'=") || strings.Contains(name, ":") {
			return errors.New("not an XML local name (namespaces are ignored: write xml:dRucEm)")
		}
	case "jwt":
		if strings.TrimSpace(name) != name {
			return errors.New("a claim name has no surrounding spaces")
		}
	default:
		return fmt.Errorf("unknown key part kind %q (header, query, json, xml, form or jwt)", kind)
	}
	return nil
}

// BodyPart reports whether a key part is read from the request body.
func BodyPart(part string) bool {
	if part == "model" {
		return true
	}
	kind, _, _ := strings.Cut(part, ":")
	return kind == "json" || kind == "xml" || kind == "form"
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}
