package jwtauth_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

func benchVerifier(b *testing.B) (*jwtauth.Verifier, jwt.MapClaims) {
	k := keys()
	c := newClock()
	path := writeFile(b, keySetJSON(b, standardSet(k)...))
	v := newVerifier(b, jwtauth.Options{Secret: k.secret, JWKS: path, Now: c.Now, Refresh: time.Hour})
	claims := jwt.MapClaims{
		"sub": "user-1234567890", "iss": "https://issuer.example", "aud": "ratelimit-proxy",
		"exp": c.Now().Add(time.Hour).Unix(), "iat": c.Now().Unix(), "plan": "pro",
	}
	return v, claims
}

func benchVerify(b *testing.B, v *jwtauth.Verifier, tok string, wantOK bool) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, err := v.Verify(ctx, tok)
		if (err == nil) != wantOK {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyHS256(b *testing.B) {
	v, claims := benchVerifier(b)
	benchVerify(b, v, sign(b, jwt.SigningMethodHS256, keys().secret, "", claims), true)
}

func BenchmarkVerifyES256(b *testing.B) {
	v, claims := benchVerifier(b)
	benchVerify(b, v, sign(b, jwt.SigningMethodES256, keys().p256, "p256", claims), true)
}

func BenchmarkVerifyRS256(b *testing.B) {
	v, claims := benchVerifier(b)
	benchVerify(b, v, sign(b, jwt.SigningMethodRS256, keys().rsa, "rsa", claims), true)
}

func BenchmarkVerifyEdDSA(b *testing.B) {
	v, claims := benchVerifier(b)
	benchVerify(b, v, sign(b, jwt.SigningMethodEdDSA, keys().ed, "ed", claims), true)
}

// What an attacker makes us do: refusals.
func BenchmarkVerifyRefused(b *testing.B) {
	v, claims := benchVerifier(b)
	k := keys()
	big := jwt.MapClaims{"sub": strings.Repeat("x", 11<<10)}
	for _, tc := range []struct{ name, tok string }{
		{"garbage", "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"},
		{"too-long", strings.Repeat("a", jwtauth.MaxTokenBytes+1)},
		{"HS256-bad-signature", sign(b, jwt.SigningMethodHS256, k.secret2, "", claims)},
		{"HS256-bad-signature-15KiB", sign(b, jwt.SigningMethodHS256, k.secret2, "", big)},
		{"RS256-bad-signature", sign(b, jwt.SigningMethodRS256, k.rsaOther, "rsa", claims)},
		{"ES256-no-kid-bad-signature", sign(b, jwt.SigningMethodES256, k.p256Other, "", claims)},
		{"unknown-kid-throttled", sign(b, jwt.SigningMethodRS256, k.rsaOther, "nobody", claims)},
	} {
		if tc.name != "too-long" && len(tc.tok) > jwtauth.MaxTokenBytes {
			b.Fatalf("%s: the token is too long to be parsed", tc.name)
		}
		b.Run(tc.name, func(b *testing.B) { benchVerify(b, v, tc.tok, false) })
	}
}
