package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// ratelimit_proxy_rule_info describes every running rule, and a calendar
// rule's period end is its next local boundary; a reload that removes a
// rule removes its series.
func TestRuleInfoMetric(t *testing.T) {
	opt, write := configFile(t, `
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 2
window = "1m"
[[rule]]
name      = "monthly"
key       = ["caller"]
algorithm = "calendar"
window    = "month"
timezone  = "Europe/Rome"
cost      = "input_tokens"
limit     = 100000
`)
	f := newFixture(t, opt)
	f.clock.Set(3600) // 2026-01-01T01:00Z: 02:00 in Rome
	if got := metric(t, f, "ratelimit_proxy_rule_info", map[string]string{
		"rule": "per-ip", "algorithm": "sliding_window", "window": "60", "cost": "requests", "action": "reject"}); got != 1 {
		t.Fatalf("per-ip info %v", got)
	}
	if got := metric(t, f, "ratelimit_proxy_rule_info", map[string]string{
		"rule": "monthly", "algorithm": "calendar", "window": "month", "cost": "input_tokens"}); got != 1 {
		t.Fatalf("monthly info %v", got)
	}
	rome, _ := time.LoadLocation("Europe/Rome")
	want := time.Date(2026, 2, 1, 0, 0, 0, 0, rome).Unix()
	if got := metric(t, f, "ratelimit_proxy_rule_period_end_timestamp_seconds", map[string]string{"rule": "monthly"}); got != float64(want) {
		t.Fatalf("period end %v, want %d", got, want)
	}

	write(`
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 2
window = "10m"
`)
	if code, m := f.adminDo(t, "POST", "/admin/reload", "", ""); code != http.StatusOK {
		t.Fatalf("reload: %d %v", code, m)
	}
	metric(t, f, "ratelimit_proxy_rule_info", map[string]string{"rule": "per-ip", "window": "600"})
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" && l.GetValue() == "monthly" && strings.HasPrefix(mf.GetName(), "ratelimit_proxy_rule_") {
					t.Fatalf("%s still reports the removed rule", mf.GetName())
				}
			}
		}
	}
}
