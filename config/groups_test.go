package config_test

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// A group that gives only its name has every default of SPEC §9.
func TestUpstreamGroupDefaults(t *testing.T) {
	c, err := loadRules(t, "[[upstream_group]]\nname = \"chat\"\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []config.UpstreamGroup{{Name: "chat", Per: time.Minute, Queue: 1000, MaxWait: 30 * time.Second,
		Priorities: []string{"interactive", "default", "batch"}, Retries: 2, MaxBackoff: 20 * time.Second}}
	if !reflect.DeepEqual(c.UpstreamGroups, want) {
		t.Fatalf("got  %+v\nwant %+v", c.UpstreamGroups, want)
	}
	// Each group has its own priorities, not a shared slice.
	c.UpstreamGroups[0].Priorities[0] = "x"
	if config.DefaultPriorities[0] != "interactive" {
		t.Fatal("a group's priorities share the defaults' array")
	}
	// No table: no groups.
	c, err = loadRules(t, "", nil)
	if err != nil || c.UpstreamGroups != nil {
		t.Fatalf("no tables: %v, %v", c.UpstreamGroups, err)
	}
}

// SPEC §9's example, every field given, and a second group with an
// adaptive table that gives some keys only.
func TestUpstreamGroupEveryField(t *testing.T) {
	c, err := loadRules(t, `
[[upstream_group]]
name          = "chat"
paths         = ["/v1/chat/completions", "/api/chat"]   # default PROTECTED_PATHS
max_in_flight = 32          # 0: no cap
rate          = 600         # requests per `+"`per`"+` towards the upstream; 0: no rate
per           = "1m"
queue         = 1000        # requests waiting; beyond: 503
max_wait      = "30s"       # longest wait in the queue; beyond: 503
priority_from = "header:X-Priority"
priorities    = ["interactive", "default", "batch"]     # highest first; unknown: "default"
retries       = 2           # for upstream 429/503, see below
max_backoff   = "20s"
adaptive      = { start = 0.5, increase = 0.1, every = "5m", decrease = 0.5, hold = "10m", ceiling = 0.8 }

[[upstream_group]]
name          = "embed"
paths         = ["/v1/embeddings"]
max_in_flight = 4
rate          = 100
per           = "1s"
queue         = 0
max_wait      = "0s"
priority_from = "query:prio"
priorities    = ["HIGH", "Default", "low"]
retries       = 0
max_backoff   = "1500ms"
adaptive      = { ceiling = 1, decrease = 0.25, hold = "0s", start = 0.3333333 }
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []config.UpstreamGroup{
		{Name: "chat", Paths: []string{"/v1/chat/completions", "/api/chat"}, MaxInFlight: 32, Rate: 600, Per: time.Minute,
			Queue: 1000, MaxWait: 30 * time.Second, PriorityFrom: "header:X-Priority", Priorities: []string{"interactive", "default", "batch"},
			Retries: 2, MaxBackoff: 20 * time.Second,
			Adaptive: &config.Adaptive{Start: 500_000, Increase: 100_000, Every: 5 * time.Minute, Decrease: 500_000, Hold: 10 * time.Minute, Ceiling: 800_000}},
		{Name: "embed", Paths: []string{"/v1/embeddings"}, MaxInFlight: 4, Rate: 100, Per: time.Second,
			Queue: 0, MaxWait: 0, PriorityFrom: "query:prio", Priorities: []string{"high", "default", "low"},
			Retries: 0, MaxBackoff: 1500 * time.Millisecond,
			Adaptive: &config.Adaptive{Start: 333_333, Increase: 100_000, Every: 5 * time.Minute, Decrease: 250_000, Hold: 0, Ceiling: 1_000_000}},
	}
	if !reflect.DeepEqual(c.UpstreamGroups, want) {
		t.Fatalf("got  %+v %+v\nwant %+v %+v", c.UpstreamGroups, *c.UpstreamGroups[0].Adaptive, want, *want[0].Adaptive)
	}
}

// fair_by and fair_weights load as written; plans not known anywhere
// else are allowed (a plan may come from a header).
func TestUpstreamGroupFair(t *testing.T) {
	c, err := loadRules(t, "tier_from = \"header:X-Plan\"\n[[upstream_group]]\nname = \"chat\"\nfair_by = \"header:X-Team\"\nfair_weights = { pro = 3, free = 1, \"some plan\" = 2 }\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	g := c.UpstreamGroups[0]
	if g.FairBy != "header:X-Team" || !reflect.DeepEqual(g.FairWeights, map[string]int64{"pro": 3, "free": 1, "some plan": 2}) {
		t.Fatalf("fair_by %q, fair_weights %v", g.FairBy, g.FairWeights)
	}
	for _, part := range []string{"caller", "api_key", "ip", "tier", "query:team", "jwt:org", "global"} {
		if _, err := loadRules(t, "tier_from = \"header:X-Plan\"\n[[upstream_group]]\nname = \"chat\"\nfair_by = \""+part+"\"\n", nil); err != nil {
			t.Errorf("fair_by %q: %v", part, err)
		}
	}
	// Shared on Redis too.
	if _, err := loadRules(t, "redis_url = \"redis://127.0.0.1:1\"\n[[upstream_group]]\nname = \"chat\"\nfair_by = \"caller\"\n", nil); err != nil {
		t.Errorf("fair_by with redis_url: %v", err)
	}
}

// Every bad field is one line naming the group and the field.
func TestUpstreamGroupErrors(t *testing.T) {
	const g = "[[upstream_group]]\nname = \"chat\"\n"
	const a = "rate = 10\n"
	for _, tc := range []struct{ body, want string }{
		// decoding
		{"upstream_group = 5\n", `upstream_group: must be an array of tables ([[upstream_group]])`},
		{"[upstream_group]\nname = \"x\"\n", `upstream_group: must be an array of tables ([[upstream_group]])`},
		{g + "max_inflight = 3\n", `upstream_group "chat": max_inflight: unknown field (an upstream_group has name, paths, max_in_flight, rate, per, queue, max_wait, priority_from, priorities, retries, max_backoff, adaptive, fair_by, fair_weights)`},
		{"[[upstream_group]]\nname = 7\n", `upstream_group #1: name 7: not a string`},
		{g + "paths = \"/v1/chat\"\n", `upstream_group "chat": paths "/v1/chat": not a list of strings`},
		{g + "max_in_flight = 1.5\n", `upstream_group "chat": max_in_flight 1.5: not an integer`},
		{g + "rate = \"lots\"\n", `upstream_group "chat": rate "lots": not an integer`},
		{g + "per = \"1\"\n", `upstream_group "chat": per "1": missing unit`},
		{g + "per = 60\n", `upstream_group "chat": per 60: missing unit`},
		{g + "max_wait = \"soon\"\n", `upstream_group "chat": max_wait "soon": not a duration`},
		{g + "queue = true\n", `upstream_group "chat": queue true: not an integer`},
		{g + "priority_from = 1\n", `upstream_group "chat": priority_from 1: not a string`},
		{g + "priorities = [1, 2]\n", `upstream_group "chat": priorities [1 2]: not a list of strings`},
		{g + "retries = \"two\"\n", `upstream_group "chat": retries "two": not an integer`},
		{g + "max_backoff = 20\n", `upstream_group "chat": max_backoff 20: missing unit`},
		{g + a + "adaptive = 0.5\n", `upstream_group "chat": adaptive 0.5: not a table { start = 0.5, increase = 0.1, every = "5m", decrease = 0.5, hold = "10m", ceiling = 0.8 }`},
		{g + a + "adaptive = { start = 0.5, step = 0.1 }\n", `upstream_group "chat": adaptive.step: unknown field (adaptive has start, increase, every, decrease, hold, ceiling)`},
		{g + a + "adaptive = { start = \"half\" }\n", `upstream_group "chat": adaptive.start "half": not a number`},
		{g + a + "adaptive = { every = 300 }\n", `upstream_group "chat": adaptive.every 300: missing unit`},
		{g + a + "adaptive = { ceiling = 1e7 }\n", `upstream_group "chat": adaptive.ceiling 1e+07: out of range (a factor such as 0.5)`},
		// validation
		{"[[upstream_group]]\nrate = 1\n", `upstream_group #1: name: required ([a-z0-9_.-], at most 64 characters)`},
		{"[[upstream_group]]\nname = \"Chat Group\"\n", `upstream_group "Chat Group": name "Chat Group": must be 1 to 64 of a-z, 0-9, _, . and -`},
		{g + "paths = [\"/a\"]\n" + g + "paths = [\"/b\"]\n", `upstream_group "chat": name "chat": used by an earlier upstream_group`},
		{g + "paths = []\n", `upstream_group "chat": paths: empty: leave it out for protected_paths, or list at least one path`},
		{g + "paths = [\"v1/chat\"]\n", `upstream_group "chat": paths "v1/chat": a path starts with / and has no query, fragment or spaces`},
		{g + "paths = [\"/v1/chat*\"]\n", `upstream_group "chat": paths "/v1/chat*": * must be a whole path segment (/openai/deployments/*/chat/completions), or the last one for a prefix (/v1/*)`},
		{g + "paths = [\"/v1/Chat/\"]\n[[upstream_group]]\nname = \"other\"\npaths = [\"/v1/chat\"]\n", `upstream_group "other": paths "/v1/chat": already in upstream_group "chat"`},
		{g + "\n[[upstream_group]]\nname = \"other\"\npaths = [\"/api/chat\"]\n", `upstream_group "other": paths "/api/chat": already in upstream_group "chat"`},
		{g + "paths = [\"/x\"]\n[[upstream_group]]\nname = \"b\"\n[[upstream_group]]\nname = \"c\"\n", `upstream_group "c": paths: not given, so protected_paths, of which upstream_group "b" already has "/api/chat", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/messages"`},
		{"[[upstream_group]]\nname = \"a\"\npaths = [\"/v1/messages\"]\n[[upstream_group]]\nname = \"b\"\npaths = [\"/api/chat\"]\n[[upstream_group]]\nname = \"c\"\n",
			`upstream_group "c": paths: not given, so protected_paths, of which upstream_group "b" already has "/api/chat"`},
		{g + "max_in_flight = -1\n", `upstream_group "chat": max_in_flight -1: must be an integer ≥ 0`},
		{g + "rate = -1\n", `upstream_group "chat": rate -1: must be an integer from 0 to 1000000000`},
		{g + "rate = 1000000001\n", `upstream_group "chat": rate 1000000001: must be an integer from 0 to 1000000000`},
		{g + "per = \"0s\"\n", `upstream_group "chat": per "0s": must be at least 1ms`},
		{g + "per = \"25h\"\n", `upstream_group "chat": per "90000s": must be at most 24h`},
		{g + "queue = -1\n", `upstream_group "chat": queue -1: must be an integer from 0 to 1000000`},
		{g + "queue = 1000001\n", `upstream_group "chat": queue 1000001: must be an integer from 0 to 1000000`},
		{g + "max_wait = \"-1s\"\n", `upstream_group "chat": max_wait "-1s": must not be negative`},
		{g + "max_wait = \"61m\"\n", `upstream_group "chat": max_wait "3660s": must be at most 1h`},
		{g + "priority_from = \"json:priority\"\n", `upstream_group "chat": priority_from "json:priority": must be "header:NAME", "query:NAME" or "tier"`},
		{g + "priority_from = \"jwt:prio\"\n", `upstream_group "chat": priority_from "jwt:prio": must be "header:NAME", "query:NAME" or "tier"`},
		{g + "priority_from = \"caller\"\n", `upstream_group "chat": priority_from "caller": must be "header:NAME", "query:NAME" or "tier"`},
		{g + "priority_from = \"header:X Prio\"\n", `upstream_group "chat": priority_from "header:X Prio": not a header name`},
		{g + "priority_from = \"query:\"\n", `upstream_group "chat": priority_from "query:": a name is missing after query:`},
		{g + "priority_from = \"tier\"\n", `upstream_group "chat": priority_from "tier": needs tier_from or api_keys_file (where a caller's plan comes from)`},
		{g + "priorities = []\n", `upstream_group "chat": priorities: empty: leave it out for ["interactive", "default", "batch"]`},
		{g + "priorities = [\"high\", \"very high\"]\n", `upstream_group "chat": priorities "very high": must be 1 to 64 of a-z, 0-9, _, . and -`},
		{g + "priorities = [\"high\", \"HIGH\"]\n", `upstream_group "chat": priorities "high": listed twice`},
		{g + "priorities = [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]\n", `upstream_group "chat": priorities: 17 of them: at most 16`},
		{g + "retries = 11\n", `upstream_group "chat": retries 11: must be an integer from 0 to 10`},
		{g + "retries = -1\n", `upstream_group "chat": retries -1: must be an integer from 0 to 10`},
		{g + "max_backoff = \"0s\"\n", `upstream_group "chat": max_backoff "0s": must be positive`},
		{g + "max_backoff = \"11m\"\n", `upstream_group "chat": max_backoff "660s": must be at most 10m`},
		{g + "adaptive = {}\n", `upstream_group "chat": adaptive: needs a rate`},
		{g + a + "adaptive = { start = 0 }\n", `upstream_group "chat": adaptive.start 0: must be above 0 and at most 1`},
		{g + a + "adaptive = { increase = 1.5 }\n", `upstream_group "chat": adaptive.increase 1.5: must be above 0 and at most 1`},
		{g + a + "adaptive = { ceiling = -0.1 }\n", `upstream_group "chat": adaptive.ceiling -0.1: must be above 0 and at most 1`},
		{g + a + "adaptive = { decrease = 1 }\n", `upstream_group "chat": adaptive.decrease 1: must be above 0 and below 1`},
		{g + a + "adaptive = { decrease = 0 }\n", `upstream_group "chat": adaptive.decrease 0: must be above 0 and below 1`},
		{g + a + "adaptive = { start = 0.9 }\n", `upstream_group "chat": adaptive.start 0.9: must not be above ceiling 0.8`},
		{g + a + "adaptive = { every = \"0s\" }\n", `upstream_group "chat": adaptive.every "0s": must be at least 1ms`},
		{g + a + "adaptive = { hold = \"-1m\" }\n", `upstream_group "chat": adaptive.hold "-60s": must not be negative`},
		{g + "fair_by = 1\n", `upstream_group "chat": fair_by 1: not a string`},
		{g + "fair_by = \"team\"\n", `upstream_group "chat": fair_by "team": unknown key part (one of global, caller, api_key, ip, method, path, model, tier, or header:, query:, json:, xml:, form:, jwt:)`},
		{g + "fair_by = \"header:\"\n", `upstream_group "chat": fair_by "header:": a name is missing after header:`},
		{g + "fair_by = \"json:user\"\n", `upstream_group "chat": fair_by "json:user": must not read the body (caller, api_key, ip, tier, header:, query: or jwt: …)`},
		{g + "fair_by = \"model\"\n", `upstream_group "chat": fair_by "model": must not read the body (caller, api_key, ip, tier, header:, query: or jwt: …)`},
		{g + "fair_by = \"tier\"\n", `upstream_group "chat": fair_by "tier": needs tier_from or api_keys_file (where a caller's plan comes from)`},
		{g + "fair_weights = 3\n", `upstream_group "chat": fair_weights 3: not a table { pro = 3, free = 1 }`},
		{g + "fair_weights = { pro = 1.5 }\n", `upstream_group "chat": fair_weights.pro 1.5: not an integer`},
		{"tier_from = \"header:X-Plan\"\n" + g + "fair_weights = { pro = 0 }\n", `upstream_group "chat": fair_weights.pro 0: must be an integer from 1 to 1000`},
		{"tier_from = \"header:X-Plan\"\n" + g + "fair_weights = { pro = 1001 }\n", `upstream_group "chat": fair_weights.pro 1001: must be an integer from 1 to 1000`},
		{g + "fair_weights = { pro = 3 }\n", `upstream_group "chat": fair_weights: needs tier_from or api_keys_file (where a caller's plan comes from)`},
	} {
		_, err := loadRules(t, tc.body, nil)
		if err == nil || !slices.Contains(strings.Split(err.Error(), "\n"), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s", tc.body, err, tc.want)
		}
	}
}

// One problem, one line: a field that cannot be read is not also reported
// by Validate, and a valid group reports nothing.
func TestUpstreamGroupOneErrorPerProblem(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[[upstream_group]]\nname = \"chat\"\nmax_backoff = 20\n", `upstream_group "chat": max_backoff 20: missing unit`},
		{"[[upstream_group]]\nname = \"chat\"\nrate = -5\nadaptive = { start = 0.5 }\n", `upstream_group "chat": rate -5: must be an integer from 0 to 1000000000`},
	} {
		c, err := config.Load(writeFile(t, "upstream_url = \"http://127.0.0.1:1\"\n"+tc.body), env(nil))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q:\n got %v\nwant %s", tc.body, err, tc.want)
		}
	}
	if _, err := loadRules(t, "tier_from = \"header:X-Plan\"\n[[upstream_group]]\nname = \"a\"\npriority_from = \"tier\"\npriorities = [\"pro\", \"default\", \"free\"]\n", nil); err != nil {
		t.Errorf("priority_from = tier with tier_from: %v", err)
	}
}

// Validate reports; it never changes the groups.
func TestUpstreamGroupValidateDoesNotMutate(t *testing.T) {
	c, err := config.Load(writeFile(t, "upstream_url = \"http://127.0.0.1:1\"\n[[upstream_group]]\nname = \"A\"\npriorities = [\"X\", \"x\"]\nrate = 0\nadaptive = { start = 2 }\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	before := cloneGroups(c.UpstreamGroups)
	if c.Validate() == nil {
		t.Fatal("no error")
	}
	if !reflect.DeepEqual(before, c.UpstreamGroups) {
		t.Fatalf("Validate changed the groups:\n%+v\n%+v", before, c.UpstreamGroups)
	}
}

func cloneGroups(gs []config.UpstreamGroup) []config.UpstreamGroup {
	out := slices.Clone(gs)
	for i := range out {
		out[i].Paths = slices.Clone(out[i].Paths)
		out[i].Priorities = slices.Clone(out[i].Priorities)
		if out[i].Adaptive != nil {
			a := *out[i].Adaptive
			out[i].Adaptive = &a
		}
	}
	return out
}

// -check prints every group with every field's effective value, as TOML
// that Load reads back to the same groups.
func TestUpstreamGroupCheckOutputRoundTrip(t *testing.T) {
	c, err := loadRules(t, `
protected_paths = ["/v1/chat/completions", "/v1/messages"]
tier_from = "header:X-Plan"

[[upstream_group]]
name = "chat"
rate = 600
max_in_flight = 32
priority_from = "header:X-Priority"
fair_by = "caller"
fair_weights = { pro = 3, "team plan" = 2 }
adaptive = { start = 0.333333, increase = 0.05, every = "90s", decrease = 0.7, hold = "1m30s", ceiling = 1 }

[[upstream_group]]
name = "files"
paths = ["/v1/files", "/v1/uploads/*"]
per = "1500ms"
queue = 0
max_wait = "0s"
priority_from = "query:prio"
priorities = ["Gold", "default"]
retries = 0
max_backoff = "250ms"
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := c.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\n[[upstream_group]]\nname = \"chat\"\n# paths = [\"/v1/chat/completions\", \"/v1/messages\"] (unset: the protected paths)\nmax_in_flight = 32\nrate = 600\nper = \"60s\"\nqueue = 1000\nmax_wait = \"30s\"\n" +
			"priority_from = \"header:X-Priority\"\npriorities = [\"interactive\", \"default\", \"batch\"]\nretries = 2\nmax_backoff = \"20s\"\n" +
			"fair_by = \"caller\"\nfair_weights = { \"pro\" = 3, \"team plan\" = 2 }\n" +
			"adaptive = { start = 0.333333, increase = 0.05, every = \"90s\", decrease = 0.7, hold = \"90s\", ceiling = 1 }\n",
		"\n[[upstream_group]]\nname = \"files\"\npaths = [\"/v1/files\", \"/v1/uploads/*\"]\nmax_in_flight = 0\nrate = 0\nper = \"1.5s\"\nqueue = 0\nmax_wait = \"0s\"\n" +
			"priority_from = \"query:prio\"\npriorities = [\"gold\", \"default\"]\nretries = 0\nmax_backoff = \"250ms\"\n" +
			"fair_by = \"\"\n# fair_weights: none (every plan 1)\n# adaptive: off\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-check output lacks\n%s\nin\n%s", want, out.String())
		}
	}
	back, err := config.Load(writeFile(t, out.String()), env(nil))
	if err != nil {
		t.Fatalf("-check output does not load: %v\n%s", err, out.String())
	}
	if err := back.Validate(); err != nil {
		t.Fatalf("-check output does not validate: %v", err)
	}
	// A group without paths is printed with protected_paths' list as a
	// comment: read back, it still has none.
	want := cloneGroups(c.UpstreamGroups)
	if !reflect.DeepEqual(back.UpstreamGroups, want) {
		t.Fatalf("read back:\n%+v\nwant\n%+v", back.UpstreamGroups, want)
	}
	var again strings.Builder
	if err := back.Write(&again); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(again.String(), out.String()[strings.Index(out.String(), "\n[[upstream_group]]"):]) {
		t.Errorf("second -check output differs:\n%s", again.String())
	}
}

// Upstream groups exist only in the file (SPEC §2): no environment
// variable sets them.
func TestUpstreamGroupsNotFromEnv(t *testing.T) {
	for _, environ := range []map[string]string{
		{"UPSTREAM_GROUP": `[{name = "chat"}]`},
		{"UPSTREAM_GROUP": "chat"},
		{"UPSTREAM_GROUPS": "chat"},
		{"UPSTREAM_GROUP_NAME": "chat", "UPSTREAM_GROUP_RATE": "10"},
	} {
		c, err := loadRules(t, "", environ)
		if err != nil || c.UpstreamGroups != nil {
			t.Errorf("env %v: groups %+v, err %v", environ, c.UpstreamGroups, err)
		}
	}
	// Beside the file's groups, the environment changes nothing of them.
	c, err := loadRules(t, "[[upstream_group]]\nname = \"chat\"\nrate = 5\n", map[string]string{"UPSTREAM_GROUP": "x", "RATE": "7"})
	if err != nil || len(c.UpstreamGroups) != 1 || c.UpstreamGroups[0].Rate != 5 {
		t.Errorf("file groups beside the environment: %+v, %v", c.UpstreamGroups, err)
	}
}

// config.example.toml's commented-out [[upstream_group]], uncommented,
// is SPEC §9's example and valid.
func TestExampleUpstreamGroup(t *testing.T) {
	raw, err := os.ReadFile("../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(raw), "\n# [[upstream_group]]\n")
	if !ok {
		t.Fatal("config.example.toml has no commented-out [[upstream_group]]")
	}
	body := "[[upstream_group]]\n"
	for l := range strings.SplitSeq(block, "\n") {
		if !strings.HasPrefix(l, "# ") {
			break
		}
		body += strings.TrimPrefix(l, "# ") + "\n"
	}
	c, err := loadRules(t, body, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	want := []config.UpstreamGroup{{Name: "chat", Paths: []string{"/v1/chat/completions", "/api/chat"}, MaxInFlight: 32, Rate: 600, Per: time.Minute,
		Queue: 1000, MaxWait: 30 * time.Second, PriorityFrom: "header:X-Priority", Priorities: []string{"interactive", "default", "batch"},
		Retries: 2, MaxBackoff: 20 * time.Second,
		Adaptive: &config.Adaptive{Start: 500_000, Increase: 100_000, Every: 5 * time.Minute, Decrease: 500_000, Hold: 10 * time.Minute, Ceiling: 800_000}}}
	if !reflect.DeepEqual(c.UpstreamGroups, want) {
		t.Fatalf("got %+v\nwant %+v", c.UpstreamGroups, want)
	}
}
