package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// TestCheckRoundTrips: what -check prints, loaded as a configuration,
// behaves as the configuration checked: the same settings, rules, prices
// and groups, and the built-in rule on or off alike. Every example file
// and the shipped example configuration are checked, and a file of rules
// that leaves chat_rpm unset (so no built-in rule), whose printed default
// must not turn one on.
func TestCheckRoundTrips(t *testing.T) {
	files, _ := filepath.Glob("../examples/policies/*.toml")
	files = append(files, "../config.example.toml")
	dir := t.TempDir()
	rulesOnly := filepath.Join(dir, "rules-only.toml")
	os.WriteFile(rulesOnly, []byte("upstream_url = \"http://127.0.0.1:1\"\n[[rule]]\nname = \"per-user\"\nkey = [\"caller\"]\nlimit = 5\nwindow = \"10s\"\n"+
		"when = { ip = [\"10.0.0.0/8\", \"2001:db8::/32\"], \"header:X-Env\" = \"prod*\" }\nunless = { model = [\"gpt-4o-mini\", \"o3*\"] }\n"+
		"[[rule]]\nname = \"daily\"\nalgorithm = \"calendar\"\nwindow = \"day\"\nlimit = 100\n"+
		"[[rule]]\nname = \"weekly\"\nalgorithm = \"calendar\"\nwindow = \"week\"\ntimezone = \"America/New_York\"\nlimit = 500\n"), 0o600)
	groups := filepath.Join(dir, "groups.toml")
	os.WriteFile(groups, []byte("upstream_url = \"http://127.0.0.1:1\"\nchat_rpm = 7\ntier_from = \"header:X-Plan\"\n[[rule]]\nname = \"r\"\nkey = [\"ip\"]\nlimit = 1\nwindow = \"1s\"\n"+
		"[[upstream_group]]\nname = \"chat\"\nmax_in_flight = 4\nfair_by = \"header:X-Team\"\nfair_weights = { pro = 3, \"free tier\" = 1 }\n[[upstream_group]]\nname = \"files\"\npaths = [\"/v1/files\"]\nrate = 5\n"), 0o600)
	files = append(files, rulesOnly, groups)
	noEnv := func(string) (string, bool) { return "", false }
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c1, err := config.Load(f, noEnv)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := c1.Write(&out); err != nil {
				t.Fatal(err)
			}
			printed := filepath.Join(dir, "printed.toml")
			os.WriteFile(printed, out.Bytes(), 0o600)
			c2, err := config.Load(printed, noEnv)
			if err != nil {
				t.Fatalf("the printed configuration does not load: %v\n%s", err, out.String())
			}
			if err := c2.Validate(); err != nil {
				t.Fatalf("the printed configuration does not validate: %v\n%s", err, out.String())
			}
			if c1.ChatRPMRule() != c2.ChatRPMRule() {
				t.Fatalf("built-in rule %v, after the round trip %v\n%s", c1.ChatRPMRule(), c2.ChatRPMRule(), out.String())
			}
			for _, k := range config.Keys() {
				a, _ := config.Show(&c1, k)
				b, _ := config.Show(&c2, k)
				if !reflect.DeepEqual(a, b) {
					t.Errorf("%s: %v, after the round trip %v", k, a, b)
				}
			}
			if !reflect.DeepEqual(c1.Rules, c2.Rules) || !reflect.DeepEqual(c1.Prices, c2.Prices) || !reflect.DeepEqual(c1.UpstreamGroups, c2.UpstreamGroups) {
				t.Errorf("rules, prices or groups differ after the round trip\n%s", out.String())
			}
		})
	}
}
