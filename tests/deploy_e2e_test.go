package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/mockapi"
)

// The operator's files in deploy/ (README "Dashboard and alerts"): the
// Grafana dashboard's every query and the alert rules' every condition
// are run against a real Prometheus scraping the real proxy, the rules'
// unit tests run under promtool, and compose.yaml's mounts are checked
// against the files they mount.
const (
	dashboardPath   = "../deploy/grafana/ratelimit-proxy.json"
	alertsPath      = "../deploy/prometheus/alerts.yml"
	alertsTestPath  = "../deploy/prometheus/alerts_test.yml"
	promConfigPath  = "../deploy/prometheus.yml"
	composePath     = "../compose.yaml"
	deployScrapeJob = "ratelimit-proxy" // the job RatelimitProxyDown selects
	deployJWTSecret = "deploy-test-hs256-secret-of-32-bytes-or-more"
)

// requireProm returns the path of a Prometheus program; missing, the test
// is skipped, or fails with REQUIRE_PROMETHEUS=1 (as .ci/run sets).
func requireProm(t *testing.T, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("REQUIRE_PROMETHEUS") == "1" {
			t.Fatalf("%s not found and REQUIRE_PROMETHEUS=1", name)
		}
		t.Skipf("%s not installed (Debian package prometheus; set REQUIRE_PROMETHEUS=1 to make this a failure)", name)
	}
	return bin
}

// deployConfig exercises the families the dashboard shows: request rules
// that refuse (one of them shadow) and an upstream group that queues and
// meets 429s on the chat path; token and money budgets settled to the
// upstream's usage on the Anthropic path. (The budgets are kept off the
// chat path: with a rule there that reads the body, a caller already over
// chat-per-caller is refused before the body is read, and that refusal is
// not counted in ratelimit_proxy_rule_decisions_total.)
const deployConfig = `
[[rule]]
name   = "chat-per-caller"
paths  = ["/v1/chat/completions"]
key    = ["caller"]
limit  = 5
window = "1m"

[[rule]]
name   = "chat-global-shadow"
paths  = ["/v1/chat/completions"]
key    = ["global"]
action = "shadow"
limit  = 3
window = "1m"

[[rule]]
name   = "tokens-per-caller"
paths  = ["/v1/messages"]
cost   = "total_tokens"
output = "clamp"
limit  = 1000000
window = "1h"

[price."claude*"]
input  = 3.00
output = 15.00

[[rule]]
name      = "spend-per-caller"
paths     = ["/v1/messages"]
cost      = "usd"
limit     = 100.00
algorithm = "calendar"
window    = "month"
timezone  = "Europe/Rome"

[[upstream_group]]
name          = "chat"
paths         = ["/v1/chat/completions"]
max_in_flight = 2
queue         = 100
max_wait      = "10s"
priority_from = "header:X-Priority"
priorities    = ["interactive", "batch"]
fair_by       = "caller"
retries       = 2
max_backoff   = "1s"
rate          = 6000
per           = "1m"
adaptive      = { start = 0.8, increase = 0.1, every = "1m", decrease = 0.5, hold = "1m", ceiling = 1.0 }
`

// The dashboard's every query returns series from a Prometheus scraping a
// proxy that served traffic (and an in-memory one saving STATE_FILE);
// every alert rule evaluates without error on series that exist, and the
// alerts this traffic, a refused reload and a flapping Redis should raise
// are raised.
func TestDeployAgainstPrometheus(t *testing.T) {
	promBin := requireProm(t, "prometheus")
	requireProm(t, "promtool")
	// Every wait below is cut to what is left of one minute, so that a
	// stuck step fails the test in time rather than hanging it.
	start := time.Now()
	deadline := start.Add(55 * time.Second)
	left := func(d time.Duration) time.Duration { return max(min(d, time.Until(deadline)), 0) }
	redis := redistest.Start(t)

	// The upstream: the mock API, slow enough that the group queues, and
	// every third chat answer a 429 with Retry-After.
	mock := mockapi.NewWithOptions(mockapi.Options{})
	var chats atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			time.Sleep(100 * time.Millisecond)
			if chats.Add(1)%3 == 0 {
				w.Header().Set("Retry-After", "0.2")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}`)
				return
			}
		}
		mock.ServeHTTP(w, r)
	})
	cfg := filepath.Join(t.TempDir(), "deploy.toml")
	if err := os.WriteFile(cfg, []byte(deployConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	// JWT_HS256_SECRET: the JWT families exist (the callers' plain
	// bearer tokens below are API keys still).
	p := startProxy(t, up.URL, map[string]string{"REDIS_URL": redis.URL(), "REDIS_TIMEOUT": "500ms",
		"FAIL_OPEN": "local", "JWT_HS256_SECRET": deployJWTSecret, "OUTPUT_TOKEN_RESERVE": "learned"}, "-config", cfg)

	// A second proxy, in memory with STATE_FILE (ignored with Redis): the
	// state file's families, saved every 200 ms. Its own upstream, so as
	// not to shift the first one's every-third-chat 429s.
	stateUp := newUpstream(t, mockapi.NewWithOptions(mockapi.Options{}).ServeHTTP)
	sp := startProxy(t, stateUp.URL, map[string]string{"CHAT_RPM": "5",
		"STATE_FILE": filepath.Join(t.TempDir(), "state"), "STATE_FLUSH_INTERVAL": "200ms"})

	// A third target nothing listens on: RatelimitProxyDown's case.
	dead := strings.TrimPrefix(deadURL(t), "http://")
	prom := startPrometheus(t, promBin, []string{p.admin, sp.admin, dead})
	prom.waitFor(t, left(15*time.Second), fmt.Sprintf(`up{instance=%q} == 1`, p.admin), "the proxy scraped")
	t.Logf("prometheus scraping at %v", time.Since(start).Round(100*time.Millisecond))

	// Reloads: one refused (an invalid file: RatelimitProxyConfigReloadFailed),
	// then the file back and one that succeeds.
	if err := os.WriteFile(cfg, []byte("chat_rpm = -5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, p.do(t, http.MethodPost, p.adminURL("/admin/reload"), nil), http.StatusBadRequest)
	if err := os.WriteFile(cfg, []byte(deployConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, p.do(t, http.MethodPost, p.adminURL("/admin/reload"), nil), http.StatusOK)

	// Traffic: one caller far over its limit (denials, the refusal
	// cache), then several callers at once (the group's queue, the
	// upstream's 429s and the retries).
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	sent := 0
	var codes sync.Map
	count := func(res result) {
		if res.err != nil {
			t.Errorf("request: %v", res.err)
			return
		}
		n, _ := codes.LoadOrStore(res.r.StatusCode, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	for range 20 {
		count(send(ctx, p, http.MethodPost, "/v1/chat/completions", nil, "Authorization", "Bearer deploy-over-limit"))
		sent++
	}
	var wg sync.WaitGroup
	for c := range 4 {
		for i := range 3 {
			wg.Add(1)
			sent++
			go func() {
				defer wg.Done()
				prio := []string{"interactive", "batch"}[(c+i)%2]
				count(send(ctx, p, http.MethodPost, "/v1/chat/completions", nil,
					"Authorization", fmt.Sprintf("Bearer deploy-caller-%d", c), "X-Priority", prio))
			}()
		}
	}
	messages := func() {
		for i := range 3 {
			wg.Add(1)
			sent++
			go func() {
				defer wg.Done()
				count(send(ctx, p, http.MethodPost, "/v1/messages", nil, "Authorization", fmt.Sprintf("Bearer deploy-caller-%d", i)))
			}()
		}
	}
	messages()
	wg.Wait()
	// The per-model series appear with their first settlement, which
	// rate() cannot see: a second round once they are scraped moves them.
	prom.waitFor(t, left(10*time.Second), fmt.Sprintf(`ratelimit_proxy_spend_usd_total{instance=%q}`, p.admin), "spend scraped")
	messages()
	wg.Wait()
	// A verified JWT and a forged one (no credential: the caller is its
	// IP), then the in-memory proxy's counters for its state file.
	for _, secret := range []string{deployJWTSecret, "not-the-deploy-secret-not-the-deploy-secret"} {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "deploy-jwt"}).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		count(send(ctx, p, http.MethodPost, "/v1/messages", nil, "Authorization", "Bearer "+tok))
		sent++
	}
	for i := range 3 {
		count(send(ctx, sp, http.MethodPost, "/v1/chat/completions", nil, "Authorization", fmt.Sprintf("Bearer deploy-state-%d", i)))
	}
	t.Logf("traffic sent at %v", time.Since(start).Round(100*time.Millisecond))
	codes.Range(func(k, v any) bool {
		t.Logf("traffic: %d × %v", v.(*atomic.Int64).Load(), k)
		return true
	})

	// Redis goes away and comes back three times, then stays away: the
	// breaker flaps, then the store is down and decisions fall back to
	// memory (FAIL_OPEN=local). Three failed decisions in a row open the
	// breaker (on the budget rules' path, outside the upstream group; each
	// from a new caller: a refusal remembered would not ask the store);
	// the proxy's probe closes it.
	storeUp := func(want float64) {
		t.Helper()
		if !waitFor(left(5*time.Second), func() bool {
			if want == 0 {
				count(send(ctx, p, http.MethodPost, "/v1/messages", nil,
					"Authorization", fmt.Sprintf("Bearer deploy-flap-%d", sent)))
				sent++
			}
			return sample(t, p, "ratelimit_proxy_store_up") == want
		}) {
			t.Fatalf("ratelimit_proxy_store_up never became %v", want)
		}
	}
	for i := range 4 {
		redis.Stop()
		storeUp(0)
		if i < 3 {
			redis.Restart(t)
			storeUp(1)
		}
	}
	for range 4 {
		count(send(ctx, p, http.MethodPost, "/v1/chat/completions", nil, "Authorization", "Bearer deploy-fallback"))
		sent++
	}
	t.Logf("breaker flapped at %v", time.Since(start).Round(100*time.Millisecond))
	prom.waitFor(t, left(10*time.Second), fmt.Sprintf(`sum(ratelimit_proxy_requests_total{instance=%q}) >= %d`, p.admin, sent),
		"every request scraped")
	prom.waitFor(t, left(10*time.Second), fmt.Sprintf(`ratelimit_proxy_store_up{instance=%q} == 0`, p.admin), "the store down scraped")
	prom.waitFor(t, left(5*time.Second), fmt.Sprintf(`ratelimit_proxy_state_saved_keys{instance=%q} > 0`, sp.admin), "a state save scraped")

	d := loadDashboard(t)
	t.Run("every family is on the dashboard", func(t *testing.T) {
		var exprs strings.Builder
		for _, pn := range d.queryPanels() {
			for _, tg := range pn.Targets {
				exprs.WriteString(tg.Expr + "\n")
			}
		}
		for _, fam := range append(scrapedFamilies(t, p), scrapedFamilies(t, sp)...) {
			if !regexp.MustCompile(`\b` + fam + `(_bucket|_sum|_count)?\b`).MatchString(exprs.String()) {
				t.Errorf("%s is exported but no panel shows it", fam)
			}
		}
	})

	t.Run("every panel query returns series", func(t *testing.T) {
		vars := map[string]string{"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
		for _, v := range d.Templating.List {
			vars[v.Name] = ".*" // every variable at "All"
		}
		for name, lv := range d.variableQueries(t) {
			q := fmt.Sprintf("count by (%s) (%s)", lv[1], substituteVars(t, lv[0], vars))
			if res := prom.query(t, q); len(res) == 0 {
				t.Errorf("variable %s: %s returns no series", name, q)
			}
		}
		zero := []string{}
		n := 0
		for _, pn := range d.queryPanels() {
			for _, tg := range pn.Targets {
				n++
				q := substituteVars(t, tg.Expr, vars)
				res := prom.query(t, q)
				if len(res) == 0 {
					t.Errorf("panel %q, query %s returns no series:\n%s", pn.Title, tg.RefID, q)
					continue
				}
				if !slices.ContainsFunc(res, func(s promSample) bool { v := s.value(); return v != 0 && v == v }) {
					zero = append(zero, fmt.Sprintf("%s/%s", pn.Title, tg.RefID))
				}
			}
		}
		t.Logf("%d panel queries, %d of them with only zero or NaN values now: %s", n, len(zero), strings.Join(zero, "; "))
	})

	rules := prom.rules(t)
	t.Run("every alert rule evaluates on existing series", func(t *testing.T) {
		if len(rules) == 0 {
			t.Fatal("Prometheus loaded no alert rule")
		}
		for _, r := range rules {
			if r.Health != "ok" {
				t.Errorf("%s: health %q: %s", r.Name, r.Health, r.LastError)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a severity label and summary and description annotations: %v %v", r.Name, r.Labels, r.Annotations)
			}
			for _, operand := range alertOperands(r.Query) {
				if res := prom.query(t, operand); len(res) == 0 {
					t.Errorf("%s: %s returns no series (condition: %s)", r.Name, operand, r.Query)
				}
			}
		}
	})

	t.Run("the alerts this traffic should raise are raised", func(t *testing.T) {
		want := []string{"RatelimitProxyDown", "RatelimitProxyStoreDown", "RatelimitProxyBreakerFlapping",
			"RatelimitProxyHighDenialRate", "RatelimitProxyUsageNearLimit", "RatelimitProxyUpstreamThrottling",
			"RatelimitProxyConfigReloadFailed"}
		var states map[string]string
		ok := waitFor(left(10*time.Second), func() bool {
			states = map[string]string{}
			for _, r := range prom.rules(t) {
				states[r.Name] = r.State
			}
			for _, name := range want {
				if states[name] != "pending" && states[name] != "firing" {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Errorf("want %v pending or firing; states: %v", want, states)
		}
		t.Logf("alert states: %v", states)
	})
	t.Logf("took %v", time.Since(start).Round(100*time.Millisecond))
}

// scrapedFamilies are the ratelimit_proxy_ families p exports now.
func scrapedFamilies(t *testing.T, p *proc) []string {
	t.Helper()
	r := p.do(t, http.MethodGet, p.adminURL("/metrics"), nil)
	wantStatus(t, r, http.StatusOK)
	var out []string
	for _, l := range strings.Split(string(r.body), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" && strings.HasPrefix(f[2], "ratelimit_proxy_") {
			out = append(out, f[2])
		}
	}
	if len(out) == 0 {
		t.Fatal("no ratelimit_proxy_ family on /metrics")
	}
	return out
}

// substituteVars replaces Grafana's variables in a query: the interval
// variables by fixed durations, template variables by vars.
func substituteVars(t *testing.T, q string, vars map[string]string) string {
	t.Helper()
	re := regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)`)
	return re.ReplaceAllStringFunc(q, func(m string) string {
		sub := re.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		v, ok := vars[name]
		if !ok {
			t.Errorf("query %s: unknown variable $%s", q, name)
		}
		return v
	})
}

// alertOperands are the operands of expr's top-level and/or/unless, each
// without its comparison with a number: the series an alert's condition
// is computed from, which must exist even while the alert is quiet.
func alertOperands(expr string) []string {
	var parts []string
	from := 0
	topLevel(expr, func(i int) int {
		for _, op := range []string{"and", "or", "unless"} {
			if wordAt(expr, i, op) {
				parts = append(parts, expr[from:i])
				from = i + len(op)
				return len(op) - 1
			}
		}
		return 0
	})
	parts = append(parts, expr[from:])
	modifier := regexp.MustCompile(`^\s*(on|ignoring|group_left|group_right)\s*(\([^)]*\))?`)
	for i, part := range parts {
		for modifier.MatchString(part) {
			part = modifier.ReplaceAllString(part, "")
		}
		parts[i] = strings.TrimSpace(withoutComparison(part))
	}
	return parts
}

func TestDeployAlertOperands(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up{job="ratelimit-proxy"} == 0`, []string{`up{job="ratelimit-proxy"}`}},
		{`round(sum by (instance) (increase(x_total{to="down"}[10m]))) >= 3`, []string{`round(sum by (instance) (increase(x_total{to="down"}[10m])))`}},
		{`(a - b) / c > 0.25 and c > 0.05`, []string{`(a - b) / c`, `c`}},
		{`max by (rule) (ratio) > 0.9 and on (job, rule) sum by (job, rule) (rate(store_or_not[5m])) > 0`,
			[]string{`max by (rule) (ratio)`, `sum by (job, rule) (rate(store_or_not[5m]))`}},
		{`histogram_quantile(0.95, sum by (le) (rate(w_bucket{le=~"1|>2"}[5m]))) > 5`, []string{`histogram_quantile(0.95, sum by (le) (rate(w_bucket{le=~"1|>2"}[5m])))`}},
		{`a unless b`, []string{`a`, `b`}},
		{`a > b`, []string{`a > b`}}, // not a threshold: kept
	} {
		if got := alertOperands(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("alertOperands(%s) = %q, want %q", c.expr, got, c.want)
		}
	}
}

// withoutComparison is expr less a last top-level comparison with a number
// ("x > 0.9" is "x").
func withoutComparison(expr string) string {
	cut := -1
	topLevel(expr, func(i int) int {
		if !strings.ContainsRune("=!<>", rune(expr[i])) {
			return 0
		}
		rest := strings.TrimLeft(expr[i+1:], "=")
		rest = strings.TrimPrefix(strings.TrimSpace(rest), "bool ")
		if _, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			cut = i
		}
		if i+1 < len(expr) && expr[i+1] == '=' {
			return 1
		}
		return 0
	})
	if cut < 0 {
		return expr
	}
	return expr[:cut]
}

// topLevel calls visit with each index of expr outside brackets and
// quotes; visit returns how many more bytes to skip.
func topLevel(expr string, visit func(i int) int) {
	depth := 0
	var quote byte
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case c == '(' || c == '{' || c == '[':
			depth++
		case c == ')' || c == '}' || c == ']':
			depth--
		case depth == 0:
			i += visit(i)
		}
	}
}

func wordAt(s string, i int, w string) bool {
	if !strings.HasPrefix(s[i:], w) {
		return false
	}
	ident := func(c byte) bool {
		return c == '_' || c == ':' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
	}
	return (i == 0 || !ident(s[i-1])) && (i+len(w) == len(s) || !ident(s[i+len(w)]))
}
