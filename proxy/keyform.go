package proxy

import (
	"crypto/sha256"
	"encoding/hex"
)

// KeyForms are an API key's public forms, as `ratelimit-proxy key` prints
// them: Caller is the caller the proxy makes of the key ("key:" and the
// first 16 hex digits of its SHA-256, what logs, denied_key and the admin
// API write after "caller="), SHA256 its whole hex digest, which is what
// an API_KEYS_FILE lists. The key is read as a header carries it: white
// space around it and a "Bearer " prefix are not part of it.
type KeyForms struct {
	Caller string `json:"caller"`
	SHA256 string `json:"sha256"`
}

// KeyFormsOf returns the public forms of key; ok is false when nothing
// is left of it once trimmed.
func KeyFormsOf(key string) (f KeyForms, ok bool) {
	tok, _ := cutBearer(key)
	if tok == "" {
		return KeyForms{}, false
	}
	sum := sha256.Sum256([]byte(tok))
	return KeyForms{Caller: hashKey(tok), SHA256: hex.EncodeToString(sum[:])}, true
}
