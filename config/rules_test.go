package config_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

func loadRules(t *testing.T, body string, environ map[string]string) (config.Config, error) {
	t.Helper()
	c, err := config.Load(writeFile(t, "upstream_url = \"http://127.0.0.1:1\"\n"+body), env(environ))
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

// The SPEC's example rules load with their defaults applied.
func TestRulesDecodeWithDefaults(t *testing.T) {
	c, err := loadRules(t, `
tier_from = "header:X-Plan"

[[rule]]
name      = "chat-per-user"
paths     = ["/api/chat", "/v1/chat/completions"]
key       = ["caller"]
algorithm = "token_bucket"
limit     = 20
window    = "1m"
burst     = 5
tiers     = { free = 10, pro = 60, expert = "unlimited" }

[[rule]]
name           = "sifen-per-ruc"
paths          = ["/sifen/*"]
key            = ["xml:dRucEm", "header:X-Sifen-Env"]
limit          = 1
window         = "10s"
on_missing_key = "skip"

[[rule]]
name   = "daily-per-key"
key    = ["api_key"]
limit  = 500
window = "24h"
action = "shadow"
overrides = { "api_key=3f9a000000000000" = 5000 }
when = { "header:X-Env" = "prod", "model" = "gpt-4o*" }
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ChatRPMRule() {
		t.Error("chat_rpm exists though the file has rules and does not set chat_rpm")
	}
	if len(c.Rules) != 3 {
		t.Fatalf("%d rules", len(c.Rules))
	}
	bucket, sifen, daily := c.Rules[0], c.Rules[1], c.Rules[2]
	if bucket.Algorithm != "token_bucket" || !bucket.BurstSet || bucket.Burst != 5 || bucket.Window != time.Minute ||
		len(bucket.Tiers) != 3 || bucket.Tiers[0] != (config.Tier{Plan: "expert", Unlimited: true}) || bucket.Tiers[1] != (config.Tier{Plan: "free", Limit: 10}) {
		t.Errorf("bucket rule: %+v", bucket)
	}
	if sifen.Methods[0] != "POST" || sifen.Key[0] != "xml:dRucEm" || sifen.Window != 10*time.Second || sifen.Action != "reject" || sifen.Algorithm != "sliding_window" {
		t.Errorf("sifen rule: %+v", sifen)
	}
	if daily.Paths != nil || daily.Action != "shadow" || len(daily.When) != 2 || daily.When[0].Part != "header:X-Env" || daily.Overrides[0].Limit != 5000 {
		t.Errorf("daily rule: %+v", daily)
	}
	var out strings.Builder
	if err := c.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`name = "sifen-per-ruc"`, `burst = 5`, `tiers = { "expert" = "unlimited", "free" = 10, "pro" = 60 }`, `action = "shadow"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-check output lacks %s:\n%s", want, out.String())
		}
	}
}

// CHAT_RPM set explicitly keeps the built-in rule beside the file's.
func TestChatRPMBesideRules(t *testing.T) {
	const rule = "[[rule]]\nname = \"a\"\nlimit = 1\n"
	c, err := loadRules(t, rule, map[string]string{"CHAT_RPM": "7"})
	if err != nil || !c.ChatRPMRule() {
		t.Fatalf("CHAT_RPM set: rule %v, err %v", c.ChatRPMRule(), err)
	}
	c, err = loadRules(t, "chat_rpm = 7\n"+rule, nil)
	if err != nil || !c.ChatRPMRule() {
		t.Fatalf("chat_rpm in the file: rule %v, err %v", c.ChatRPMRule(), err)
	}
	if _, err := loadRules(t, "chat_rpm = 7\n[[rule]]\nname = \"chat_rpm\"\nlimit = 1\n", nil); err == nil ||
		!strings.Contains(err.Error(), `rule "chat_rpm": name "chat_rpm": taken by the built-in rule`) {
		t.Errorf("a rule named chat_rpm beside CHAT_RPM: %v", err)
	}
}

// Every bad field is one line naming the rule and the field.
func TestRuleErrorsNameRuleAndField(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[[rule]]\nname = \"sifen-per-ruc\"\nlimit = 1\nwindow = \"10\"\n", `rule "sifen-per-ruc": window "10": missing unit`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nwindow = 10\n", `rule "x": window 10: missing unit`},
		{"[[rule]]\nname = \"x\"\n", `rule "x": limit: required`},
		{"[[rule]]\nname = \"x\"\nlimit = -1\n", `rule "x": limit -1: must not be negative`},
		{"[[rule]]\nname = \"x\"\nlimit = 1.5\n", `rule "x": limit 1.5: not an integer`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\naction = \"delay\"\nmax_delay = \"-1s\"\n", `rule "x": max_delay "-1s": must be positive`},
		{"[[rule]]\nlimit = 1\n", `rule #1: name: required`},
		{"[[rule]]\nname = \"Bad Name\"\nlimit = 1\n", `rule "Bad Name": name "Bad Name": must be 1 to 64`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\n[[rule]]\nname = \"x\"\nlimit = 2\n", `rule "x": name "x": used by an earlier rule`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nwindow = \"500ms\"\n", `rule "x": window "500ms": must be at least 1s`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nalgorithm = \"leaky\"\n", `rule "x": algorithm "leaky": must be`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nburst = 3\n", `rule "x": burst 3: only with algorithm = "token_bucket"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\naction = \"delay\"\n", `rule "x": max_delay: required with action = "delay"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\naction = \"drop\"\n", `rule "x": action "drop": must be`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nkey = [\"cookie:a\"]\n", `rule "x": key "cookie:a": unknown key part kind`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nkey = [\"json:a..b\"]\n", `rule "x": key "json:a..b": an empty segment`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nkey = [\"tier\"]\n", `rule "x": key "tier": needs tier_from`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\non_missing_key = \"deny\"\n", `rule "x": on_missing_key "deny": must be "skip" or "reject"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nwhen = { ip = [\"10.0.0.0/33\"] }\n", `rule "x": when "10.0.0.0/33": ip: not a CIDR`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nunless = { ip = \"10.0.0/8\" }\n", `rule "x": unless "10.0.0/8": ip: not a CIDR`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nwhen = { model = [] }\n", `model: an empty list`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nwhen = { model = [\"a\", 1] }\n", `model: every value must be a string`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nunless = { \"cookie:a\" = \"1\" }\n", `rule "x": unless "cookie:a": unknown key part kind`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nunless = \"ip\"\n", `rule "x": unless "ip": not a table`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nlimits = 2\n", `rule "x": limits: unknown field`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\npaths = [\"v1/chat\"]\n", `rule "x": paths "v1/chat": a path starts with /`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ntiers = { free = 1 }\n", `rule "x": tiers: needs tier_from`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\noverrides = { \"ip=1.2.3.4\" = 5 }\n", `rule "x": overrides "ip=1.2.3.4": not a key of this rule: write "caller=…"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"usd\"\n", `rule "x": cost "usd": needs [price."MODEL"] entries`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"tokens\"\n", `rule "x": cost "tokens": must be "requests", "input_tokens", "total_tokens" or "usd"`},
		{"[price.\"*\"]\ninput = 1\noutput = 1\n[[rule]]\nname = \"x\"\ncost = \"usd\"\nlimit = \"lots\"\n", `rule "x": limit "lots": not an amount of dollars`},
		{"[price.\"*\"]\ninput = 1\noutput = 1\n[[rule]]\nname = \"x\"\ncost = \"usd\"\nlimit = -0.5\n", `rule "x": limit -0.5: must not be negative`},
		{"[price.\"*\"]\ninput = 1\noutput = 1\n[[rule]]\nname = \"x\"\ncost = \"usd\"\nlimit = 25.1234567\n", `rule "x": limit 25.1234567: at most 6 decimals`},
		{"[price.\"*\"]\ninput = 1\noutput = 1\n[[rule]]\nname = \"x\"\ncost = \"usd\"\nlimit = \"0.0000005\"\n", `rule "x": limit "0.0000005": at most 6 decimals`},
		{"[price.\"*\"]\ninput = 1.0000001\noutput = 1\n", `price "*": input 1.0000001: at most 6 decimals`},
		{"[price.\"*\"]\ninput = 1\noutput = 1\n[[rule]]\nname = \"x\"\ncost = \"usd\"\nlimit = 25.5\nburst = 2.25\n", `rule "x": burst 2.25: only with algorithm = "token_bucket"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\nwhen = { \"header:X-Env\" = 1 }\n", `rule "x": when 1: header:X-Env: the value is not a string`},
		{"tier_from = \"cookie:plan\"\n", `tier_from = "cookie:plan": write "header:NAME"`},
	} {
		_, err := loadRules(t, tc.body, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s", tc.body, err, tc.want)
		}
	}
}

// SPEC §7.1's example line, exactly.
func TestCheckLineAsTheSpecWritesIt(t *testing.T) {
	_, err := loadRules(t, "[[rule]]\nname = \"sifen-per-ruc\"\nlimit = 1\nwindow = \"10\"\n", nil)
	if err == nil || err.Error() != `rule "sifen-per-ruc": window "10": missing unit` {
		t.Fatalf("got %v", err)
	}
}

// A calendar rule's window is a period and its timezone an IANA zone;
// neither is accepted where it does not apply.
func TestCalendarRuleFields(t *testing.T) {
	load := func(rule string) (config.Config, error) {
		c, err := config.Load(writeFile(t, "upstream_url = \"http://127.0.0.1:1\"\n[[rule]]\nname = \"r\"\nlimit = 5\n"+rule), env(nil))
		if err == nil {
			err = c.Validate()
		}
		return c, err
	}
	c, err := load("algorithm = \"calendar\"\nwindow = \"week\"\ntimezone = \"Europe/Rome\"\n")
	if err != nil || c.Rules[0].Period != "week" || c.Rules[0].Location == nil || c.Rules[0].Location.String() != "Europe/Rome" {
		t.Fatalf("%v %+v", err, c.Rules)
	}
	c, err = load("algorithm = \"calendar\"\nwindow = \"month\"\n")
	if err != nil || c.Rules[0].Timezone != "UTC" || c.Rules[0].Location != time.UTC {
		t.Fatalf("default zone: %v %+v", err, c.Rules)
	}
	for rule, want := range map[string]string{
		"algorithm = \"calendar\"\nwindow = \"24h\"\n":                           `window "24h": a calendar rule's window is "day", "week" or "month"`,
		"algorithm = \"calendar\"\n":                                             `window: required with algorithm = "calendar"`,
		"algorithm = \"calendar\"\nwindow = \"day\"\ntimezone = \"Mars/Base\"\n": `timezone "Mars/Base": not an IANA time zone`,
		"algorithm = \"calendar\"\nwindow = \"day\"\ntimezone = \"Local\"\n":     `timezone "Local": not an IANA time zone`,
		"window = \"month\"\n":                                                   `window "month"`,
		"window = \"1m\"\ntimezone = \"UTC\"\n":                                  `timezone "UTC": only with algorithm = "calendar"`,
		"algorithm = \"calendar\"\nwindow = \"day\"\nburst = 3\n":                `burst 3: only with algorithm = "token_bucket"`,
	} {
		if _, err := load(rule); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", rule, err, want)
		}
	}
}

// A concurrency rule counts requests: any other cost is an error; its
// window is not used.
func TestConcurrencyRuleFields(t *testing.T) {
	base := "[[rule]]\nname = \"c\"\npaths = [\"/api/chat\"]\nalgorithm = \"concurrency\"\nlimit = 3\n"
	c, err := loadRules(t, base, nil)
	if err != nil || c.Rules[0].Algorithm != config.AlgConcurrency || c.Rules[0].Limit != 3 {
		t.Fatalf("%v %+v", err, c.Rules)
	}
	if _, err := loadRules(t, base+"cost = \"input_tokens\"\n", nil); err == nil || !strings.Contains(err.Error(), "requests") {
		t.Fatalf("cost input_tokens: %v", err)
	}
	if _, err := loadRules(t, base+"burst = 2\n", nil); err == nil {
		t.Fatal("burst accepted")
	}
}

// output = "clamp" and min_output: on total_tokens and usd rules only,
// min_output an integer ≥ 1 and only with clamp; the defaults are
// "reserve" and 16.
func TestOutputClampFields(t *testing.T) {
	const prices = "[price.\"*\"]\ninput = 1\noutput = 1\n"
	c, err := loadRules(t, prices+`
[[rule]]
name = "tpm"
cost = "total_tokens"
limit = 1000
output = "clamp"

[[rule]]
name = "spend"
cost = "usd"
limit = 2.5
output = "clamp"
min_output = 64

[[rule]]
name = "plain"
cost = "total_tokens"
limit = 1000
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := [][2]any{}
	for _, r := range c.Rules {
		got = append(got, [2]any{r.Output, r.MinOutput})
	}
	if fmt.Sprint(got) != "[[clamp 16] [clamp 64] [reserve 16]]" {
		t.Fatalf("%v", got)
	}
	for _, tc := range []struct{ body, want string }{
		{"[[rule]]\nname = \"x\"\nlimit = 1\noutput = \"clamp\"\n", `rule "x": output "clamp": "clamp" needs cost = "total_tokens" or "usd"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"input_tokens\"\noutput = \"clamp\"\n", `rule "x": output "clamp": "clamp" needs cost`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"total_tokens\"\noutput = \"shrink\"\n", `rule "x": output "shrink": must be "reserve" or "clamp"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"total_tokens\"\noutput = \"clamp\"\nmin_output = 0\n", `rule "x": min_output 0: must be an integer ≥ 1`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"total_tokens\"\noutput = \"clamp\"\nmin_output = 2.5\n", `rule "x": min_output 2.5: must be an integer ≥ 1`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"total_tokens\"\nmin_output = 8\n", `rule "x": min_output 8: only with output = "clamp"`},
		{"[[rule]]\nname = \"x\"\nlimit = 1\ncost = \"total_tokens\"\noutput = 1\n", `rule "x": output 1: not a string`},
	} {
		_, err := loadRules(t, tc.body, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s", tc.body, err, tc.want)
		}
	}
}
