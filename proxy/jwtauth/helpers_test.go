package jwtauth_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// keys are generated once per test binary: RSA generation is slow.
type testKeys struct {
	rsa, rsaOther    *rsa.PrivateKey
	p256, p256Other  *ecdsa.PrivateKey
	p384, p384Other  *ecdsa.PrivateKey
	p521, p521Other  *ecdsa.PrivateKey
	ed, edOther      ed25519.PrivateKey
	secret, secret2  []byte
	rsaSmall         *rsa.PrivateKey // 1024 bits: skipped by the key set
	rsaB, rsaC, rsaD *rsa.PrivateKey // rotation
}

var keys = sync.OnceValue(func() *testKeys {
	k := &testKeys{
		secret:  []byte("0123456789abcdef0123456789abcdef-test-secret"),
		secret2: []byte("another secret that is long enough for HS512!!"),
	}
	rsaKey := func(bits int) *rsa.PrivateKey {
		key, err := rsa.GenerateKey(rand.Reader, bits)
		if err != nil {
			panic(err)
		}
		return key
	}
	ecKey := func(c elliptic.Curve) *ecdsa.PrivateKey {
		key, err := ecdsa.GenerateKey(c, rand.Reader)
		if err != nil {
			panic(err)
		}
		return key
	}
	edKey := func() ed25519.PrivateKey {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		return key
	}
	k.rsa, k.rsaOther, k.rsaB, k.rsaC, k.rsaD = rsaKey(2048), rsaKey(2048), rsaKey(2048), rsaKey(2048), rsaKey(2048)
	k.rsaSmall = rsaKey(1024)
	k.p256, k.p256Other = ecKey(elliptic.P256()), ecKey(elliptic.P256())
	k.p384, k.p384Other = ecKey(elliptic.P384()), ecKey(elliptic.P384())
	k.p521, k.p521Other = ecKey(elliptic.P521()), ecKey(elliptic.P521())
	k.ed, k.edOther = edKey(), edKey()
	return k
})

// jwk describes one key of a test key set.
type jwk struct {
	kid string
	pub crypto.PublicKey
	alg string // JWK "alg", optional
	use string // JWK "use"; "sig" when empty
}

// keySetJSON writes a JWK Set document.
func keySetJSON(t testing.TB, ks ...jwk) []byte {
	t.Helper()
	var set jose.JSONWebKeySet
	for _, k := range ks {
		use := k.use
		if use == "" {
			use = "sig"
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.pub, KeyID: k.kid, Algorithm: k.alg, Use: use})
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// standardSet is a key set with one key of every type, kids named for them.
func standardSet(k *testKeys) []jwk {
	return []jwk{
		{kid: "rsa", pub: k.rsa.Public()},
		{kid: "p256", pub: k.p256.Public()},
		{kid: "p384", pub: k.p384.Public()},
		{kid: "p521", pub: k.p521.Public()},
		{kid: "ed", pub: k.ed.Public()},
	}
}

// sign makes a token; kid "" leaves it out.
func sign(t testing.TB, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// clock is the injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// jwksServer serves a key set over TLS and counts its fetches.
type jwksServer struct {
	*httptest.Server
	fetches atomic.Int64
	mu      sync.Mutex
	body    []byte
	status  int
	gate    chan struct{} // when set, each fetch waits for it to close
}

func newJWKSServer(t testing.TB, body []byte) *jwksServer {
	s := &jwksServer{body: body, status: http.StatusOK}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		body, status, gate := s.body, s.status, s.gate
		s.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) serve(status int, body []byte) {
	s.mu.Lock()
	s.status, s.body = status, body
	s.mu.Unlock()
}

func (s *jwksServer) setGate(g chan struct{}) {
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
}

// fetchLog records Options.OnFetch calls.
type fetchLog struct {
	ok, failed atomic.Int64
	ch         chan bool
}

func newFetchLog() *fetchLog { return &fetchLog{ch: make(chan bool, 1024)} }

func (f *fetchLog) record(ok bool) {
	if ok {
		f.ok.Add(1)
	} else {
		f.failed.Add(1)
	}
	select {
	case f.ch <- ok:
	default:
	}
}

// waitFor waits for the next fetch with outcome ok.
func (f *fetchLog) waitFor(t testing.TB, ok bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-f.ch:
			if got == ok {
				return
			}
		case <-deadline:
			t.Fatalf("no fetch with ok=%v within 10s", ok)
		}
	}
}

// logBuffer is a concurrency-safe slog destination.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// writeFile writes a key-set file in a test directory.
func writeFile(t testing.TB, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newVerifier(t testing.TB, o jwtauth.Options) *jwtauth.Verifier {
	t.Helper()
	v, err := jwtauth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

// verify is Verify with a background context.
func verify(v *jwtauth.Verifier, token string) (jwtauth.Claims, error) {
	return v.Verify(context.Background(), token)
}

// reasons are every error text Verify may return.
var reasons = map[string]bool{
	"token too long": true, "malformed": true, "unsupported algorithm": true,
	"unsupported critical header": true, "unknown key": true,
	"key does not fit the algorithm": true, "bad signature": true,
	"expired": true, "not yet valid": true, "wrong issuer": true, "wrong audience": true,
}

// wantErr checks Verify refused the token for the reason want.
func wantErr(t testing.TB, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("verified; want %q", want)
	}
	if !reasons[err.Error()] {
		t.Fatalf("error %q is not one of the fixed reasons", err)
	}
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}
