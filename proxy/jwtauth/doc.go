// Package jwtauth verifies JSON Web Tokens and reads their claims (SPEC §7.5).
//
// A [Verifier] answers one question: did a party we trust sign this token,
// and is it valid now? Its trust rules, all strict:
//
//   - Only two sources of keys exist: the HMAC secret (JWT_HS256_SECRET), which
//     verifies HS256, HS384 and HS512 and nothing else, and the key set
//     (JWT_JWKS, a file or a URL), whose public keys verify RS256/384/512,
//     PS256/384/512, ES256/384/512 and EdDSA (Ed25519) and nothing else. An
//     HS* token is never checked against a key-set key (no RSA public key used
//     as an HMAC secret), an asymmetric token never against the secret, and
//     "alg": "none" never verifies.
//   - A key is used only for the algorithm it fits: RSA for RS*/PS*, EC on the
//     matching curve for ES256 (P-256), ES384 (P-384) and ES512 (P-521), OKP
//     Ed25519 for EdDSA. A JWK with an "alg" member verifies that algorithm
//     only; a JWK whose "use" is not "sig", a symmetric ("oct") JWK, a JWK
//     holding private material, and an RSA key under 2048 bits are skipped.
//   - Keys come from configuration only: the token's own "jwk", "jku", "x5u"
//     and "x5c" headers are ignored, and a token whose header has "crit" is
//     refused (we understand no extension).
//   - A token naming a "kid" is checked against that key only; one without a
//     "kid" against at most eight keys of the set that fit its algorithm.
//   - "exp" and "nbf" are checked when present, with 30 s leeway; "iss" and
//     "aud" when an issuer or audience is configured. A future "iat" is no
//     reason to refuse.
//   - A token longer than [MaxTokenBytes] is refused unparsed. A shorter one
//     is read as leniently as PyJWT, jose and golang-jwt read it (padding,
//     either base64 alphabet, stray characters, spare bits: compact.go), so
//     that every spelling a library accepts is the same token; the
//     signature is checked over the header and payload as sent.
//
// The key set (a URL fetched, a file read) is loaded at start, then every
// Options.Refresh; a token naming an unknown "kid" loads it again at once, at
// most once a minute for that reason (start-up and periodic fetches do not
// count), concurrent such tokens sharing one fetch, and is then checked
// against the new set. A failed fetch keeps the last good set. Verify never
// panics, and its errors are short fixed reasons that never contain the token.
package jwtauth
