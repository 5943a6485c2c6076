package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/toml/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// APIKey is one [[key]] table of API_KEYS_FILE (SPEC §7.7): the SHA-256
// of a key the proxy knows (never the key), the caller it stands for, its
// plan and when it stops being one.
type APIKey struct {
	SHA256  [32]byte
	Caller  string    // the caller's name: counted as user:<Caller>
	Tier    string    // the caller's plan; "" leaves it to tier_from
	Expires time.Time // zero: never
}

// APIKeys are the keys of an API_KEYS_FILE, by the SHA-256 of the key.
type APIKeys map[[32]byte]APIKey

var callerName = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,64}$`)

// keyFields are the fields a [[key]] table may have.
var keyFields = []string{"sha256", "caller", "tier", "expires"}

// LoadAPIKeys reads an API_KEYS_FILE: [[key]] tables only, every problem
// reported with the table it is in (never a key: the file holds none).
func LoadAPIKeys(path string) (APIKeys, error) {
	k := koanf.New("\x00")
	if err := k.Load(file.Provider(path), toml.Parser()); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var errs []error
	for top := range k.Raw() {
		if top != "key" {
			errs = append(errs, fmt.Errorf("%s: %s: unknown table (the file holds [[key]] tables)", path, top))
		}
	}
	raw, _ := k.Raw()["key"].([]any)
	if v, ok := k.Raw()["key"]; ok && raw == nil {
		errs = append(errs, fmt.Errorf("%s: key = %v: write [[key]] tables", path, v))
	}
	keys := APIKeys{}
	for i, t := range raw {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: key #%d: %s", path, i+1, fmt.Sprintf(format, args...)))
		}
		m, ok := t.(map[string]any)
		if !ok {
			bad("not a table")
			continue
		}
		var unknown []string
		for f := range m {
			if !contains(keyFields, f) {
				unknown = append(unknown, f)
			}
		}
		sort.Strings(unknown)
		for _, f := range unknown {
			bad("%s: unknown field (a key has sha256, caller, tier, expires)", f)
		}
		var key APIKey
		sum, _ := m["sha256"].(string)
		if b, err := hex.DecodeString(strings.TrimSpace(sum)); err != nil || len(b) != 32 {
			bad("sha256: must be the 64 hex digits of the key's SHA-256 (ratelimit-proxy key prints them)")
		} else {
			copy(key.SHA256[:], b)
		}
		if key.Caller, _ = m["caller"].(string); !callerName.MatchString(key.Caller) {
			bad("caller %q: must be 1 to 64 of A-Z a-z 0-9 _ . @ -", key.Caller)
		}
		if v, ok := m["tier"]; ok {
			if key.Tier, ok = v.(string); !ok || key.Tier == "" {
				bad("tier: must be a plan's name")
			}
		}
		switch v := m["expires"].(type) {
		case nil:
		case time.Time:
			key.Expires = v
		case string:
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				bad("expires %q: not an RFC 3339 time (2026-12-31T23:59:59Z)", v)
			}
			key.Expires = t
		default:
			bad("expires: not an RFC 3339 time (2026-12-31T23:59:59Z)")
		}
		if prev, dup := keys[key.SHA256]; dup && key.SHA256 != ([32]byte{}) {
			bad("sha256: the same key as caller %q's", prev.Caller)
			continue
		}
		keys[key.SHA256] = key
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return keys, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
