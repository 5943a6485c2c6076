package jwtauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Options configures a Verifier (SPEC §7.5).
type Options struct {
	Secret   []byte           // JWT_HS256_SECRET: verifies HS256/HS384/HS512; nil or empty: HS* never verify
	JWKS     string           // JWT_JWKS: a file path, or an https:// (or loopback http://) URL; "": none
	Refresh  time.Duration    // JWT_JWKS_REFRESH; 10m when zero or less
	Issuer   string           // iss must equal it when set
	Audience string           // aud must contain it when set
	Now      func() time.Time // clock of exp, nbf and the unknown-kid minute; time.Now when nil
	Client   *http.Client     // fetches a JWKS URL; nil: a 10 s client on the system trust store
	Logger   *slog.Logger     // nil: discard
	OnFetch  func(ok bool)    // optional: told each key-set fetch's outcome (metrics); may be called from two goroutines at once
}

// DefaultRefresh is how often the key set is fetched when Options.Refresh is
// not set.
const DefaultRefresh = 10 * time.Minute

const (
	leeway         = 30 * time.Second // on exp and nbf
	fetchTimeout   = 10 * time.Second // one key-set fetch
	unknownKIDWait = time.Minute      // between two unknown-kid refetches
	retryUnloaded  = 30 * time.Second // refresh period while no key set was ever loaded
)

// Why a token does not verify. Each message is short and fixed, so an
// error's text is safe in a log line or a metric label; it never holds the
// token.
var (
	errTooLong     = errors.New("token too long")
	errMalformed   = errors.New("malformed")
	errAlgorithm   = errors.New("unsupported algorithm")
	errCrit        = errors.New("unsupported critical header")
	errUnknownKey  = errors.New("unknown key")
	errKeyMismatch = errors.New("key does not fit the algorithm")
	errSignature   = errors.New("bad signature")
	errExpired     = errors.New("expired")
	errNotYet      = errors.New("not yet valid")
	errIssuer      = errors.New("wrong issuer")
	errAudience    = errors.New("wrong audience")
)

// Verifier verifies tokens against the configured secret and key set. It is
// safe for concurrent use; Close stops its refresh.
type Verifier struct {
	secret   []byte
	src      *source // nil without JWKS
	keys     atomic.Pointer[keySet]
	seq      atomic.Uint64 // numbers fetches, so an older one never wins
	allowed  map[string]bool
	claims   *jwt.Validator
	issuer   bool // an issuer is required
	audience bool // an audience is required
	now      func() time.Time
	refresh  time.Duration
	log      *slog.Logger
	onFetch  func(bool)

	ctx    context.Context // ends at Close; fetches run under it
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu          sync.Mutex    // guards the fields below
	closed      bool          // Close was called: no new fetch starts
	inflight    chan struct{} // closed when the unknown-kid refetch under way ends
	lastUnknown time.Time     // when the last unknown-kid refetch started
	refetched   bool          // lastUnknown is set
}

// New builds a Verifier and, with a key set, loads it and starts its refresh
// loop (Close stops it). A JWKS file that cannot be read or parsed is an
// error naming the file; a JWKS URL is fetched before New returns (at most
// 10 s), and one that fails is logged and retried by the refresh loop, every
// 30 s until a set is loaded (or Refresh, if shorter).
func New(o Options) (*Verifier, error) {
	if len(o.Secret) == 0 && o.JWKS == "" {
		return nil, errors.New("jwtauth: neither a secret nor a key set to verify with")
	}
	v := &Verifier{
		now:     o.Now,
		refresh: o.Refresh,
		log:     o.Logger,
		onFetch: o.OnFetch,
		allowed: map[string]bool{},
	}
	if v.now == nil {
		v.now = time.Now
	}
	if v.refresh <= 0 {
		v.refresh = DefaultRefresh
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	var methods []string
	if len(o.Secret) > 0 {
		v.secret = append([]byte(nil), o.Secret...)
		methods = append(methods, "HS256", "HS384", "HS512")
		if len(v.secret) < 32 {
			v.log.Warn("jwt secret is shorter than 32 bytes: HS256 needs at least 32 (RFC 7518 §3.2)", "bytes", len(v.secret))
		}
	}
	if o.JWKS != "" {
		src, err := newSource(o.JWKS, o.Client)
		if err != nil {
			return nil, err
		}
		v.src = src
		methods = append(methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
	}
	for _, m := range methods {
		v.allowed[m] = true
	}
	opts := []jwt.ParserOption{jwt.WithLeeway(leeway), jwt.WithTimeFunc(v.now)}
	if o.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(o.Issuer))
		v.issuer = true
	}
	if o.Audience != "" {
		opts = append(opts, jwt.WithAudience(o.Audience))
		v.audience = true
	}
	v.claims = jwt.NewValidator(opts...)
	v.ctx, v.cancel = context.WithCancel(context.Background())

	if v.src != nil {
		if err := v.fetch(v.ctx, "start"); err != nil && v.src.file {
			v.cancel()
			return nil, err
		}
		v.wg.Add(1)
		go v.loop()
	}
	return v, nil
}

// Close stops the refresh loop and any fetch under way, and waits for them.
// Verify still works afterwards, on the last key set, without fetching.
func (v *Verifier) Close() {
	v.once.Do(func() {
		v.mu.Lock()
		v.closed = true
		v.mu.Unlock()
		v.cancel()
		v.wg.Wait()
	})
}

// Verify checks token and returns its claims. The error is nil only for a
// token that verifies; its text is a short reason that never holds the token.
// ctx bounds the wait for a key-set refetch caused by an unknown kid.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	if len(token) > MaxTokenBytes {
		return nil, errTooLong
	}
	if ctx == nil {
		ctx = context.Background()
	}
	c, ok := readCompact(token)
	if !ok {
		return nil, errMalformed
	}
	t := &jwt.Token{Raw: token}
	if err := decodeJSON(c.header, &t.Header, false); err != nil {
		return nil, errMalformed
	}
	claims := jwt.MapClaims{}
	if err := decodeJSON(c.payload, &claims, true); err != nil {
		return nil, errMalformed
	}
	alg, ok := t.Header["alg"].(string)
	if !ok {
		return nil, errMalformed // no alg, or not a string
	}
	if t.Method = jwt.GetSigningMethod(alg); t.Method == nil || !v.allowed[alg] {
		return nil, errAlgorithm
	}
	key, err := v.keyFor(ctx, t)
	if err != nil {
		return nil, err
	}
	if !verifies(t.Method, c, key) {
		return nil, errSignature
	}
	if err := v.validate(claims); err != nil {
		return nil, err
	}
	return Claims(claims), nil
}

// decodeJSON reads a header or payload as golang-jwt does: one JSON
// object, whatever follows it; numbers as json.Number when useNumber.
func decodeJSON(b []byte, into any, useNumber bool) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if useNumber {
		dec.UseNumber()
	}
	if err := dec.Decode(into); err != nil {
		return err
	}
	if m, ok := into.(*map[string]any); ok && *m == nil { // "null"
		return errMalformed
	}
	if m, ok := into.(*jwt.MapClaims); ok && *m == nil {
		return errMalformed
	}
	return nil
}

// verifies reports whether a reading of the signature verifies the signed
// part under key (one key or a set).
func verifies(m jwt.SigningMethod, c compact, key any) bool {
	keys := []any{key}
	if set, ok := key.(jwt.VerificationKeySet); ok {
		keys = keys[:0]
		for _, k := range set.Keys {
			keys = append(keys, k)
		}
	}
	for i, sig := range c.sigs {
		if i > 0 && bytes.Equal(sig, c.sigs[0]) {
			break
		}
		for _, k := range keys {
			if m.Verify(c.signed, sig, k) == nil {
				return true
			}
		}
	}
	return false
}

// keyFor finds the key(s) of the token's algorithm and kid.
func (v *Verifier) keyFor(ctx context.Context, t *jwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, errCrit
	}
	alg := t.Method.Alg()
	if !v.allowed[alg] {
		return nil, errAlgorithm // WithValidMethods already refuses it
	}
	if _, ok := t.Method.(*jwt.SigningMethodHMAC); ok {
		return v.secret, nil // a kid on an HS* token names nothing of ours
	}
	raw, hasKID := t.Header["kid"]
	if !hasKID || raw == "" {
		keys := v.keys.Load().forAlg(alg)
		if len(keys) == 0 {
			return nil, errUnknownKey
		}
		return verificationKeys(keys), nil
	}
	kid, ok := raw.(string)
	if !ok {
		return nil, errMalformed
	}
	keys, known := v.keys.Load().forKID(kid, alg)
	if !known {
		v.refetchUnknown(ctx)
		keys, known = v.keys.Load().forKID(kid, alg)
	}
	switch {
	case !known:
		return nil, errUnknownKey
	case len(keys) == 0:
		return nil, errKeyMismatch
	}
	return verificationKeys(keys), nil
}

func verificationKeys(keys []any) any {
	if len(keys) == 1 {
		return keys[0]
	}
	set := jwt.VerificationKeySet{Keys: make([]jwt.VerificationKey, len(keys))}
	for i, k := range keys {
		set.Keys[i] = k
	}
	return set
}

// validate checks the registered claims of a token whose signature verified.
// golang-jwt reads a time claim too large for a float64 as a time in the far
// past (a "nbf" of 1e999 would pass): such times are malformed here.
func (v *Verifier) validate(c jwt.MapClaims) error {
	for _, name := range []string{"exp", "nbf", "iat"} {
		x, ok := c[name]
		if !ok {
			continue
		}
		n, ok := x.(json.Number)
		if !ok {
			return errMalformed
		}
		f, err := n.Float64()
		if err != nil || math.Abs(f) > 1<<53 {
			return errMalformed
		}
	}
	// golang-jwt reports a missing iss or aud as a missing claim, not
	// as a wrong one.
	if _, ok := c["iss"]; !ok && v.issuer {
		return errIssuer
	}
	if _, ok := c["aud"]; !ok && v.audience {
		return errAudience
	}
	err := v.claims.Validate(c)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jwt.ErrTokenExpired):
		return errExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return errNotYet
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return errIssuer
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return errAudience
	}
	return errMalformed
}
