package proxy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
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

// sendHeaders posts to path from peer with the header lines given as
// name, value pairs; a name may repeat (two lines).
func sendHeaders(f *fixture, path, peer string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"message":"hi"}`))
	r.RemoteAddr = peer
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

// A verified subject is the caller whatever API-key header stands beside
// it, on every path and in every credential header: alice's token with a
// made-up key (or a made-up JWT) in another header is alice, never a fresh
// budget. Of two verified subjects, the one in the header the path's API
// reads first is the caller.
func TestJWTBesideAnAPIKey(t *testing.T) {
	opt, _ := configFile(t, "chat_rpm = 1\n", "JWT_HS256_SECRET", jwtSecret)
	f := newFixture(t, opt)
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory"}).SignedString([]byte("another-secret-another-secret-xx"))
	cases := []struct {
		name, path string
		hdr        func(tok string, i int) []string
	}{
		{"messages: bearer JWT, made-up X-API-Key", "/v1/messages", func(tok string, i int) []string {
			return []string{"Authorization", "Bearer " + tok, "X-API-Key", fmt.Sprintf("sk-made-up-%d", i)}
		}},
		{"messages: JWT in X-API-Key, made-up bearer", "/v1/messages", func(tok string, i int) []string {
			return []string{"X-API-Key", tok, "Authorization", fmt.Sprintf("Bearer sk-made-up-%d", i)}
		}},
		{"messages: JWT in api-key", "/v1/messages", func(tok string, i int) []string {
			return []string{"Api-Key", tok, "X-API-Key", fmt.Sprintf("sk-made-up-%d", i)}
		}},
		{"messages: made-up JWT in X-API-Key", "/v1/messages", func(tok string, i int) []string {
			return []string{"X-API-Key", forged, "Authorization", "Bearer " + tok}
		}},
		{"chat: JWT in X-API-Key, made-up bearer", "/v1/chat/completions", func(tok string, i int) []string {
			return []string{"Authorization", fmt.Sprintf("Bearer sk-made-up-%d", i), "X-API-Key", tok}
		}},
		{"chat: JWT in api-key, made-up X-API-Key", "/v1/chat/completions", func(tok string, i int) []string {
			return []string{"X-API-Key", fmt.Sprintf("sk-made-up-%d", i), "Api-Key", tok}
		}},
		{"chat: made-up bearer line before the JWT's", "/v1/chat/completions", func(tok string, i int) []string {
			return []string{"Authorization", fmt.Sprintf("Bearer sk-made-up-%d", i), "Authorization", "Bearer " + tok}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub := fmt.Sprintf("alice-%d", i)
			tok := hs256(t, jwt.MapClaims{"sub": sub})
			if w := sendHeaders(f, tc.path, fmt.Sprintf("203.0.113.%d:1", i+1), "Authorization", "Bearer "+tok); w.Code != 200 {
				t.Fatalf("plain token: %d %s", w.Code, w.Body)
			}
			for j := range 2 {
				w := sendHeaders(f, tc.path, fmt.Sprintf("198.51.100.%d:1", 10*i+j), tc.hdr(tok, 10*i+j)...)
				if w.Code != 429 || deniedKey(t, w) != "caller=jwt:"+sub {
					t.Fatalf("try %d: %d %s", j, w.Code, w.Body)
				}
			}
		})
	}
	t.Run("two verified subjects: the path's first header", func(t *testing.T) {
		alice := hs256(t, jwt.MapClaims{"sub": "alice-two"})
		bob := hs256(t, jwt.MapClaims{"sub": "bob-two"})
		for _, tc := range []struct{ path, first, second, want string }{
			{"/v1/chat/completions", "Authorization", "X-Api-Key", "bob-two"},
			{"/v1/messages", "X-Api-Key", "Authorization", "alice-two"},
		} {
			hdr := func(name, tok string) []string {
				if name == "Authorization" {
					tok = "Bearer " + tok
				}
				return []string{name, tok}
			}
			toks := map[string]string{"alice-two": alice, "bob-two": bob}
			other := "alice-two"
			if tc.want == other {
				other = "bob-two"
			}
			h := append(hdr(tc.first, toks[tc.want]), hdr(tc.second, toks[other])...)
			sendHeaders(f, tc.path, "192.0.2.1:1", h...)
			w := sendHeaders(f, tc.path, "192.0.2.2:1", h...)
			if w.Code != 429 || deniedKey(t, w) != "caller=jwt:"+tc.want {
				t.Fatalf("%s: %d %s", tc.path, w.Code, w.Body)
			}
		}
	})
}

// Every spelling of a token that PyJWT, jose or golang-jwt would take for
// it (or that an upstream's header parsing would) is the same caller: with
// a limit of 1, the disguised second request is refused under the
// subject.
func TestJWTSpellingsAreOneCaller(t *testing.T) {
	opt, _ := configFile(t, "chat_rpm = 1\n", "JWT_HS256_SECRET", jwtSecret)
	f := newFixture(t, opt)
	// A token whose signature holds a - or _, so that the standard
	// alphabet spells it differently.
	token := func(t *testing.T, sub string) string {
		for n := 0; ; n++ {
			tok := hs256(t, jwt.MapClaims{"sub": sub, "n": n})
			if sig := tok[strings.LastIndexByte(tok, '.')+1:]; strings.ContainsAny(sig, "-_") {
				return tok
			}
		}
	}
	split := func(tok string) (signed, sig string) {
		i := strings.LastIndexByte(tok, '.')
		return tok[:i], tok[i+1:]
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	cases := []struct {
		name     string
		disguise func(tok string) []string
	}{
		{"bearer in lower case", func(tok string) []string { return []string{"Authorization", "bearer " + tok} }},
		{"BEARER in upper case", func(tok string) []string { return []string{"Authorization", "BEARER " + tok} }},
		{"several spaces after the scheme", func(tok string) []string { return []string{"Authorization", "Bearer    " + tok} }},
		{"a tab after the scheme", func(tok string) []string { return []string{"Authorization", "Bearer\t" + tok} }},
		{"surrounding whitespace", func(tok string) []string { return []string{"Authorization", " \tBearer " + tok + " \t"} }},
		{"no scheme", func(tok string) []string { return []string{"Authorization", tok} }},
		{"another scheme name", func(tok string) []string { return []string{"Authorization", "JWT " + tok} }},
		{"in X-API-Key", func(tok string) []string { return []string{"X-API-Key", tok} }},
		{"Bearer inside X-API-Key", func(tok string) []string { return []string{"X-API-Key", "Bearer " + tok} }},
		{"in api-key with spaces", func(tok string) []string { return []string{"Api-Key", "  " + tok + "  "} }},
		{"signature padded with =", func(tok string) []string { return []string{"Authorization", "Bearer " + tok + "="} }},
		{"signature padded with ==", func(tok string) []string { return []string{"Authorization", "Bearer " + tok + "=="} }},
		{"text after the padding", func(tok string) []string { return []string{"Authorization", "Bearer " + tok + "==x1"} }},
		{"signature in the standard alphabet", func(tok string) []string {
			signed, sig := split(tok)
			return []string{"Authorization", "Bearer " + signed + "." + strings.NewReplacer("-", "+", "_", "/").Replace(sig)}
		}},
		{"whitespace inside the signature", func(tok string) []string {
			signed, sig := split(tok)
			return []string{"Authorization", "Bearer " + signed + "." + sig[:10] + " " + sig[10:20] + "\t" + sig[20:] + "  "}
		}},
		{"spare bits of the signature set", func(tok string) []string {
			signed, sig := split(tok)
			last := strings.IndexByte(alphabet, sig[len(sig)-1])
			return []string{"Authorization", "Bearer " + signed + "." + sig[:len(sig)-1] + string(alphabet[last^1])}
		}},
		{"re-signed with another member order", func(tok string) []string {
			p := strings.Split(tok, ".")
			claims, _ := base64.RawURLEncoding.DecodeString(p[1])
			var m map[string]any
			json.Unmarshal(claims, &m)
			h := base64.RawURLEncoding.EncodeToString([]byte(`{"typ":"JWT","alg":"HS256"}`))
			body := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"n":%v,"sub":%q}`, m["n"], m["sub"])))
			sig, _ := jwt.SigningMethodHS256.Sign(h+"."+body, []byte(jwtSecret))
			return []string{"Authorization", "Bearer " + h + "." + body + "." + base64.RawURLEncoding.EncodeToString(sig)}
		}},
	}
	minute := 0
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub := fmt.Sprintf("user-%d", i)
			tok := token(t, sub)
			for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
				minute += 2
				f.clock.Set(float64(60 * minute)) // a fresh window per path
				if w := sendHeaders(f, path, "203.0.113.1:1", "Authorization", "Bearer "+tok); w.Code != 200 {
					t.Fatalf("%s plain: %d %s", path, w.Code, w.Body)
				}
				w := sendHeaders(f, path, "198.51.100.1:1", tc.disguise(tok)...)
				if w.Code != 429 || deniedKey(t, w) != "caller=jwt:"+sub {
					t.Fatalf("%s disguised: %d %s", path, w.Code, w.Body)
				}
			}
		})
	}
}

// Each JWT-shaped credential costs a signature check: a request carrying
// more than eight different ones is no credential (401 with REQUIRE_AUTH),
// even when the ninth would verify.
func TestJWTTooManyTokens(t *testing.T) {
	opt, _ := configFile(t, "require_auth = true\n", "JWT_HS256_SECRET", jwtSecret)
	f := newFixture(t, opt)
	alice := hs256(t, jwt.MapClaims{"sub": "alice"})
	hdr := func(forged int) []string {
		var h []string
		for i := range forged {
			tok, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "n": i}).SignedString([]byte("another-secret-another-secret-xx"))
			h = append(h, "Authorization", "Bearer "+tok)
		}
		return append(h, "X-API-Key", alice)
	}
	if w := sendHeaders(f, "/v1/chat/completions", "203.0.113.1:1", hdr(7)...); w.Code != 200 {
		t.Fatalf("seven made-up tokens beside alice's: %d %s", w.Code, w.Body)
	}
	w := sendHeaders(f, "/v1/chat/completions", "203.0.113.1:1", hdr(8)...)
	if w.Code != 401 || !strings.Contains(w.Body.String(), "too many tokens") {
		t.Fatalf("eight made-up tokens beside alice's: %d %s", w.Code, w.Body)
	}
	// The same token many times over is one token.
	var same []string
	for range 20 {
		same = append(same, "Authorization", "Bearer "+alice)
	}
	if w := sendHeaders(f, "/v1/chat/completions", "203.0.113.1:1", same...); w.Code != 200 {
		t.Fatalf("one token on twenty lines: %d %s", w.Code, w.Body)
	}
}
