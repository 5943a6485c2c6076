package proxy

import (
	"crypto/sha256"
	"encoding/hex"
)

// KeyForms are an API key's public forms, as `ratelimit-proxy key` prints
// them: Caller is the caller the proxy makes of the key ("key:" and the
// first 16 hex digits of its SHA-256, what logs, denied_key and the admin
// API write after "caller="), APIKey the value of the api_key key part
// (those 16 hex digits alone: what a rule keyed by api_key writes after
// "api_key="), SHA256 its whole hex digest, which is what an
// API_KEYS_FILE lists. The key is read as a header carries it: white
// space around it and a "Bearer " prefix are not part of it.
type KeyForms struct {
	Caller string `json:"caller"`
	APIKey string `json:"api_key"`
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
	caller := hashKey(tok)
	return KeyForms{Caller: caller, APIKey: caller[len("key:"):], SHA256: hex.EncodeToString(sum[:])}, true
}
