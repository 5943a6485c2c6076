package jwtauth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"

	// go-jose rather than MicahParks/jwkset: it only parses JWKs (no HTTP
	// client, cache or storage of its own to work around, since the refetch
	// rule of SPEC §7.5 is ours), it has no dependencies, and it checks what a
	// parser should: EC points on their declared curve with full-length
	// coordinates, RSA exponents and a modulus of at most 4096 bits, Ed25519
	// key lengths, x5c leaf keys matching the JWK.
	jose "github.com/go-jose/go-jose/v4"
)

// Bounds on what an attacker, or a broken key-set server, can make us hold.
const (
	MaxTokenBytes  = 16 << 10 // a longer token never verifies and is not parsed
	MaxKeySetBytes = 1 << 20  // a larger key-set document is refused
	MaxKeys        = 256      // keys kept from one key set; the rest are dropped
	maxTried       = 8        // keys tried for a token without kid
	minRSABits     = 2048     // RFC 7518 §3.3
)

// key is one usable public key of the set.
type key struct {
	kid string
	alg string // the JWK's "alg"; "" lets the key type decide
	pub any    // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// keySet is an immutable key set; Verifier swaps it whole.
type keySet struct {
	seq   uint64 // which fetch built it: an older fetch never replaces it
	keys  []key
	byKID map[string][]int // indexes into keys, by non-empty kid
}

// fits reports whether k may verify a token signed with alg.
func (k *key) fits(alg string) bool {
	if k.alg != "" && k.alg != alg {
		return false
	}
	switch p := k.pub.(type) {
	case *rsa.PublicKey:
		switch alg {
		case "RS256", "RS384", "RS512", "PS256", "PS384", "PS512":
			return true
		}
	case *ecdsa.PublicKey:
		switch alg {
		case "ES256":
			return p.Curve.Params().Name == "P-256"
		case "ES384":
			return p.Curve.Params().Name == "P-384"
		case "ES512":
			return p.Curve.Params().Name == "P-521"
		}
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// forKID returns up to maxTried keys named kid that fit alg, and whether any
// key is named kid at all.
func (s *keySet) forKID(kid, alg string) (fit []any, known bool) {
	if s == nil {
		return nil, false
	}
	idx, known := s.byKID[kid]
	for _, i := range idx {
		if s.keys[i].fits(alg) {
			fit = append(fit, s.keys[i].pub)
			if len(fit) == maxTried {
				break
			}
		}
	}
	return fit, known
}

// forAlg returns up to maxTried keys of the set that fit alg.
func (s *keySet) forAlg(alg string) []any {
	if s == nil {
		return nil
	}
	var fit []any
	for i := range s.keys {
		if s.keys[i].fits(alg) {
			fit = append(fit, s.keys[i].pub)
			if len(fit) == maxTried {
				break
			}
		}
	}
	return fit
}

// skips tells which keys of a document were not kept, for the log: how many,
// and the first few reasons (never key material).
type skips struct {
	n     int
	first []string
}

func (s *skips) add(format string, args ...any) {
	s.n++
	if len(s.first) < 4 {
		s.first = append(s.first, fmt.Sprintf(format, args...))
	}
}

// parseKeySet reads a JWK Set document (RFC 7517 §5). Keys that cannot be
// used are skipped, as §5 asks; a document that is not a key set, is larger
// than MaxKeySetBytes or holds no usable key is an error. At most MaxKeys
// keys are kept.
func parseKeySet(data []byte) (set *keySet, skipped skips, err error) {
	if len(data) > MaxKeySetBytes {
		return nil, skipped, fmt.Errorf("key set larger than %d bytes", MaxKeySetBytes)
	}
	var doc struct {
		Keys *[]json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, skipped, errors.New("not a JSON key set")
	}
	if doc.Keys == nil {
		return nil, skipped, errors.New(`not a key set: no "keys" array`)
	}
	set = &keySet{byKID: map[string][]int{}}
	for i, raw := range *doc.Keys {
		k, why := parseKey(raw)
		if why != "" {
			skipped.add("key %d: %s", i, why)
			continue
		}
		if len(set.keys) == MaxKeys {
			skipped.n += len(*doc.Keys) - i - 1
			skipped.add("keys from %d on: more than %d keys", i, MaxKeys)
			break
		}
		if k.kid != "" {
			set.byKID[k.kid] = append(set.byKID[k.kid], len(set.keys))
		}
		set.keys = append(set.keys, k)
	}
	if len(set.keys) == 0 {
		return nil, skipped, errors.New("no usable key in the key set")
	}
	return set, skipped, nil
}

// parseKey reads one JWK; why says why it cannot be used.
func parseKey(raw json.RawMessage) (k key, why string) {
	var jk jose.JSONWebKey
	if err := jk.UnmarshalJSON(raw); err != nil {
		if errors.Is(err, jose.ErrUnsupportedKeyType) {
			return k, "unsupported key type"
		}
		return k, "not a valid JWK"
	}
	if jk.Use != "" && jk.Use != "sig" {
		return k, fmt.Sprintf("use %.16q is not sig", jk.Use)
	}
	switch p := jk.Key.(type) {
	case *rsa.PublicKey:
		if p.N.BitLen() < minRSABits {
			return k, fmt.Sprintf("RSA key of %d bits (at least %d)", p.N.BitLen(), minRSABits)
		}
	case *ecdsa.PublicKey, ed25519.PublicKey:
	case []byte:
		return k, "symmetric key (HS* tokens verify with the secret only)"
	case *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey:
		return k, "holds private key material"
	default:
		return k, "unsupported key type"
	}
	k = key{kid: jk.KeyID, alg: jk.Algorithm, pub: jk.Key}
	if k.alg != "" && !k.fits(k.alg) {
		return key{}, fmt.Sprintf("alg %.16q is not a signature algorithm for this key", k.alg)
	}
	return k, ""
}
