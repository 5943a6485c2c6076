package proxy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

const jwtSecret = "0123456789abcdef0123456789abcdef"

// hs256 signs claims with the test secret.
func hs256(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func deniedKey(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	s, _ := m["denied_key"].(string)
	return s
}

// A verified subject is the caller, whatever token carries it; a token
// shaped like a JWT that does not verify is no credential.
func TestJWTSubjectIsTheCaller(t *testing.T) {
	opt, _ := configFile(t, "chat_rpm = 2\n", "JWT_HS256_SECRET", jwtSecret)
	f := newFixture(t, opt)
	exp := f.clock.Now().Add(time.Hour).Unix()
	a1 := hs256(t, jwt.MapClaims{"sub": "alice", "exp": exp, "n": 1})
	a2 := hs256(t, jwt.MapClaims{"sub": "alice", "exp": exp, "n": 2})
	send := func(peer, tok string) *httptest.ResponseRecorder {
		return f.do("/v1/chat/completions", peer, "Authorization", "Bearer "+tok)
	}
	if c := send("203.0.113.1:1", a1).Code; c != 200 {
		t.Fatalf("first: %d", c)
	}
	if c := send("203.0.113.2:1", a2).Code; c != 200 { // another token, another IP: the same caller
		t.Fatalf("second: %d", c)
	}
	w := send("203.0.113.3:1", a1)
	if w.Code != 429 || deniedKey(t, w) != "caller=jwt:alice" {
		t.Fatalf("third: %d %s", w.Code, w.Body)
	}
	// Forged (other secret), expired, alg none: the IP's budget.
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice"}).SignedString([]byte("another-secret-another-secret-xx"))
	expired := hs256(t, jwt.MapClaims{"sub": "alice", "exp": f.clock.Now().Add(-31 * time.Second).Unix()})
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "alice"}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	for _, tok := range []string{forged, expired, none} {
		w := send("198.51.100.9:1", tok)
		if w.Code == 429 && deniedKey(t, w) != "caller=ip:198.51.100.9" {
			t.Fatalf("an unverified token counted as %s", deniedKey(t, w))
		}
	}
	w = send("198.51.100.9:1", forged)
	if w.Code != 429 || deniedKey(t, w) != "caller=ip:198.51.100.9" {
		t.Fatalf("the IP's third request: %d %s", w.Code, w.Body)
	}
	// A plain API key is still an API key.
	if w := send("198.51.100.10:1", "sk-plain"); w.Code != 200 {
		t.Fatalf("api key: %d", w.Code)
	}
	if metric(t, f, "ratelimit_proxy_jwt_verifications_total", map[string]string{"result": "refused"}) < 4 {
		t.Fatal("refusals not counted")
	}
}

func TestJWTRequireAuth(t *testing.T) {
	opt, _ := configFile(t, "require_auth = true\n", "JWT_HS256_SECRET", jwtSecret)
	f := newFixture(t, opt)
	bad := hs256(t, jwt.MapClaims{"sub": "bob", "nbf": f.clock.Now().Add(time.Minute).Unix()})
	w := f.do("/v1/chat/completions", "203.0.113.1:1", "Authorization", "Bearer "+bad)
	if w.Code != 401 || w.Header().Get("WWW-Authenticate") != "Bearer" || !strings.Contains(w.Body.String(), "not yet valid") {
		t.Fatalf("not yet valid token: %d %v %s", w.Code, w.Header(), w.Body)
	}
	good := hs256(t, jwt.MapClaims{"sub": "bob", "nbf": f.clock.Now().Add(29 * time.Second).Unix()}) // within the leeway
	if w := f.do("/v1/chat/completions", "203.0.113.1:1", "Authorization", "Bearer "+good); w.Code != 200 {
		t.Fatalf("good token: %d %s", w.Code, w.Body)
	}
}

// jwt: key parts and a plan from a claim (SPEC §7.2, §7.4).
func TestJWTClaimsAsKeysAndTiers(t *testing.T) {
	opt, _ := configFile(t, `
tier_from = "jwt:plan"
[[rule]]
name   = "per-org"
key    = ["jwt:org"]
limit  = 1
window = "1m"
tiers  = { pro = 3 }
on_missing_key = "reject"
`, "JWT_HS256_SECRET", jwtSecret)
	f := newFixture(t, opt)
	tok := func(org, plan string) string {
		return hs256(t, jwt.MapClaims{"sub": "u-" + org + plan, "org": org, "plan": plan})
	}
	send := func(tok string) *httptest.ResponseRecorder {
		return f.do("/v1/chat/completions", "203.0.113.1:1", "Authorization", "Bearer "+tok)
	}
	if c := send(tok("acme", "free")).Code; c != 200 {
		t.Fatalf("acme 1: %d", c)
	}
	w := send(tok("acme", "free"))
	if w.Code != 429 || deniedKey(t, w) != "jwt:org=acme" {
		t.Fatalf("acme 2: %d %s", w.Code, w.Body)
	}
	for i := range 3 {
		if c := send(tok("globex", "pro")).Code; c != 200 {
			t.Fatalf("globex (pro) %d: %d", i, c)
		}
	}
	if c := send(tok("globex", "pro")).Code; c != 429 {
		t.Fatalf("globex past its tier: %d", c)
	}
	// No org claim: missing key, rejected by the rule.
	if w := send(hs256(t, jwt.MapClaims{"sub": "x"})); w.Code != 400 || !strings.Contains(w.Body.String(), "missing_key") {
		t.Fatalf("no org: %d %s", w.Code, w.Body)
	}
}

// Keys from a JWKS served over TLS; a reload that changes the secret
// stops the old tokens at once.
func TestJWTJWKSAndReload(t *testing.T) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &priv.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(srv.Close)
	opt, write := configFile(t, "chat_rpm = 1\njwt_hs256_secret = \""+jwtSecret+"\"\njwt_jwks = \""+srv.URL+"\"\n")
	f := newFixture(t, opt, func(_ *config.Config, o *proxy.Options) { o.JWKSClient = srv.Client() })
	es := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "carol"})
	es.Header["kid"] = "k1"
	esTok, err := es.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	send := func(tok string) *httptest.ResponseRecorder {
		return f.do("/v1/chat/completions", "203.0.113.1:1", "Authorization", "Bearer "+tok)
	}
	send(esTok)
	if w := send(esTok); w.Code != 429 || deniedKey(t, w) != "caller=jwt:carol" {
		t.Fatalf("ES256 from the key set: %d %s", w.Code, w.Body)
	}
	hsTok := hs256(t, jwt.MapClaims{"sub": "dave"})
	send(hsTok)
	if w := send(hsTok); w.Code != 429 || deniedKey(t, w) != "caller=jwt:dave" {
		t.Fatalf("HS256 with the secret: %d %s", w.Code, w.Body)
	}
	// Reload without the secret: the HS token is no credential any more.
	write("chat_rpm = 1\njwt_jwks = \"" + srv.URL + "\"\n")
	if _, err := f.p.Reload("test"); err != nil {
		t.Fatal(err)
	}
	send(hsTok)
	if w := send(hsTok); w.Code != 429 || deniedKey(t, w) != "caller=ip:203.0.113.1" {
		t.Fatalf("after dropping the secret: %d %s", w.Code, w.Body)
	}
}
