package tests

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// JWT identity on the binary: an EdDSA key set fetched over https with the
// trust store named by SSL_CERT_FILE, an HS256 secret from the
// environment, the subject as the caller, and a forged token as no
// credential.
func TestJWTIdentityEndToEnd(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: "ed1", Algorithm: "EdDSA", Use: "sig"}}}
	jwks := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(jwks.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: jwks.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "e2e-secret-e2e-secret-e2e-secret"
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"CHAT_RPM": "1", "REQUIRE_AUTH": "true", "JWT_HS256_SECRET": secret,
		"JWT_JWKS": jwks.URL, "SSL_CERT_FILE": ca, "JWT_ISSUER": "https://issuer.test"})

	ed := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"sub": "erin", "iss": "https://issuer.test", "exp": time.Now().Add(time.Hour).Unix()})
	ed.Header["kid"] = "ed1"
	edTok, err := ed.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+edTok), 200)
	r := p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+edTok)
	wantStatus(t, r, 429)
	if got := r.json(t)["denied_key"]; got != "caller=jwt:erin" {
		t.Fatalf("denied_key %v", got)
	}
	hs, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "frank", "iss": "https://issuer.test"}).SignedString([]byte(secret))
	wantStatus(t, p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+hs), 200)
	// Wrong issuer, and a forged signature: no credential, 401.
	wrongIss, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "frank", "iss": "https://evil.test"}).SignedString([]byte(secret))
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "frank", "iss": "https://issuer.test"}).SignedString([]byte("not-the-secret-not-the-secret-xx"))
	for _, tok := range []string{wrongIss, forged} {
		r := p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+tok)
		wantStatus(t, r, 401)
		wantHeader(t, r, "WWW-Authenticate", "Bearer")
	}
	// A plain API key is still a credential.
	wantStatus(t, p.post(t, "/v1/chat/completions", "Authorization", "Bearer sk-plain-key"), 200)
}

// On the binary, alice's verified token is alice on /v1/messages whatever
// API key stands beside it (Anthropic's API reads X-API-Key first), and in
// any spelling a JWT library accepts (a padded signature, a lower-case
// scheme with a tab): with a limit of 1, each such request is refused under
// her subject, not counted under a fresh key.
func TestJWTBesideAPIKeyEndToEnd(t *testing.T) {
	const secret = "e2e-secret-e2e-secret-e2e-secret"
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"CHAT_RPM": "1", "JWT_HS256_SECRET": secret})
	alice, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, p.post(t, "/v1/messages", "Authorization", "Bearer "+alice), 200)
	for i, hdr := range [][]string{
		{"Authorization", "Bearer " + alice, "X-API-Key", "sk-ant-made-up-1"},
		{"Authorization", "Bearer " + alice, "X-API-Key", "sk-ant-made-up-2"},
		{"Authorization", "bearer\t" + alice + "=", "X-API-Key", "sk-ant-made-up-3"},
		{"X-API-Key", "Bearer " + alice + "=="},
	} {
		r := p.post(t, "/v1/messages", hdr...)
		wantStatus(t, r, 429)
		if got := r.json(t)["denied_key"]; got != "caller=jwt:alice" {
			t.Fatalf("request %d: denied_key %v", i, got)
		}
	}
	if n := rec.count(); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1", n)
	}
}
