package config

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// How -check writes the rules back as TOML that loads to the same rules.

// writeRules prints the rules as TOML [[rule]] tables with every field's
// effective value, the built-in rule first when it exists.
func (c *Config) writeRules(w io.Writer) error {
	var b strings.Builder
	if c.ChatRPMRule() && len(c.Rules) > 0 {
		fmt.Fprintf(&b, "\n# the built-in rule: chat_rpm is set explicitly, so it is evaluated first\n")
		fmt.Fprintf(&b, "# [[rule]] name = %q, key = [\"caller\"], limit = %d, window = \"60s\", paths = protected_paths\n", BuiltinRule, c.ChatRPM)
	}
	for _, r := range c.Rules {
		b.WriteString("\n[[rule]]\n")
		fmt.Fprintf(&b, "name = %s\n", strconv.Quote(r.Name))
		if r.Paths == nil {
			// A comment: written out, the list would make the rule one of
			// its own paths instead of the protected routes'.
			b.WriteString("# paths = " + tomlValue(c.ProtectedPaths) + " (unset: the protected paths)\n")
		} else {
			b.WriteString("paths = " + tomlValue(r.Paths) + "\n")
		}
		b.WriteString("methods = " + tomlValue(r.Methods) + "\n")
		for _, f := range []struct {
			name  string
			conds []Condition
		}{{"when", r.When}, {"unless", r.Unless}} {
			if len(f.conds) == 0 {
				continue
			}
			parts := make([]string, len(f.conds))
			for i, w := range f.conds {
				v := strconv.Quote(w.Values[0])
				if len(w.Values) > 1 {
					v = tomlValue(w.Values)
				}
				parts[i] = strconv.Quote(w.Part) + " = " + v
			}
			b.WriteString(f.name + " = { " + strings.Join(parts, ", ") + " }\n")
		}
		b.WriteString("key = " + tomlValue(r.Key) + "\n")
		show := func(n int64) string {
			if r.Cost == CostUSD {
				return Dollars(n)
			}
			return strconv.FormatInt(n, 10)
		}
		window := durationText(r.Window)
		if r.Algorithm == AlgCalendar {
			window = r.Period
		}
		fmt.Fprintf(&b, "on_missing_key = %q\nalgorithm = %q\nlimit = %s\nwindow = %q\n", r.OnMissingKey, r.Algorithm, show(r.Limit), window)
		if r.Algorithm == AlgCalendar {
			fmt.Fprintf(&b, "timezone = %q\n", r.Timezone)
		}
		if r.Algorithm == AlgTokenBucket {
			burst := r.Limit
			if r.BurstSet {
				burst = r.Burst
			}
			fmt.Fprintf(&b, "burst = %s\n", show(burst))
		}
		fmt.Fprintf(&b, "cost = %q\n", r.Cost)
		if r.Output == OutputClamp {
			fmt.Fprintf(&b, "output = %q\nmin_output = %d\n", r.Output, r.MinOutput)
		}
		fmt.Fprintf(&b, "action = %q\n", r.Action)
		if r.Action == ActionDelay {
			fmt.Fprintf(&b, "max_delay = %q\n", durationText(r.MaxDelay))
		}
		limitValue := func(n int64, unlimited bool) string {
			if unlimited {
				return `"unlimited"`
			}
			return show(n)
		}
		if len(r.Tiers) > 0 {
			parts := make([]string, len(r.Tiers))
			for i, t := range r.Tiers {
				parts[i] = strconv.Quote(t.Plan) + " = " + limitValue(t.Limit, t.Unlimited)
			}
			b.WriteString("tiers = { " + strings.Join(parts, ", ") + " }\n")
		}
		if len(r.Overrides) > 0 {
			parts := make([]string, len(r.Overrides))
			for i, o := range r.Overrides {
				parts[i] = strconv.Quote(o.Key) + " = " + limitValue(o.Limit, o.Unlimited)
			}
			b.WriteString("overrides = { " + strings.Join(parts, ", ") + " }\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
