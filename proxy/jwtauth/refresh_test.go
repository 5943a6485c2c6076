package jwtauth_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// The unknown-kid rule: a refetch at once, then none for a minute; start-up
// and periodic fetches do not count toward that minute.
func TestUnknownKIDRefetch(t *testing.T) {
	k := keys()
	c := newClock()
	claims := jwt.MapClaims{"sub": "x"}
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}))
	fl := newFetchLog()
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: time.Hour, OnFetch: fl.record})
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("start-up fetches = %d", n)
	}
	if _, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsa, "a", claims)); err != nil {
		t.Fatal(err)
	}

	// Right after the start-up fetch, at the same instant: b is new, fetched.
	srv.serve(http.StatusOK, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}, jwk{kid: "b", pub: k.rsaB.Public()}))
	if _, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsaB, "b", claims)); err != nil {
		t.Fatalf("kid b after its refetch: %v", err)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}

	// 59 s later, c is new: no refetch yet.
	srv.serve(http.StatusOK, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}, jwk{kid: "b", pub: k.rsaB.Public()}, jwk{kid: "c", pub: k.rsaC.Public()}))
	c.Add(59 * time.Second)
	tokC := sign(t, jwt.SigningMethodRS256, k.rsaC, "c", claims)
	_, err := verify(v, tokC)
	wantErr(t, err, "unknown key")
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d within the minute, want 2", n)
	}

	// A minute after the last unknown-kid refetch: fetched again.
	c.Add(time.Second)
	if _, err := verify(v, tokC); err != nil {
		t.Fatalf("kid c a minute later: %v", err)
	}
	if n := srv.fetches.Load(); n != 3 {
		t.Fatalf("fetches = %d, want 3", n)
	}

	// A known kid never fetches; neither does a token without kid.
	for range 5 {
		verify(v, sign(t, jwt.SigningMethodRS256, k.rsaC, "c", claims))
		verify(v, sign(t, jwt.SigningMethodRS256, k.rsaD, "", claims))
	}
	if n := srv.fetches.Load(); n != 3 {
		t.Fatalf("fetches = %d after known kids, want 3", n)
	}
	if fl.ok.Load() != 3 || fl.failed.Load() != 0 {
		t.Fatalf("OnFetch ok=%d failed=%d", fl.ok.Load(), fl.failed.Load())
	}
}

// Periodic fetches do not count toward the minute: a periodic fetch just
// before an unknown kid does not hold back its refetch.
func TestPeriodicFetchDoesNotCount(t *testing.T) {
	k := keys()
	c := newClock()
	claims := jwt.MapClaims{"sub": "x"}
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}))
	fl := newFetchLog()
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: 20 * time.Millisecond, OnFetch: fl.record})
	fl.waitFor(t, true) // start-up
	fl.waitFor(t, true) // a periodic fetch
	srv.serve(http.StatusOK, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}, jwk{kid: "b", pub: k.rsaB.Public()}))
	if _, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsaB, "b", claims)); err != nil {
		t.Fatalf("kid b: %v", err)
	}
}

// N tokens naming the same unknown kid at once share one fetch, and each is
// verified against the set it brought.
func TestUnknownKIDConcurrent(t *testing.T) {
	k := keys()
	c := newClock()
	claims := jwt.MapClaims{"sub": "x"}
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}))
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: time.Hour})
	gate := make(chan struct{})
	srv.setGate(gate)
	srv.serve(http.StatusOK, keySetJSON(t, jwk{kid: "b", pub: k.rsaB.Public()}))
	tok := sign(t, jwt.SigningMethodRS256, k.rsaB, "b", claims)

	const n = 32
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := v.Verify(context.Background(), tok)
			errs <- err
		})
	}
	time.Sleep(50 * time.Millisecond) // let them queue behind the fetch (the counts hold either way)
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a concurrent token: %v", err)
		}
	}
	if got := srv.fetches.Load(); got != 2 {
		t.Fatalf("fetches = %d, want 2 (start-up and one refetch)", got)
	}
}

// The caller's context bounds its wait; the fetch goes on for the others.
func TestUnknownKIDWaitBoundedByContext(t *testing.T) {
	k := keys()
	c := newClock()
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}))
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: time.Hour})
	gate := make(chan struct{})
	defer close(gate)
	srv.setGate(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := v.Verify(ctx, sign(t, jwt.SigningMethodRS256, k.rsaB, "b", jwt.MapClaims{}))
	wantErr(t, err, "unknown key")
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Verify waited %v past its context", d)
	}
}

// The periodic refresh picks up a rotated key; a failed fetch keeps the last
// good set.
func TestPeriodicRefresh(t *testing.T) {
	k := keys()
	c := newClock()
	claims := jwt.MapClaims{"sub": "x"}
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}))
	fl := newFetchLog()
	logs := &logBuffer{}
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: 20 * time.Millisecond, OnFetch: fl.record, Logger: logs.logger()})
	fl.waitFor(t, true)
	// Rotation to a key with the same kid: no unknown kid, only the
	// periodic fetch can bring it.
	// A fetch begun before the change may still land after it: wait
	// until one that began after it has (every fetch is logged, so one
	// success seen is no proof).
	srv.serve(http.StatusOK, keySetJSON(t, jwk{kid: "a", pub: k.rsaB.Public()}))
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsaB, "a", claims))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rotated key, 10 s after the change: %v", err)
		}
		fl.waitFor(t, true)
	}
	_, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsa, "a", claims))
	wantErr(t, err, "bad signature")

	for _, bad := range []struct {
		status int
		body   []byte
	}{
		{http.StatusInternalServerError, nil},
		{http.StatusOK, []byte("not json")},
		{http.StatusOK, []byte(`{"keys":[]}`)},
		{http.StatusOK, append(append([]byte(`{"keys":[],"pad":"`), bytes.Repeat([]byte("x"), jwtauth.MaxKeySetBytes)...), `"}`...)},
	} {
		srv.serve(bad.status, bad.body)
		fl.waitFor(t, false)
		if _, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsaB, "a", claims)); err != nil {
			t.Fatalf("after a failed fetch (status %d): %v", bad.status, err)
		}
	}
	if !strings.Contains(logs.String(), "keeping the last good one") {
		t.Fatalf("no warning logged:\n%s", logs)
	}
}

// A URL that fails at start is no error: it is logged and retried. Neither
// the log nor the error shows the URL's query (it may carry a credential).
func TestURLFailingAtStart(t *testing.T) {
	k := keys()
	c := newClock()
	srv := newJWKSServer(t, nil)
	srv.serve(http.StatusServiceUnavailable, nil)
	fl := newFetchLog()
	logs := &logBuffer{}
	v := newVerifier(t, jwtauth.Options{
		JWKS: srv.URL + "/keys?access_token=hunter2", Client: srv.Client(), Now: c.Now,
		Refresh: 20 * time.Millisecond, OnFetch: fl.record, Logger: logs.logger(),
	})
	fl.waitFor(t, false)
	tok := sign(t, jwt.SigningMethodES256, k.p256, "", jwt.MapClaims{})
	_, err := verify(v, tok)
	wantErr(t, err, "unknown key")
	srv.serve(http.StatusOK, keySetJSON(t, jwk{kid: "p", pub: k.p256.Public()}))
	fl.waitFor(t, true)
	if _, err := verify(v, tok); err != nil {
		t.Fatalf("after the retry: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || strings.Contains(out, "hunter2") {
		t.Fatalf("log:\n%s", out)
	}
}

// A URL the client cannot reach (TLS not trusted here) is no error either.
func TestURLUntrusted(t *testing.T) {
	srv := newJWKSServer(t, keySetJSON(t, standardSet(keys())...))
	logs := &logBuffer{}
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL + "/?k=secret-query", Refresh: time.Hour, Logger: logs.logger()})
	_, err := verify(v, sign(t, jwt.SigningMethodES256, keys().p256, "p256", jwt.MapClaims{}))
	wantErr(t, err, "unknown key")
	if out := logs.String(); !strings.Contains(out, "certificate") || strings.Contains(out, "secret-query") {
		t.Fatalf("log:\n%s", out)
	}
}

func TestJWKSFile(t *testing.T) {
	k := keys()
	c := newClock()
	claims := jwt.MapClaims{"sub": "x"}
	path := writeFile(t, keySetJSON(t, standardSet(k)...))
	fl := newFetchLog()
	v := newVerifier(t, jwtauth.Options{JWKS: path, Now: c.Now, Refresh: 20 * time.Millisecond, OnFetch: fl.record})
	if _, err := verify(v, sign(t, jwt.SigningMethodEdDSA, k.ed, "ed", claims)); err != nil {
		t.Fatal(err)
	}
	// Re-read on the refresh: a rotated key is picked up...
	writeAtomically(t, path, keySetJSON(t, jwk{kid: "ed", pub: k.edOther.Public()}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := verify(v, sign(t, jwt.SigningMethodEdDSA, k.edOther, "ed", claims)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the rotated file was not re-read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// ...and a file that turns bad keeps the last good set.
	writeAtomically(t, path, []byte("{"))
	fl.waitFor(t, false)
	if _, err := verify(v, sign(t, jwt.SigningMethodEdDSA, k.edOther, "ed", claims)); err != nil {
		t.Fatalf("after a bad re-read: %v", err)
	}
	os.Remove(path)
	fl.waitFor(t, false)
	if _, err := verify(v, sign(t, jwt.SigningMethodEdDSA, k.edOther, "ed", claims)); err != nil {
		t.Fatalf("after the file went away: %v", err)
	}
}

func writeAtomically(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func TestJWKSFileBad(t *testing.T) {
	k := keys()
	cases := map[string][]byte{
		"not JSON":      []byte("{not json"),
		"no keys":       []byte(`{"kty":"RSA"}`),
		"keys empty":    []byte(`{"keys":[]}`),
		"only HMAC":     []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"}]}`),
		"only enc keys": keySetJSON(t, jwk{kid: "e", pub: k.rsa.Public(), use: "enc"}),
		"too large":     append(append([]byte(`{"keys":[],"pad":"`), bytes.Repeat([]byte("x"), jwtauth.MaxKeySetBytes)...), `"}`...),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, data)
			v, err := jwtauth.New(jwtauth.Options{JWKS: path})
			if err == nil {
				v.Close()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
		})
	}
	missing := t.TempDir() + "/missing.json"
	_, err := jwtauth.New(jwtauth.Options{JWKS: missing})
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := jwtauth.New(jwtauth.Options{JWKS: "ftp://example.com/jwks"}); err == nil {
		t.Fatal("an ftp:// key set was accepted")
	}
}

// After Close, Verify works on the cached set and fetches nothing.
func TestClose(t *testing.T) {
	k := keys()
	c := newClock()
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}))
	v, err := jwtauth.New(jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
	v.Close()
	n := srv.fetches.Load()
	if _, err := verify(v, sign(t, jwt.SigningMethodRS256, k.rsa, "a", jwt.MapClaims{})); err != nil {
		t.Fatal(err)
	}
	_, err = verify(v, sign(t, jwt.SigningMethodRS256, k.rsaB, "b", jwt.MapClaims{}))
	wantErr(t, err, "unknown key")
	time.Sleep(50 * time.Millisecond)
	if got := srv.fetches.Load(); got != n {
		t.Fatalf("fetches after Close: %d", got-n)
	}
}

// Many goroutines verify while the key set is swapped under them.
func TestConcurrentVerifyDuringRefresh(t *testing.T) {
	k := keys()
	c := newClock()
	srv := newJWKSServer(t, keySetJSON(t, standardSet(k)...))
	v := newVerifier(t, jwtauth.Options{Secret: k.secret, JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: 5 * time.Millisecond})
	toks := []string{
		sign(t, jwt.SigningMethodHS256, k.secret, "", jwt.MapClaims{"sub": "h"}),
		sign(t, jwt.SigningMethodES256, k.p256, "p256", jwt.MapClaims{"sub": "e"}),
		sign(t, jwt.SigningMethodEdDSA, k.ed, "", jwt.MapClaims{"sub": "d"}),
	}
	bad := sign(t, jwt.SigningMethodES256, k.p256Other, "p256", jwt.MapClaims{"sub": "e"})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				tok := toks[(i+j)%len(toks)]
				if _, err := verify(v, tok); err != nil {
					t.Errorf("verify: %v", err)
					return
				}
				if _, err := verify(v, bad); err == nil {
					t.Error("a bad token verified")
					return
				}
			}
		})
	}
	wg.Wait()
}

// An empty kid is no kid: the keys that fit are tried, nothing is fetched.
func TestEmptyKID(t *testing.T) {
	k := keys()
	c := newClock()
	srv := newJWKSServer(t, keySetJSON(t, jwk{kid: "a", pub: k.rsa.Public()}, jwk{pub: k.p256.Public()}))
	v := newVerifier(t, jwtauth.Options{JWKS: srv.URL, Client: srv.Client(), Now: c.Now, Refresh: time.Hour})
	for _, tc := range []struct {
		m   jwt.SigningMethod
		key any
	}{{jwt.SigningMethodRS256, k.rsa}, {jwt.SigningMethodES256, k.p256}} {
		tok := jwt.NewWithClaims(tc.m, jwt.MapClaims{"sub": "x"})
		tok.Header["kid"] = ""
		s, err := tok.SignedString(tc.key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := verify(v, s); err != nil {
			t.Fatalf("%s with kid \"\": %v", tc.m.Alg(), err)
		}
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("fetches = %d, want 1", n)
	}
}
