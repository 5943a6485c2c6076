package jwtauth_test

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// FuzzVerify: no input panics, every refusal gives one of the fixed
// reasons without the token in it, and nothing verifies but spellings of
// the seeds signed with the right keys (their signed part unchanged).
func FuzzVerify(f *testing.F) {
	k := keys()
	c := newClock()
	path := writeFile(f, keySetJSON(f, standardSet(k)...))
	v := newVerifier(f, jwtauth.Options{Secret: k.secret, JWKS: path, Now: c.Now, Refresh: time.Hour, Issuer: "iss", Audience: "aud"})
	claims := jwt.MapClaims{"sub": "fuzz", "iss": "iss", "aud": []string{"aud"}, "exp": c.Now().Add(time.Hour).Unix(), "n": 1000000}
	valid := map[string]bool{}
	for _, s := range []struct {
		m   jwt.SigningMethod
		key any
		kid string
	}{
		{jwt.SigningMethodHS256, k.secret, ""},
		{jwt.SigningMethodHS512, k.secret, "x"},
		{jwt.SigningMethodRS256, k.rsa, "rsa"},
		{jwt.SigningMethodPS384, k.rsa, ""},
		{jwt.SigningMethodES256, k.p256, "p256"},
		{jwt.SigningMethodES384, k.p384, "p384"},
		{jwt.SigningMethodES512, k.p521, ""},
		{jwt.SigningMethodEdDSA, k.ed, "ed"},
	} {
		tok := sign(f, s.m, s.key, s.kid, claims)
		valid[jwtauth.SignedPart(tok)] = true
		f.Add(tok)
		f.Add(tok + "==")
	}
	der, _ := x509.MarshalPKIXPublicKey(k.rsa.Public())
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
	for _, s := range []string{
		sign(f, jwt.SigningMethodHS256, pemKey, "rsa", claims),
		sign(f, jwt.SigningMethodES256, k.p256Other, "p256", claims),
		sign(f, jwt.SigningMethodRS256, k.rsa, "unknown", claims),
		none,
		"sk-proj-abc",
		"a.b.",
		"eyJhbGciOiJIUzI1NiIsImNyaXQiOlsiYjY0Il19.e30.",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		got, err := verify(v, token)
		if err == nil {
			if !valid[jwtauth.SignedPart(token)] {
				t.Fatalf("an unsigned input verified: %q", token)
			}
			if !jwtauth.Shaped(token) {
				t.Fatalf("a verified token is not Shaped: %q", token)
			}
			if sub, _ := got.Subject("sub"); sub != "fuzz" {
				t.Fatalf("sub %q", sub)
			}
			return
		}
		if got != nil {
			t.Fatal("claims with an error")
		}
		if !reasons[err.Error()] {
			t.Fatalf("error %q is not a fixed reason", err)
		}
		if len(token) >= 8 && strings.Contains(err.Error(), token) {
			t.Fatalf("error %q holds the token", err)
		}
	})
}

// FuzzJWKS: any document parses or is refused without a panic, and within
// the bounds.
func FuzzJWKS(f *testing.F) {
	k := keys()
	f.Add(keySetJSON(f, standardSet(k)...))
	f.Add(keySetJSON(f, jwk{kid: "a", pub: k.rsa.Public(), alg: "RS256"}, jwk{kid: "e", pub: k.p256.Public(), use: "enc"}))
	f.Add(keySetJSON(f, jwk{kid: "small", pub: k.rsaSmall.Public()}))
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: k.p256, KeyID: "p"}, {Key: k.ed, KeyID: "d"}}})
	f.Add(priv)
	f.Add([]byte(`{"keys":[{"kty":"oct","k":"AAAA"},{"kty":"EC","crv":"P-256","x":"AA","y":"AA"},{"kty":"OKP","crv":"X25519","x":"AAAA"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB","alg":"HS256"}]}`))
	f.Add([]byte(`{"keys":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"keys":[{},{},{}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		kept, skipped, err := jwtauth.ParseKeySet(data)
		if kept > jwtauth.MaxKeys {
			t.Fatalf("%d keys kept", kept)
		}
		if err == nil && kept == 0 {
			t.Fatal("a key set without a key accepted")
		}
		if err != nil && kept != 0 {
			t.Fatal("keys kept with an error")
		}
		if len(data) > jwtauth.MaxKeySetBytes && err == nil {
			t.Fatal("an oversized key set accepted")
		}
		_ = skipped
	})
}

// The bounds on a key set: at most MaxKeys kept, oversized refused.
func TestKeySetBounds(t *testing.T) {
	k := keys()
	ks := make([]jwk, 0, 300)
	for i := range 300 {
		ks = append(ks, jwk{kid: string(rune('a'+i%26)) + string(rune('0'+i/26)), pub: k.p256.Public()})
	}
	kept, skipped, err := jwtauth.ParseKeySet(keySetJSON(t, ks...))
	if err != nil || kept != jwtauth.MaxKeys || skipped != 300-jwtauth.MaxKeys {
		t.Fatalf("kept %d, skipped %d, err %v", kept, skipped, err)
	}
	doc := keySetJSON(t, standardSet(k)...)
	padded := append(bytes.TrimSuffix(doc, []byte("}")), []byte(`,"pad":"`+strings.Repeat("x", jwtauth.MaxKeySetBytes)+`"}`)...)
	if _, _, err := jwtauth.ParseKeySet(padded); err == nil {
		t.Fatal("an oversized key set accepted")
	}
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: k.p256, KeyID: "p"}, {Key: k.rsa, KeyID: "r"}, {Key: k.ed, KeyID: "d"}}})
	if kept, skipped, err := jwtauth.ParseKeySet(priv); err == nil || kept != 0 || skipped != 3 {
		t.Fatalf("private keys: kept %d, skipped %d, err %v", kept, skipped, err)
	}
}

// FuzzDecodeSegment: whenever a decoder golang-jwt or jose may use accepts
// a segment (raw or padded, URL or standard alphabet, with \r\n), both of
// our readings give its bytes; so a spelling any of them accepts is read
// here as they read it.
func FuzzDecodeSegment(f *testing.F) {
	for _, s := range []string{"", "YWJjZA", "YWJjZA==", "YWJjZB", "+/+/", "-_-_", "YW\r\nJjZA", "YW=JjZA", "a", "YWJjZA=x"} {
		f.Add(s)
	}
	encodings := []*base64.Encoding{base64.RawURLEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.StdEncoding}
	f.Fuzz(func(t *testing.T, seg string) {
		py, node := jwtauth.DecodeSegment(seg)
		for _, enc := range encodings {
			want, err := enc.DecodeString(seg)
			if err != nil {
				continue
			}
			if !bytes.Equal(py, want) || !bytes.Equal(node, want) {
				t.Fatalf("%q: %x (PyJWT) %x (Node), want %x", seg, py, node, want)
			}
		}
	})
}
