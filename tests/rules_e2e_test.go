package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// rulesFile is the rule group the end-to-end tests run on every store: a
// composite key read from an XML body, three rules decided together, and
// a token bucket with a burst.
const rulesFile = `
[[rule]]
name           = "sifen-per-ruc"
paths          = ["/sifen/*"]
key            = ["xml:dRucEm", "header:X-Sifen-Env"]
limit          = 1
window         = "10s"
on_missing_key = "skip"

[[rule]]
name  = "per-caller"
paths = ["/api/chat"]
limit = 1000

[[rule]]
name  = "per-team"
paths = ["/api/chat"]
key   = ["header:X-Team"]
limit = 10
window = "1h"

[[rule]]
name  = "team-day"
paths = ["/api/chat"]
key   = ["header:X-Team", "json:user"]
limit = 4
window = "24h"
on_missing_key = "reject"

[[rule]]
name      = "bucket"
paths     = ["/v1/chat/completions"]
algorithm = "token_bucket"
limit     = 1
window    = "1h"
burst     = 5

[[rule]]
name   = "shadow-daily"
paths  = ["/v1/chat/completions"]
limit  = 2
window = "24h"
action = "shadow"
`

func writeRules(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func invoice(ruc string) []byte {
	return []byte(`<?xml version="1.0" encoding="UTF-8"?><rDE xmlns="http://ekuatia.set.gov.py/sifen/xsd"><DE><gEmis>` +
		`<ns2:dRucEm xmlns:ns2="urn:x">` + ruc + `</ns2:dRucEm></gEmis></DE></rDE>`)
}

// runRuleGroup checks rulesFile's behaviour through instances that share
// one store; tag keeps keys apart between runs on one store.
func runRuleGroup(t *testing.T, ps []*proc, tag string, exact bool) {
	pick := func(i int) *proc { return ps[i%len(ps)] }

	t.Run("xml composite key", func(t *testing.T) {
		ruc := "80012345-" + tag
		r := pick(0).do(t, http.MethodPost, pick(0).url("/sifen/recibe-lote"), invoice(ruc), "Content-Type", "application/xml", "X-Sifen-Env", "test")
		wantStatus(t, r, 200)
		r = pick(1).do(t, http.MethodPost, pick(1).url("/SIFEN//recibe-lote"), invoice(ruc), "Content-Type", "text/xml", "X-Sifen-Env", "test")
		wantStatus(t, r, 429)
		b := r.json(t)
		if b["denied_by"] != "sifen-per-ruc" || b["denied_key"] != "xml:dRucEm="+ruc+"&header:X-Sifen-Env=test" || num(b["limit"]) != 1 {
			t.Fatalf("429 body %v", b)
		}
		wantHeader(t, r, "RateLimit-Policy", `"sifen-per-ruc";q=1;w=10`)
		// The other environment has its own key; no issuer: not limited.
		wantStatus(t, pick(1).do(t, http.MethodPost, pick(1).url("/sifen/recibe-lote"), invoice(ruc), "Content-Type", "application/xml", "X-Sifen-Env", "prod"), 200)
		r = pick(0).do(t, http.MethodPost, pick(0).url("/sifen/recibe-lote"), []byte("<rDE/>"), "Content-Type", "application/xml", "X-Sifen-Env", "test")
		wantStatus(t, r, 200)
		wantNoRateLimitHeaders(t, r)
	})

	t.Run("all or nothing under concurrency", func(t *testing.T) {
		team := "team-" + tag
		var ok atomic.Int64
		var wg sync.WaitGroup
		// 40 concurrent requests for 4 users: team-day admits 4 per user,
		// per-team 10 for the team: exactly 10 pass on one server; a
		// Cluster may refuse a little more, never admits more.
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				user := string(rune('a' + i%4))
				r := pick(i).do(t, http.MethodPost, pick(i).url("/api/chat"), []byte(`{"user":"`+user+`","message":"hi"}`), "X-Team", team)
				if r.StatusCode == 200 {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		if ok.Load() > 10 || exact && ok.Load() != 10 {
			t.Fatalf("%d admitted, want 10 (a Cluster: at most 10)", ok.Load())
		}
		// per-team's refusals recorded nothing in team-day: user e has its
		// 4 untouched, but the team is spent.
		r := pick(0).do(t, http.MethodPost, pick(0).url("/api/chat"), []byte(`{"user":"e"}`), "X-Team", team)
		wantStatus(t, r, 429)
		if b := r.json(t); b["denied_by"] != "per-team" || len(b["violated"].([]any)) != 1 {
			t.Fatalf("429 body %v", b)
		}
		// A missing json:user with on_missing_key = "reject": 400.
		r = pick(1).do(t, http.MethodPost, pick(1).url("/api/chat"), []byte(`{"message":"hi"}`), "X-Team", "other-"+tag)
		wantStatus(t, r, 400)
		if b := r.json(t); b["error"] != "missing_key" || b["rule"] != "team-day" || b["key_part"] != "json:user" {
			t.Fatalf("missing key body %v", b)
		}
	})

	t.Run("token bucket burst across instances", func(t *testing.T) {
		key := "Bearer bucket-" + tag
		var ok atomic.Int64
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if pick(i).post(t, "/v1/chat/completions", "Authorization", key).StatusCode == 200 {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 5 {
			t.Fatalf("%d admitted of 12 against a burst of 5", ok.Load())
		}
		r := pick(0).post(t, "/v1/chat/completions", "Authorization", key)
		wantStatus(t, r, 429)
		wantHeader(t, r, "RateLimit-Policy", `"bucket";q=1;w=3600;burst=5`)
		// One token an hour: the next one is about an hour away.
		if ra := num(r.Header.Get("Retry-After")); ra < 3500 || ra > 3600 {
			t.Fatalf("Retry-After %v", ra)
		}
	})

	t.Run("shadow counts and never refuses", func(t *testing.T) {
		var sum float64
		for _, p := range ps {
			sum += sample(t, p, `ratelimit_proxy_shadow_denials_total{rule="shadow-daily"}`)
		}
		// The bucket test's 5 admitted requests came from one caller: the
		// shadow rule (limit 2) would have refused 3 of them.
		if sum < 3 {
			t.Fatalf("shadow denials %v, want at least 3", sum)
		}
	})
}

// sample reads one sample from the proxy's /metrics (0 when absent).
func sample(t *testing.T, p *proc, series string) float64 {
	t.Helper()
	r := p.do(t, http.MethodGet, p.adminURL("/metrics"), nil)
	v := metricValue(string(r.body), series)
	if v == "" {
		return 0
	}
	return num(v)
}

func TestRulesInMemory(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), nil, "-config", writeRules(t, rulesFile))
	runRuleGroup(t, []*proc{p}, "mem", true)
}

func TestRulesTwoInstancesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rec := newRecorder(t)
	env := map[string]string{"REDIS_URL": srv.URL(), "REDIS_TIMEOUT": "1s"}
	cfg := writeRules(t, rulesFile)
	ps := []*proc{startProxy(t, rec.URL(), env, "-config", cfg), startProxy(t, rec.URL(), env, "-config", cfg)}
	runRuleGroup(t, ps, "redis", true)
}

func TestRulesOnRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	rec := newRecorder(t)
	env := map[string]string{"REDIS_URL": c.URL(), "REDIS_TIMEOUT": "1s"}
	cfg := writeRules(t, rulesFile)
	ps := []*proc{startProxy(t, rec.URL(), env, "-config", cfg), startProxy(t, rec.URL(), env, "-config", cfg)}
	runRuleGroup(t, ps, "cluster", false)
}

// An allow list by CIDR (unless) and a when list, through the binary, with
// the client address taken from X-Forwarded-For of a trusted peer.
func TestRulesUnlessCIDR(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"}, "-config", writeRules(t, `
[[rule]]
name   = "outside"
key    = ["ip"]
limit  = 1
window = "1m"
unless = { ip = ["10.0.0.0/8", "2001:db8::/32"] }

[[rule]]
name   = "models"
key    = ["global"]
limit  = 1
window = "1m"
when   = { model = ["gpt-4o*", "o3"] }
`))
	for i := 0; i < 3; i++ {
		for _, ip := range []string{"10.20.30.40", "2001:db8::5"} {
			wantStatus(t, p.post(t, "/api/chat", "X-Forwarded-For", ip), http.StatusOK)
		}
	}
	wantStatus(t, p.post(t, "/api/chat", "X-Forwarded-For", "203.0.113.5"), http.StatusOK)
	r := p.post(t, "/api/chat", "X-Forwarded-For", "203.0.113.5")
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.json(t)["denied_by"]; got != "outside" {
		t.Fatalf("denied_by %v", got)
	}
	// /v1/chat/completions sends gpt-4o-mini: "models" applies, once.
	wantStatus(t, p.post(t, "/v1/chat/completions", "X-Forwarded-For", "10.0.0.1"), http.StatusOK)
	r = p.post(t, "/v1/chat/completions", "X-Forwarded-For", "10.0.0.2")
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.json(t)["denied_by"]; got != "models" {
		t.Fatalf("denied_by %v", got)
	}
}
