package jwtauth_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// bothVerifier verifies with the secret and with a key set of every key
// type, served over TLS.
func bothVerifier(t *testing.T, c *clock) *jwtauth.Verifier {
	k := keys()
	srv := newJWKSServer(t, keySetJSON(t, standardSet(k)...))
	return newVerifier(t, jwtauth.Options{
		Secret:  k.secret,
		JWKS:    srv.URL + "/jwks.json",
		Client:  srv.Client(),
		Refresh: time.Hour,
		Now:     c.Now,
	})
}

func TestEveryAlgorithm(t *testing.T) {
	k := keys()
	c := newClock()
	v := bothVerifier(t, c)
	claims := jwt.MapClaims{"sub": "alice", "exp": c.Now().Add(time.Hour).Unix()}
	cases := []struct {
		m          jwt.SigningMethod
		kid        string
		key, wrong any
	}{
		{jwt.SigningMethodHS256, "", k.secret, k.secret2},
		{jwt.SigningMethodHS384, "", k.secret, k.secret2},
		{jwt.SigningMethodHS512, "", k.secret, k.secret2},
		{jwt.SigningMethodRS256, "rsa", k.rsa, k.rsaOther},
		{jwt.SigningMethodRS384, "rsa", k.rsa, k.rsaOther},
		{jwt.SigningMethodRS512, "rsa", k.rsa, k.rsaOther},
		{jwt.SigningMethodPS256, "rsa", k.rsa, k.rsaOther},
		{jwt.SigningMethodPS384, "rsa", k.rsa, k.rsaOther},
		{jwt.SigningMethodPS512, "rsa", k.rsa, k.rsaOther},
		{jwt.SigningMethodES256, "p256", k.p256, k.p256Other},
		{jwt.SigningMethodES384, "p384", k.p384, k.p384Other},
		{jwt.SigningMethodES512, "p521", k.p521, k.p521Other},
		{jwt.SigningMethodEdDSA, "ed", k.ed, k.edOther},
	}
	for _, tc := range cases {
		t.Run(tc.m.Alg(), func(t *testing.T) {
			got, err := verify(v, sign(t, tc.m, tc.key, tc.kid, claims))
			if err != nil {
				t.Fatalf("right key: %v", err)
			}
			if sub, _ := got.Subject("sub"); sub != "alice" {
				t.Fatalf("sub = %q", sub)
			}
			_, err = verify(v, sign(t, tc.m, tc.wrong, tc.kid, claims))
			wantErr(t, err, "bad signature")
			if tc.kid != "" {
				// Without kid: the keys that fit the algorithm are tried.
				if _, err := verify(v, sign(t, tc.m, tc.key, "", claims)); err != nil {
					t.Fatalf("right key, no kid: %v", err)
				}
				_, err = verify(v, sign(t, tc.m, tc.wrong, "", claims))
				wantErr(t, err, "bad signature")
			}
		})
	}
}

// segment encodes v as a token segment.
func segment(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func TestRefusals(t *testing.T) {
	k := keys()
	c := newClock()
	v := bothVerifier(t, c)
	claims := jwt.MapClaims{"sub": "mallory"}
	good := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa", claims)
	parts := strings.Split(good, ".")

	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	noneKID := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
	noneKID.Header["kid"] = "rsa"
	noneWithKID, _ := noneKID.SignedString(jwt.UnsafeAllowNoneSignatureType)

	// Algorithm confusion: HS256 with the RSA public key as the HMAC secret,
	// in every form an attacker may try, with the RSA key's kid.
	der, _ := x509.MarshalPKIXPublicKey(k.rsa.Public())
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	pkcs1 := x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)
	jwkJSON := keySetJSON(t, jwk{kid: "rsa", pub: k.rsa.Public()})

	// ES256 over a P-384 key: a real P-384 signature of the SHA-256 digest.
	es256P384 := func(kid string) string {
		h := map[string]any{"alg": "ES256", "typ": "JWT"}
		if kid != "" {
			h["kid"] = kid
		}
		input := segment(t, h) + "." + segment(t, claims)
		sum := sha256.Sum256([]byte(input))
		r, s, err := ecdsa.Sign(rand.Reader, k.p384, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		sig := make([]byte, 96)
		r.FillBytes(sig[:48])
		s.FillBytes(sig[48:])
		return input + "." + base64.RawURLEncoding.EncodeToString(sig)
	}

	withHeader := func(h map[string]any, key any, m jwt.SigningMethod) string {
		tok := jwt.NewWithClaims(m, claims)
		for name, val := range h {
			tok.Header[name] = val
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tampered := parts[0] + "." + segment(t, jwt.MapClaims{"sub": "admin"}) + "." + parts[2]

	cases := []struct {
		name, token, want string
	}{
		{"alg none", none, "unsupported algorithm"},
		{"alg none with kid", noneWithKID, "unsupported algorithm"},
		{"alg None", segment(t, map[string]string{"alg": "None"}) + "." + parts[1] + ".", "unsupported algorithm"},
		{"HS256 keyed with the RSA PEM", sign(t, jwt.SigningMethodHS256, pemKey, "rsa", claims), "bad signature"},
		{"HS256 keyed with the RSA DER", sign(t, jwt.SigningMethodHS256, der, "rsa", claims), "bad signature"},
		{"HS256 keyed with PKCS1", sign(t, jwt.SigningMethodHS256, pkcs1, "rsa", claims), "bad signature"},
		{"HS256 keyed with the JWK", sign(t, jwt.SigningMethodHS256, jwkJSON, "rsa", claims), "bad signature"},
		{"ES256 over P-384, kid", es256P384("p384"), "key does not fit the algorithm"},
		{"ES256 over P-384, no kid", es256P384(""), "bad signature"},
		{"RS256 naming the EC key", sign(t, jwt.SigningMethodRS256, k.rsa, "p256", claims), "key does not fit the algorithm"},
		{"ES256 naming the RSA key", sign(t, jwt.SigningMethodES256, k.p256, "rsa", claims), "key does not fit the algorithm"},
		{"EdDSA naming the P-256 key", sign(t, jwt.SigningMethodEdDSA, k.ed, "p256", claims), "key does not fit the algorithm"},
		{"crit header", withHeader(map[string]any{"kid": "rsa", "crit": []string{"exp"}}, k.rsa, jwt.SigningMethodRS256), "unsupported critical header"},
		{"crit header on HS256", withHeader(map[string]any{"crit": []string{"b64"}, "b64": false}, k.secret, jwt.SigningMethodHS256), "unsupported critical header"},
		{"kid not a string", withHeader(map[string]any{"kid": 7}, k.rsa, jwt.SigningMethodRS256), "malformed"},
		{"tampered payload", tampered, "bad signature"},
		{"tampered header", segment(t, map[string]string{"alg": "RS256", "kid": "rsa", "typ": "at+jwt"}) + "." + parts[1] + "." + parts[2], "bad signature"},
		{"signature removed", parts[0] + "." + parts[1] + ".", "bad signature"},
		{"two segments", parts[0] + "." + parts[1], "malformed"},
		{"four segments", good + ".x", "bad signature"}, // read as PyJWT reads it: the payload holds a dot
		{"trailing dot", good + ".", "bad signature"},
		{"one more signature character", good + "A", "bad signature"},
		{"standard base64 alphabet, one more character", parts[0] + "." + parts[1] + "." + strings.NewReplacer("-", "+", "_", "/").Replace(parts[2]) + "+", "bad signature"},
		{"padded header", parts[0] + "=." + parts[1] + "." + parts[2], "bad signature"}, // the signature covers the header as sent
		{"header readings differ", parts[0][:8] + "=" + parts[0][8:] + "." + parts[1] + "." + parts[2], "malformed"},
		{"empty", "", "malformed"},
		{"dots only", "..", "malformed"},
		{"header not JSON", "bm90IGpzb24." + parts[1] + "." + parts[2], "malformed"},
		{"payload not JSON", parts[0] + ".bm90IGpzb24." + parts[2], "malformed"},
		{"no alg", segment(t, map[string]string{"kid": "rsa"}) + "." + parts[1] + "." + parts[2], "malformed"},
		{"alg not a string", segment(t, map[string]any{"alg": 256}) + "." + parts[1] + "." + parts[2], "malformed"},
		{"unknown alg", segment(t, map[string]string{"alg": "RS1"}) + "." + parts[1] + "." + parts[2], "unsupported algorithm"},
		{"too long", good[:len(parts[0])+1] + strings.Repeat("A", jwtauth.MaxTokenBytes) + "." + parts[2], "token too long"},
		{"OpenAI key", "sk-proj-abc", "malformed"},
		{"unknown kid", sign(t, jwt.SigningMethodRS256, k.rsa, "nobody", claims), "unknown key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := verify(v, tc.token)
			wantErr(t, err, tc.want)
		})
	}
	if _, err := verify(v, good); err != nil {
		t.Fatalf("the untouched token: %v", err)
	}
}

// A verifier with the secret only never checks an RS* token, and one with a
// key set only never checks an HS* token, whatever its kid.
func TestOneSourceOnly(t *testing.T) {
	k := keys()
	c := newClock()
	claims := jwt.MapClaims{"sub": "x"}
	secretOnly := newVerifier(t, jwtauth.Options{Secret: k.secret, Now: c.Now})
	_, err := verify(secretOnly, sign(t, jwt.SigningMethodRS256, k.rsa, "rsa", claims))
	wantErr(t, err, "unsupported algorithm")
	_, err = verify(secretOnly, sign(t, jwt.SigningMethodEdDSA, k.ed, "", claims))
	wantErr(t, err, "unsupported algorithm")
	if _, err := verify(secretOnly, sign(t, jwt.SigningMethodHS256, k.secret, "anything", claims)); err != nil {
		t.Fatalf("HS256 with a kid: %v", err)
	}

	srv := newJWKSServer(t, keySetJSON(t, standardSet(k)...))
	setOnly := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: time.Hour})
	before := srv.fetches.Load()
	der, _ := x509.MarshalPKIXPublicKey(k.rsa.Public())
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	for _, key := range [][]byte{pemKey, der, k.secret, {}} {
		_, err = verify(setOnly, sign(t, jwt.SigningMethodHS256, key, "rsa", claims))
		wantErr(t, err, "unsupported algorithm")
		_, err = verify(setOnly, sign(t, jwt.SigningMethodHS512, key, "unknown-kid", claims))
		wantErr(t, err, "unsupported algorithm")
	}
	if n := srv.fetches.Load() - before; n != 0 {
		t.Fatalf("HS* tokens caused %d key-set fetches", n)
	}

	if _, err := jwtauth.New(jwtauth.Options{Secret: []byte{}}); err == nil {
		t.Fatal("an empty secret and no key set: New succeeded")
	}
}

// The JWK's own alg and use are obeyed.
func TestKeyAlgAndUse(t *testing.T) {
	k := keys()
	c := newClock()
	path := writeFile(t, keySetJSON(t,
		jwk{kid: "rs256-only", pub: k.rsa.Public(), alg: "RS256"},
		jwk{kid: "enc", pub: k.rsaOther.Public(), use: "enc"},
		jwk{kid: "small", pub: k.rsaSmall.Public()},
	))
	v := newVerifier(t, jwtauth.Options{JWKS: path, Now: c.Now, Refresh: time.Hour})
	claims := jwt.MapClaims{"sub": "x"}
	if _, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsa, "rs256-only", claims)); err != nil {
		t.Fatalf("RS256 on an RS256 key: %v", err)
	}
	_, err := verify(v, sign(t, jwt.SigningMethodPS256, k.rsa, "rs256-only", claims))
	wantErr(t, err, "key does not fit the algorithm")
	_, err = verify(v, sign(t, jwt.SigningMethodRS512, k.rsa, "", claims))
	wantErr(t, err, "unknown key") // no key fits RS512
	_, err = verify(v, sign(t, jwt.SigningMethodRS256, k.rsaOther, "enc", claims))
	wantErr(t, err, "unknown key")
	_, err = verify(v, sign(t, jwt.SigningMethodRS256, k.rsaSmall, "small", claims))
	wantErr(t, err, "unknown key")
}

func TestTimes(t *testing.T) {
	k := keys()
	c := newClock()
	v := newVerifier(t, jwtauth.Options{Secret: k.secret, Now: c.Now})
	now := c.Now().Unix()
	cases := []struct {
		name   string
		claims jwt.MapClaims
		want   string // "" verifies
	}{
		{"no times", jwt.MapClaims{}, ""},
		{"exp ahead", jwt.MapClaims{"exp": now + 60}, ""},
		{"exp 29s past", jwt.MapClaims{"exp": now - 29}, ""},
		{"exp 31s past", jwt.MapClaims{"exp": now - 31}, "expired"},
		{"exp long past", jwt.MapClaims{"exp": now - 86400}, "expired"},
		{"nbf 29s ahead", jwt.MapClaims{"nbf": now + 29}, ""},
		{"nbf 31s ahead", jwt.MapClaims{"nbf": now + 31}, "not yet valid"},
		{"iat in the future", jwt.MapClaims{"iat": now + 3600}, ""},
		{"exp as a string", jwt.MapClaims{"exp": "tomorrow"}, "malformed"},
		{"exp null", jwt.MapClaims{"exp": nil}, "malformed"},
		{"exp fractional", jwt.MapClaims{"exp": float64(now) + 0.5}, ""},
		{"exp huge", jwt.MapClaims{"exp": json.Number("1e999")}, "malformed"},
		{"nbf huge", jwt.MapClaims{"nbf": json.Number("1e999")}, "malformed"},
		{"nbf far ahead", jwt.MapClaims{"nbf": json.Number("1e300")}, "malformed"},
		{"expired and too early", jwt.MapClaims{"exp": now - 100, "nbf": now + 100}, "expired"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := verify(v, sign(t, jwt.SigningMethodHS256, k.secret, "", tc.claims))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tc.want)
		})
	}
	// The same token, as the clock moves.
	tok := sign(t, jwt.SigningMethodHS256, k.secret, "", jwt.MapClaims{"exp": now + 10})
	c.Add(39 * time.Second)
	if _, err := verify(v, tok); err != nil {
		t.Fatalf("29 s after exp: %v", err)
	}
	c.Add(2 * time.Second)
	_, err := verify(v, tok)
	wantErr(t, err, "expired")
}

func TestIssuerAudience(t *testing.T) {
	k := keys()
	c := newClock()
	v := newVerifier(t, jwtauth.Options{Secret: k.secret, Now: c.Now, Issuer: "https://issuer.example", Audience: "ratelimit-proxy"})
	cases := []struct {
		name   string
		claims jwt.MapClaims
		want   string
	}{
		{"both right", jwt.MapClaims{"iss": "https://issuer.example", "aud": "ratelimit-proxy"}, ""},
		{"aud list", jwt.MapClaims{"iss": "https://issuer.example", "aud": []string{"other", "ratelimit-proxy"}}, ""},
		{"wrong iss", jwt.MapClaims{"iss": "https://evil.example", "aud": "ratelimit-proxy"}, "wrong issuer"},
		{"iss with slash", jwt.MapClaims{"iss": "https://issuer.example/", "aud": "ratelimit-proxy"}, "wrong issuer"},
		{"no iss", jwt.MapClaims{"aud": "ratelimit-proxy"}, "wrong issuer"},
		{"wrong aud", jwt.MapClaims{"iss": "https://issuer.example", "aud": "other"}, "wrong audience"},
		{"aud list without us", jwt.MapClaims{"iss": "https://issuer.example", "aud": []string{"a", "b"}}, "wrong audience"},
		{"no aud", jwt.MapClaims{"iss": "https://issuer.example"}, "wrong audience"},
		{"aud a number", jwt.MapClaims{"iss": "https://issuer.example", "aud": 7}, "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := verify(v, sign(t, jwt.SigningMethodHS256, k.secret, "", tc.claims))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tc.want)
		})
	}
	// Unset, neither is checked.
	open := newVerifier(t, jwtauth.Options{Secret: k.secret, Now: c.Now})
	if _, err := verify(open, sign(t, jwt.SigningMethodHS256, k.secret, "", jwt.MapClaims{"iss": "anyone", "aud": "anything"})); err != nil {
		t.Fatal(err)
	}
}

// An error never carries the token or any part of it.
func TestErrorsHoldNoToken(t *testing.T) {
	k := keys()
	c := newClock()
	v := bothVerifier(t, c)
	for _, tok := range []string{
		sign(t, jwt.SigningMethodRS256, k.rsaOther, "rsa", jwt.MapClaims{"sub": "secret-subject"}),
		sign(t, jwt.SigningMethodHS256, k.secret2, "", jwt.MapClaims{"sub": "secret-subject"}),
		"eyJhbGciOiJzZWNyZXQtYWxnIn0.e30.c2lnbmF0dXJl",
	} {
		_, err := verify(v, tok)
		if err == nil || !reasons[err.Error()] || strings.Contains(err.Error(), "secret") {
			t.Fatalf("error %v", err)
		}
	}
}

// Claims come back with numbers as written.
func TestVerifiedClaims(t *testing.T) {
	k := keys()
	v := newVerifier(t, jwtauth.Options{Secret: k.secret, Now: newClock().Now})
	tok := sign(t, jwt.SigningMethodHS256, k.secret, "", jwt.MapClaims{
		"sub":                      "user-1",
		"quota":                    1000000,
		"ratio":                    1.5,
		"big":                      json.Number("12345678901234567890"),
		"admin":                    false,
		"https://example.com/plan": "pro",
		"org":                      map[string]any{"id": 42, "plan": "team"},
	})
	c, err := verify(v, tok)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"sub": "user-1", "quota": "1000000", "ratio": "1.5", "big": "12345678901234567890",
		"admin": "false", "https://example.com/plan": "pro", "org.id": "42", "org.plan": "team",
	} {
		if got, ok := c.Value(name); !ok || got != want {
			t.Errorf("Value(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
	if _, ok := c.Value("org"); ok {
		t.Error("an object is a value")
	}
}

// Every spelling of a signature that PyJWT, jose or golang-jwt reads as
// that signature verifies: padding, text after it, the standard alphabet,
// whitespace and junk inside, spare bits set, and an "=" that only one of
// the two readings (PyJWT's, Node's) stops at.
func TestSignatureSpellings(t *testing.T) {
	k := keys()
	c := newClock()
	v := bothVerifier(t, c)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for _, tc := range []struct {
		name string
		m    jwt.SigningMethod
		key  any
		kid  string
	}{
		{"HS256", jwt.SigningMethodHS256, k.secret, ""},
		{"RS256", jwt.SigningMethodRS256, k.rsa, "rsa"},
		{"ES256", jwt.SigningMethodES256, k.p256, "p256"},
	} {
		tok := sign(t, tc.m, tc.key, tc.kid, jwt.MapClaims{"sub": "alice"})
		i := strings.LastIndexByte(tok, '.')
		signed, sig := tok[:i+1], tok[i+1:]
		last := strings.IndexByte(alphabet, sig[len(sig)-1])
		spellings := map[string]string{
			"padded":             signed + sig + "==",
			"text after padding": signed + sig + "==x y",
			"standard alphabet":  signed + strings.NewReplacer("-", "+", "_", "/").Replace(sig),
			"whitespace inside":  signed + sig[:5] + " \t\r\n" + sig[5:],
			"junk inside":        signed + sig[:5] + "!*~" + sig[5:] + "é",
			"early = (PyJWT)":    signed + sig[:4] + "=" + sig[4:],
			"= then data (Node)": signed + sig + "=AB",
		}
		if len(sig)%4 != 0 {
			spellings["spare bits set"] = signed + sig[:len(sig)-1] + string(alphabet[last^1])
		}
		for name, s := range spellings {
			got, err := verify(v, s)
			if err != nil {
				t.Errorf("%s %s: %v", tc.name, name, err)
				continue
			}
			if sub, _ := got.Subject("sub"); sub != "alice" {
				t.Errorf("%s %s: sub %q", tc.name, name, sub)
			}
		}
		// One character more or less is another signature.
		for _, s := range []string{signed + sig + "AA", signed + sig[:len(sig)-2]} {
			if _, err := verify(v, s); err == nil {
				t.Errorf("%s: %q verified", tc.name, s)
			}
		}
	}
}
