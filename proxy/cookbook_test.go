package proxy_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// The README's policy cookbook: every file in examples/policies loads,
// validates and behaves as its comment says.

func cookbook(t *testing.T, name string, environ ...string) option {
	t.Helper()
	b, err := os.ReadFile("../examples/policies/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return rules(t, string(b), environ...)
}

func TestCookbookEveryFileIsValid(t *testing.T) {
	entries, err := os.ReadDir("../examples/policies")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		c, err := config.Load("../examples/policies/"+e.Name(), func(string) (string, bool) { return "", false })
		if err == nil {
			err = c.Validate()
		}
		if err != nil {
			t.Errorf("%s: %v", e.Name(), err)
		}
	}
}

func TestCookbookChatPerUser(t *testing.T) {
	f := newFixture(t, cookbook(t, "chat-per-user.toml"))
	// A burst of 5, then one token every 3 s (20 a minute).
	for i := range 5 {
		if w := f.send("/api/chat", "203.0.113.7:1", "", `{"message":"hi"}`, "Authorization", "Bearer k1"); w.Code != 200 {
			t.Fatalf("burst %d: %d %s", i, w.Code, w.Body)
		}
	}
	w := f.send("/api/chat", "203.0.113.7:1", "", `{"message":"hi"}`, "Authorization", "Bearer k1")
	if w.Code != 429 || body429(t, w).DeniedBy != "chat-per-user" || w.Header().Get("Retry-After") != "3" {
		t.Fatalf("after the burst: %d %s %v", w.Code, w.Body, w.Header())
	}
	// Free plan: refill 10 a minute (a token every 6 s).
	for range 5 {
		f.send("/v1/chat/completions", "203.0.113.8:1", "application/json", `{"messages":[]}`, "Authorization", "Bearer k2", "X-Plan", "free")
	}
	w = f.send("/v1/chat/completions", "203.0.113.8:1", "application/json", `{"messages":[]}`, "Authorization", "Bearer k2", "X-Plan", "free")
	if w.Code != 429 || w.Header().Get("Retry-After") != "6" || w.Header().Get("X-RateLimit-Limit") != "10" {
		t.Fatalf("free plan: %d %v", w.Code, w.Header())
	}
	// Expert: unlimited by the bucket, still under the per-IP rule (120/min).
	n := 0
	for range 130 {
		if f.send("/api/chat", "198.51.100.1:1", "", `{"message":"hi"}`, "Authorization", "Bearer k3", "X-Plan", "expert").Code == 200 {
			n++
		}
	}
	if n != 120 {
		t.Fatalf("expert admitted %d, want the per-IP 120", n)
	}
	// Rotating made-up keys from one IP gains nothing past the per-IP rule.
	w = f.send("/api/chat", "198.51.100.1:1", "", `{"message":"hi"}`, "Authorization", "Bearer fresh")
	if w.Code != 429 || body429(t, w).DeniedBy != "chat-per-ip" {
		t.Fatalf("rotated key: %d %s", w.Code, w.Body)
	}
}

func TestCookbookSifen(t *testing.T) {
	f := newFixture(t, cookbook(t, "sifen.toml"))
	lot := `<rEnvioLote xmlns="http://ekuatia.set.gov.py/sifen/xsd"><dId>1</dId><xDE><rDE><DE><gDatGralOpe><gEmis>` +
		`<dRucEm>80012345</dRucEm><dDVEmi>6</dDVEmi></gEmis></gDatGralOpe></DE></rDE></xDE></rEnvioLote>`
	send := func(env string) int {
		return f.send("/sifen/de/ws/async/recibe-lote", "203.0.113.7:1", "application/xml", lot, "X-Sifen-Env", env).Code
	}
	if send("test") != 200 || send("test") != 429 || send("prod") != 200 || send("prod") != 429 {
		t.Fatal("one batch per RUC and environment")
	}
	f.clock.Set(10)
	if send("test") != 200 || send("prod") != 429 {
		t.Fatal("test waits 10 s, prod 30 s")
	}
	f.clock.Set(30)
	if send("prod") != 200 {
		t.Fatal("prod after 30 s")
	}
	// No issuer in the body: not limited (the seed's fail-open).
	for range 3 {
		if w := f.send("/sifen/consulta", "203.0.113.7:1", "application/xml", `<rEnviConsRUC><dRUCCons>1</dRUCCons></rEnviConsRUC>`, "X-Sifen-Env", "test"); w.Code != 200 {
			t.Fatalf("no issuer: %d %s", w.Code, w.Body)
		}
	}
}

func TestCookbookMailLevels(t *testing.T) {
	f := newFixture(t, cookbook(t, "mail-levels.toml"))
	send := func(peer, from, domain, key string) int {
		return f.send("/api/v1/send", peer, "application/json", `{"from":"`+from+`","domain":"`+domain+`","to":["x@gmail.com"]}`,
			"Authorization", "Bearer "+key).Code
	}
	// sender-hour (100) is the first level a single sender passes.
	for i := range 100 {
		if c := send("203.0.113.7:1", "a@shop.example", "shop.example", "k1"); c != 200 {
			t.Fatalf("message %d: %d", i, c)
		}
	}
	w := f.send("/api/v1/send", "203.0.113.7:1", "application/json", `{"from":"a@shop.example","domain":"shop.example"}`, "Authorization", "Bearer k1")
	if b := body429(t, w); w.Code != 429 || b.DeniedBy != "sender-hour" || b.DeniedKey != "json:from=a@shop.example" {
		t.Fatalf("sender-hour: %d %s", w.Code, w.Body)
	}
	// Other senders of the domain share domain-hour (1000); the refused
	// message above moved no counter, so exactly 900 more pass.
	n := 0
	for i := range 1000 {
		from := "s" + strconv.Itoa(i%10) + "@shop.example"
		peer := "198.51.100." + strconv.Itoa(1+i%2) + ":1"
		if send(peer, from, "shop.example", "k"+strconv.Itoa(2+i%2)) == 200 {
			n++
		}
	}
	if n != 900 {
		t.Fatalf("domain-hour: %d more admitted, want 900", n)
	}
	// example.com has an override of 5000 an hour.
	if w := f.send("/api/v1/send", "192.0.2.1:1", "application/json", `{"from":"a@example.com","domain":"example.com"}`, "Authorization", "Bearer k9"); w.Header().Get("RateLimit-Policy") == "" ||
		!strings.Contains(w.Header().Get("RateLimit-Policy"), `"domain-hour";q=5000;w=3600`) {
		t.Fatalf("override: %d %v", w.Code, w.Header())
	}
	// A message without a sender field is not counted by the sender levels.
	if w := f.send("/api/v1/send", "192.0.2.2:1", "application/json", `{"domain":"other.example"}`, "Authorization", "Bearer k8"); w.Code != 200 ||
		strings.Contains(w.Header().Get("RateLimit-Policy"), "sender-hour") {
		t.Fatalf("no sender: %d %v", w.Code, w.Header())
	}
}

func TestCookbookMailProfiles(t *testing.T) {
	for _, tc := range []struct {
		file    string
		sender  int // messages one sender may send in an hour
		limited bool
	}{
		{"mail-transactional.toml", 1000, true},
		{"mail-marketing.toml", 5000, true},
		{"mail-shared-hosting.toml", 20, true},
		{"mail-disabled.toml", 0, false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f := newFixture(t, cookbook(t, tc.file))
			n := 0
			for range 30 {
				w := f.send("/api/v1/send", "203.0.113.7:1", "application/json", `{"from":"a@x.example","domain":"x.example"}`)
				if w.Code == 200 {
					n++
				}
				if !tc.limited && w.Header().Get("RateLimit-Policy") != "" {
					t.Fatalf("disabled profile sent rate-limit headers: %v", w.Header())
				}
			}
			want := min(30, tc.sender)
			if !tc.limited {
				want = 30
			}
			if n != want {
				t.Fatalf("%d of 30 admitted, want %d", n, want)
			}
		})
	}
}

func TestCookbookShadowDaily(t *testing.T) {
	f := newFixture(t, cookbook(t, "shadow-daily.toml"))
	// 20 a minute is enforced; the daily 500 only counts.
	for minute := range 30 {
		f.clock.Set(float64(minute * 60))
		for i := range 20 {
			w := f.send("/api/chat", "203.0.113.7:1", "", `{"message":"hi"}`, "Authorization", "Bearer k1")
			if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"chat_rpm";q=20;w=60` {
				t.Fatalf("minute %d request %d: %d %v", minute, i, w.Code, w.Header())
			}
		}
	}
	if got := metric(t, f, "ratelimit_proxy_shadow_denials_total", map[string]string{"rule": "daily-per-key"}); got != 100 {
		t.Fatalf("shadow denials %v, want 600-500", got)
	}
}

func TestCookbookTokenBudgets(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, upstreamAt(url), cookbook(t, "token-budgets.toml", "UPSTREAM_URL", url))
	body := `{"model":"gpt-4o-mini","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`
	est := estimate(t, "/v1/chat/completions", body)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1", "X-Test-Usage", "9,11")
	h := w.Header()
	// X-RateLimit-* and -requests describe rpm; -tokens the token rule
	// with the fewest remaining: the gpt-4o bucket (20000 - reservation).
	if w.Code != 200 || h.Get("X-Ratelimit-Limit") != "60" || h.Get("X-Ratelimit-Remaining-Requests") != "59" ||
		h.Get("X-Ratelimit-Remaining-Tokens") != strconv.FormatInt(20000-est-500, 10) {
		t.Fatalf("%d %v", w.Code, h)
	}
	// max_tokens 30000 is over the bucket's burst: 413 from gpt-4o-tokens.
	big := strings.Replace(body, `"max_tokens":500`, `"max_tokens":30000`, 1)
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", big, "Authorization", "Bearer k1")
	if w.Code != 413 || !strings.Contains(w.Body.String(), `"denied_by":"gpt-4o-tokens"`) {
		t.Fatalf("over the burst: %d %s", w.Code, w.Body)
	}
	// Another model is not under the bucket; enterprise has no daily cap,
	// so only itpm-per-key is a token rule for it.
	claude := `{"model":"claude-sonnet-4","max_tokens":100000,"messages":[{"role":"user","content":"hi"}]}`
	w = f.send("/v1/messages", "203.0.113.7:1", "application/json", claude, "X-Api-Key", "k3", "X-Plan", "enterprise", "X-Test-Usage", "1,1")
	if w.Code != 200 || w.Header().Get("X-Ratelimit-Limit-Tokens") != "30000" {
		t.Fatalf("enterprise: %d %v %s", w.Code, w.Header(), w.Body)
	}
}

// A monthly spend cap in Rome: refused on the last evening of January
// until the 1st (Retry-After is the wait to local midnight), admitted
// again then; RateLimit-Policy's w is the month's length.
func TestCookbookMonthlySpend(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, upstreamAt(url), cookbook(t, "monthly-spend.toml", "UPSTREAM_URL", url))
	// 2026-01-31 22:00 UTC is 23:00 in Rome: an hour to February.
	f.clock.Set(30*86400 + 22*3600)
	body := `{"model":"gpt-4o","max_tokens":60000,"messages":[{"role":"user","content":"hi"}]}`
	// Settled to 1000 input and 59000 output tokens: $0.5925.
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1", "X-Test-Usage", "1000,59000")
	if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"spend-per-key-month";q=1;w=2678400;qu="usd"` {
		t.Fatalf("first: %d %v %s", w.Code, w.Header(), w.Body)
	}
	// $0.60 of output reserved does not fit in the $0.4075 left.
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1")
	if w.Code != 429 || !strings.Contains(w.Body.String(), `"insufficient_quota"`) || w.Header().Get("Retry-After") != "3600" ||
		w.Header().Get("X-Ratelimit-Reset") != "3600" || w.Header().Get("X-Ratelimit-Remaining-Usd") != "0.4075" {
		t.Fatalf("over the cap: %d %v %s", w.Code, w.Header(), w.Body)
	}
	// Half an hour later the wait is half an hour.
	f.clock.Set(30*86400 + 22*3600 + 1800)
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1")
	if w.Code != 429 || w.Header().Get("Retry-After") != "1800" {
		t.Fatalf("half an hour later: %d %v", w.Code, w.Header())
	}
	// A team key has $50.
	w = f.send("/v1/chat/completions", "203.0.113.8:1", "application/json", body, "Authorization", "Bearer k2", "X-Plan", "team", "X-Test-Usage", "1,1")
	if w.Code != 200 || w.Header().Get("X-Ratelimit-Limit-Usd") != "50" {
		t.Fatalf("team: %d %v", w.Code, w.Header())
	}
	// Midnight of the 1st in Rome (23:00 UTC): a fresh month of 28 days.
	f.clock.Set(30*86400 + 23*3600)
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1", "X-Test-Usage", "1,1")
	if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"spend-per-key-month";q=1;w=2419200;qu="usd"` {
		t.Fatalf("February: %d %v %s", w.Code, w.Header(), w.Body)
	}
}

// Hard budgets: a request asking for more output than a key has left is
// lowered to what is left on the tighter rule (here the hourly tokens),
// and the next one, with less than min_output left, is refused.
func TestCookbookHardBudget(t *testing.T) {
	g, url := newGreedy(t)
	f := newFixture(t, upstreamAt(url), cookbook(t, "hard-budget.toml", "UPSTREAM_URL", url))
	body := `{"model":"gpt-4o","max_tokens":600000,"messages":[{"role":"user","content":"hi"}]}`
	est := estimate(t, "/v1/chat/completions", body)
	// $5 buys 500,000 output tokens minus the input's: the token rule is
	// the tighter one.
	want := 500000 - est
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1", "X-Test-Prompt", strconv.FormatInt(est, 10))
	if w.Code != 200 || header(w, "X-Ratelimit-Output-Clamped") != want || g.reported.Load() != 500000 {
		t.Fatalf("want a cap of %d: %d %v", want, w.Code, w.Header())
	}
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k1")
	if w.Code != 429 || !strings.Contains(w.Body.String(), `"denied_by":"tokens-per-key-hour"`) {
		t.Fatalf("spent: %d %s", w.Code, w.Body)
	}
	// Another key has its own budgets; a cap that fits is left alone.
	small := strings.Replace(body, "600000", "100", 1)
	w = f.send("/v1/chat/completions", "203.0.113.8:1", "application/json", small, "Authorization", "Bearer k2", "X-Test-Prompt", "1")
	if w.Code != 200 || w.Header().Get("X-Ratelimit-Output-Clamped") != "" {
		t.Fatalf("k2: %d %v", w.Code, w.Header())
	}
}
