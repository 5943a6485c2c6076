package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// UpstreamGroup is one [[upstream_group]] table (SPEC §9), with its defaults applied.
type UpstreamGroup struct {
	Name         string
	Paths        []string      // nil: PROTECTED_PATHS
	MaxInFlight  int64         // 0: no cap
	Rate         int64         // requests per Per towards the upstream; 0: no rate
	Per          time.Duration // default 1m
	Queue        int64         // requests waiting (all instances together); default 1000; 0: none wait
	MaxWait      time.Duration // default 30s; 0: none wait
	PriorityFrom string        // "" (everyone is "default"), "header:NAME", "query:NAME" or "tier"
	Priorities   []string      // highest first, lower-cased; default ["interactive","default","batch"]
	Retries      int64         // default 2
	MaxBackoff   time.Duration // default 20s
	Adaptive     *Adaptive     // nil: off
	// FairBy is the key part whose values take turns within a priority
	// (SPEC §9); "" is arrival order.
	FairBy string
	// FairWeights are requests per turn by plan (1 when absent); nil: none.
	FairWeights map[string]int64
}

// Adaptive is a group's AIMD (SPEC §9). Factors are integers of 10⁻⁶ (ppm), so that
// memory and Redis compute the same values exactly.
type Adaptive struct {
	Start, Increase, Decrease, Ceiling int64 // ppm: 0.5 → 500000
	Every, Hold                        time.Duration
}

// PPM is how many units of an Adaptive factor make 1.
const PPM = 1_000_000

// DefaultPriorities are a group's priorities when it names none, highest
// first; a request of no known priority is "default" (SPEC §9).
var DefaultPriorities = []string{"interactive", "default", "batch"}

// Limits of an [[upstream_group]]'s fields.
const (
	maxGroupRate       = 1_000_000_000
	maxGroupPer        = 24 * time.Hour
	maxGroupQueue      = 1_000_000
	maxGroupWait       = time.Hour
	maxGroupPriorities = 16
	maxGroupRetries    = 10
	maxGroupBackoff    = 10 * time.Minute
)

// groupFields are the keys an [[upstream_group]] table may have.
var groupFields = []string{"name", "paths", "max_in_flight", "rate", "per", "queue", "max_wait", "priority_from",
	"priorities", "retries", "max_backoff", "adaptive", "fair_by", "fair_weights"}

// maxFairWeight is the largest fair_weights value.
const maxFairWeight = 1000

// adaptiveFields are the keys of a group's adaptive table.
var adaptiveFields = []string{"start", "increase", "every", "decrease", "hold", "ceiling"}

// defaultGroup is an [[upstream_group]] with nothing given.
func defaultGroup() UpstreamGroup {
	return UpstreamGroup{Per: time.Minute, Queue: 1000, MaxWait: 30 * time.Second,
		Priorities: slices.Clone(DefaultPriorities), Retries: 2, MaxBackoff: 20 * time.Second}
}

// defaultAdaptive is an adaptive table with nothing given.
func defaultAdaptive() Adaptive {
	return Adaptive{Start: 500_000, Increase: 100_000, Every: 5 * time.Minute, Decrease: 500_000, Hold: 10 * time.Minute, Ceiling: 800_000}
}

// decodeUpstreamGroups reads the file's [[upstream_group]] tables. Each
// problem is one error naming the group and the field:
// upstream_group "chat": per "1": missing unit.
func decodeUpstreamGroups(raw any) ([]UpstreamGroup, []error) {
	notTables := []error{errors.New("upstream_group: must be an array of tables ([[upstream_group]])")}
	var tables []map[string]any
	switch x := raw.(type) {
	case []map[string]any:
		tables = x
	case []any:
		for _, e := range x {
			m, ok := e.(map[string]any)
			if !ok {
				return nil, notTables
			}
			tables = append(tables, m)
		}
	default:
		return nil, notTables
	}
	var groups []UpstreamGroup
	var errs []error
	for i, t := range tables {
		g, gerrs := decodeUpstreamGroup(i, t)
		groups = append(groups, g)
		errs = append(errs, gerrs...)
	}
	return groups, errs
}

func groupLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("upstream_group #%d", i+1)
	}
	return "upstream_group " + strconv.Quote(name)
}

func decodeUpstreamGroup(i int, t map[string]any) (UpstreamGroup, []error) {
	g := defaultGroup()
	if s, ok := t["name"].(string); ok {
		g.Name = s
	}
	label := groupLabel(i, g.Name)
	var errs []error
	bad := reporter(label, &errs)
	for _, k := range unknownKeys(t, groupFields) {
		bad(k, nil, "unknown field (an upstream_group has %s)", strings.Join(groupFields, ", "))
	}
	if v, ok := t["name"]; ok {
		if _, isStr := v.(string); !isStr {
			bad("name", v, "not a string")
		}
	}
	if v, ok := t["priority_from"]; ok {
		if s, isStr := v.(string); isStr {
			g.PriorityFrom = s
		} else {
			bad("priority_from", v, "not a string")
		}
	}
	if v, ok := t["fair_by"]; ok {
		if s, isStr := v.(string); isStr {
			g.FairBy = s
		} else {
			bad("fair_by", v, "not a string")
		}
	}
	if v, ok := t["fair_weights"]; ok {
		if m, isTable := v.(map[string]any); isTable {
			g.FairWeights = map[string]int64{}
			for plan, wv := range m {
				n, err := wholeNumber(wv)
				if err != nil {
					bad("fair_weights."+plan, wv, "%v", err)
					continue
				}
				g.FairWeights[plan] = n
			}
		} else {
			bad("fair_weights", v, "not a table { pro = 3, free = 1 }")
		}
	}
	strList := func(field string, dst *[]string) {
		if v, ok := t[field]; ok {
			out, err := readStrings(v)
			if err != nil {
				bad(field, v, "%v", err)
				return
			}
			if out == nil {
				out = []string{} // given empty: Validate says so
			}
			*dst = out
		}
	}
	strList("paths", &g.Paths)
	strList("priorities", &g.Priorities)
	for j, p := range g.Priorities {
		g.Priorities[j] = strings.ToLower(strings.TrimSpace(p))
	}
	// A field that cannot be read keeps its default: one error, not two.
	intField := func(field string, dst *int64) {
		if v, ok := t[field]; ok {
			n, err := wholeNumber(v)
			if err != nil {
				bad(field, v, "%v", err)
				return
			}
			*dst = n
		}
	}
	intField("max_in_flight", &g.MaxInFlight)
	intField("rate", &g.Rate)
	intField("queue", &g.Queue)
	intField("retries", &g.Retries)
	durField := func(m map[string]any, key, field string, dst *time.Duration) {
		if v, ok := m[key]; ok {
			d, err := readDuration(v)
			if err != nil {
				bad(field, v, "%v", err)
				return
			}
			*dst = d
		}
	}
	durField(t, "per", "per", &g.Per)
	durField(t, "max_wait", "max_wait", &g.MaxWait)
	durField(t, "max_backoff", "max_backoff", &g.MaxBackoff)
	if v, ok := t["adaptive"]; ok {
		m, isTable := v.(map[string]any)
		if !isTable {
			bad("adaptive", v, `not a table { start = 0.5, increase = 0.1, every = "5m", decrease = 0.5, hold = "10m", ceiling = 0.8 }`)
			return g, errs
		}
		a := defaultAdaptive()
		for _, k := range unknownKeys(m, adaptiveFields) {
			bad("adaptive."+k, nil, "unknown field (adaptive has %s)", strings.Join(adaptiveFields, ", "))
		}
		for _, f := range []struct {
			key string
			dst *int64
		}{{"start", &a.Start}, {"increase", &a.Increase}, {"decrease", &a.Decrease}, {"ceiling", &a.Ceiling}} {
			if fv, ok := m[f.key]; ok {
				n, err := readFactor(fv)
				if err != nil {
					bad("adaptive."+f.key, fv, "%v", err)
					continue
				}
				*f.dst = n
			}
		}
		durField(m, "every", "adaptive.every", &a.Every)
		durField(m, "hold", "adaptive.hold", &a.Hold)
		g.Adaptive = &a
	}
	return g, errs
}

// readFactor reads an adaptive factor (a TOML float or integer) as ppm,
// rounded to the nearest.
func readFactor(v any) (int64, error) {
	f, ok := number(v, false)
	if !ok {
		return 0, errors.New("not a number")
	}
	if math.Abs(f) > 1e6 { // far outside every factor's range; keeps f × 10⁶ exact enough and in int64
		return 0, errors.New("out of range (a factor such as 0.5)")
	}
	return int64(math.Round(f * PPM)), nil
}

// factorText writes ppm as a decimal with no trailing zeros: 500000 is "0.5".
func factorText(ppm int64) string { return Dollars(ppm) }

// factor shows ppm in an error as the decimal that was written, unquoted.
type factor int64

func (f factor) String() string { return factorText(int64(f)) }

// groupPathKey is how paths of two groups are compared: case and a
// trailing slash ignored.
func groupPathKey(p string) string {
	return strings.TrimSuffix(strings.ToLower(p), "/")
}

// validateGroups checks the upstream groups; each error names the group
// and the field.
func (c *Config) validateGroups() []error {
	var errs []error
	names := map[string]bool{}
	owner := map[string]string{} // groupPathKey → label of the first group with it
	for i := range c.UpstreamGroups {
		g := &c.UpstreamGroups[i]
		label := groupLabel(i, g.Name)
		bad := reporter(label, &errs)
		switch {
		case g.Name == "":
			bad("name", nil, "required ([a-z0-9_.-], at most 64 characters)")
		case !ruleName.MatchString(g.Name):
			bad("name", g.Name, "must be 1 to 64 of a-z, 0-9, _, . and -")
		case names[g.Name]:
			bad("name", g.Name, "used by an earlier upstream_group")
		}
		names[g.Name] = true
		c.checkGroupPaths(g, label, owner, bad)
		checkGroupLimits(g, bad)
		c.checkGroupTurns(g, bad)
		checkGroupRetries(g, bad)
		checkGroupAdaptive(g, bad)
	}
	return errs
}

// checkGroupPaths checks the group's paths; a path goes to one group
// (owner: the label of the first group with each path).
func (c *Config) checkGroupPaths(g *UpstreamGroup, label string, owner map[string]string, bad badField) {
	if g.Paths != nil && len(g.Paths) == 0 {
		bad("paths", nil, "empty: leave it out for protected_paths, or list at least one path")
	}
	for _, p := range g.Paths {
		if err := checkProtectedPath(p); err != nil {
			bad("paths", p, "%v", err)
		}
	}
	// A path goes to one group: the same path in two is an error,
	// per path written, or once per other group for protected_paths.
	paths := g.Paths
	if paths == nil {
		paths = c.ProtectedPaths
	}
	seen := map[string]bool{}
	var clashes []string             // labels of earlier groups, in order
	clashed := map[string][]string{} // label → this group's paths it has
	for _, p := range paths {
		k := groupPathKey(p)
		if seen[k] {
			continue // twice in one group: harmless
		}
		seen[k] = true
		first, taken := owner[k]
		switch {
		case !taken:
			owner[k] = label
		case g.Paths != nil:
			bad("paths", p, "already in %s", first)
		default:
			if clashed[first] == nil {
				clashes = append(clashes, first)
			}
			clashed[first] = append(clashed[first], strconv.Quote(p))
		}
	}
	for _, first := range clashes {
		bad("paths", nil, "not given, so protected_paths, of which %s already has %s", first, strings.Join(clashed[first], ", "))
	}
}

// checkGroupLimits checks max_in_flight, rate, per, queue and max_wait.
func checkGroupLimits(g *UpstreamGroup, bad badField) {
	if g.MaxInFlight < 0 {
		bad("max_in_flight", g.MaxInFlight, "must be an integer ≥ 0")
	}
	if g.Rate < 0 || g.Rate > maxGroupRate {
		bad("rate", g.Rate, "must be an integer from 0 to %d", maxGroupRate)
	}
	switch {
	case g.Per < time.Millisecond:
		bad("per", durationText(g.Per), "must be at least 1ms")
	case g.Per > maxGroupPer:
		bad("per", durationText(g.Per), "must be at most 24h")
	}
	if g.Queue < 0 || g.Queue > maxGroupQueue {
		bad("queue", g.Queue, "must be an integer from 0 to %d", maxGroupQueue)
	}
	switch {
	case g.MaxWait < 0:
		bad("max_wait", durationText(g.MaxWait), "must not be negative")
	case g.MaxWait > maxGroupWait:
		bad("max_wait", durationText(g.MaxWait), "must be at most 1h")
	}
}

// checkGroupTurns checks priority_from, priorities, fair_by and
// fair_weights.
func (c *Config) checkGroupTurns(g *UpstreamGroup, bad badField) {
	if g.PriorityFrom != "" {
		if err := checkPriorityFrom(g.PriorityFrom); err != nil {
			bad("priority_from", g.PriorityFrom, "%v", err)
		} else if g.PriorityFrom == "tier" && !c.plans() {
			bad("priority_from", g.PriorityFrom, "needs tier_from or api_keys_file (where a caller's plan comes from)")
		}
	}
	if g.FairBy != "" {
		kind, _, _ := strings.Cut(g.FairBy, ":")
		switch err := CheckKeyPart(g.FairBy); {
		case err != nil:
			bad("fair_by", g.FairBy, "%v", err)
		case g.FairBy == "model" || kind == "json" || kind == "xml" || kind == "form":
			bad("fair_by", g.FairBy, "must not read the body (caller, api_key, ip, tier, header:, query: or jwt: …)")
		case g.FairBy == "tier" && !c.plans():
			bad("fair_by", g.FairBy, "needs tier_from or api_keys_file (where a caller's plan comes from)")
		}
	}
	for _, plan := range slices.Sorted(maps.Keys(g.FairWeights)) {
		if w := g.FairWeights[plan]; w < 1 || w > maxFairWeight {
			bad("fair_weights."+plan, w, "must be an integer from 1 to %d", maxFairWeight)
		}
	}
	if len(g.FairWeights) > 0 && !c.plans() {
		bad("fair_weights", nil, "needs tier_from or api_keys_file (where a caller's plan comes from)")
	}
	if len(g.Priorities) == 0 {
		bad("priorities", nil, `empty: leave it out for ["interactive", "default", "batch"]`)
	}
	if len(g.Priorities) > maxGroupPriorities {
		bad("priorities", nil, "%d of them: at most %d", len(g.Priorities), maxGroupPriorities)
	}
	for j, p := range g.Priorities {
		switch {
		case !ruleName.MatchString(p):
			bad("priorities", p, "must be 1 to 64 of a-z, 0-9, _, . and -")
		case slices.Contains(g.Priorities[:j], p):
			bad("priorities", p, "listed twice")
		}
	}
}

// checkGroupRetries checks retries and max_backoff.
func checkGroupRetries(g *UpstreamGroup, bad badField) {
	if g.Retries < 0 || g.Retries > maxGroupRetries {
		bad("retries", g.Retries, "must be an integer from 0 to %d", maxGroupRetries)
	}
	switch {
	case g.MaxBackoff <= 0:
		bad("max_backoff", durationText(g.MaxBackoff), "must be positive")
	case g.MaxBackoff > maxGroupBackoff:
		bad("max_backoff", durationText(g.MaxBackoff), "must be at most 10m")
	}
}

// checkGroupAdaptive checks adaptive.
func checkGroupAdaptive(g *UpstreamGroup, bad badField) {
	a := g.Adaptive
	if a == nil {
		return
	}
	if g.Rate == 0 {
		bad("adaptive", nil, "needs a rate")
	}
	for _, f := range []struct {
		key string
		v   int64
	}{{"start", a.Start}, {"increase", a.Increase}, {"ceiling", a.Ceiling}} {
		if f.v <= 0 || f.v > PPM {
			bad("adaptive."+f.key, factor(f.v), "must be above 0 and at most 1")
		}
	}
	if a.Decrease <= 0 || a.Decrease >= PPM {
		bad("adaptive.decrease", factor(a.Decrease), "must be above 0 and below 1")
	}
	if a.Start > a.Ceiling && a.Ceiling > 0 {
		bad("adaptive.start", factor(a.Start), "must not be above ceiling %s", factorText(a.Ceiling))
	}
	switch {
	case a.Every < time.Millisecond:
		bad("adaptive.every", durationText(a.Every), "must be at least 1ms")
	case a.Every > maxGroupPer:
		bad("adaptive.every", durationText(a.Every), "must be at most 24h")
	}
	switch {
	case a.Hold < 0:
		bad("adaptive.hold", durationText(a.Hold), "must not be negative")
	case a.Hold > maxGroupPer:
		bad("adaptive.hold", durationText(a.Hold), "must be at most 24h")
	}
}

// checkPriorityFrom checks a group's priority_from: header:NAME,
// query:NAME or tier.
func checkPriorityFrom(s string) error {
	if s == "tier" {
		return nil
	}
	kind, name, _ := strings.Cut(s, ":")
	switch {
	case kind == "header" && isToken(name):
		return nil
	case kind == "header" && name != "":
		return errors.New("not a header name")
	case kind == "query" && name != "":
		return nil
	case (kind == "header" || kind == "query") && name == "":
		return errors.New("a name is missing after " + kind + ":")
	}
	return errors.New(`must be "header:NAME", "query:NAME" or "tier"`)
}

// writeUpstreamGroups prints the upstream groups as TOML
// [[upstream_group]] tables with every field's effective value.
func (c *Config) writeUpstreamGroups(w io.Writer) error {
	var b strings.Builder
	for _, g := range c.UpstreamGroups {
		b.WriteString("\n[[upstream_group]]\n")
		fmt.Fprintf(&b, "name = %s\n", strconv.Quote(g.Name))
		if g.Paths == nil {
			b.WriteString("# paths = " + tomlValue(c.ProtectedPaths) + " (unset: the protected paths)\n")
		} else {
			b.WriteString("paths = " + tomlValue(g.Paths) + "\n")
		}
		fmt.Fprintf(&b, "max_in_flight = %d\nrate = %d\nper = %q\nqueue = %d\nmax_wait = %q\n",
			g.MaxInFlight, g.Rate, durationText(g.Per), g.Queue, durationText(g.MaxWait))
		fmt.Fprintf(&b, "priority_from = %s\npriorities = %s\nretries = %d\nmax_backoff = %q\n",
			strconv.Quote(g.PriorityFrom), tomlValue(g.Priorities), g.Retries, durationText(g.MaxBackoff))
		fmt.Fprintf(&b, "fair_by = %s\n", strconv.Quote(g.FairBy))
		if len(g.FairWeights) > 0 {
			var ws []string
			for _, plan := range slices.Sorted(maps.Keys(g.FairWeights)) {
				ws = append(ws, tomlValue(plan)+" = "+strconv.FormatInt(g.FairWeights[plan], 10))
			}
			b.WriteString("fair_weights = { " + strings.Join(ws, ", ") + " }\n")
		} else {
			b.WriteString("# fair_weights: none (every plan 1)\n")
		}
		if a := g.Adaptive; a != nil {
			fmt.Fprintf(&b, "adaptive = { start = %s, increase = %s, every = %q, decrease = %s, hold = %q, ceiling = %s }\n",
				factorText(a.Start), factorText(a.Increase), durationText(a.Every), factorText(a.Decrease), durationText(a.Hold), factorText(a.Ceiling))
		} else {
			b.WriteString("# adaptive: off\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
