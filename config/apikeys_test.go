package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

func TestLoadAPIKeys(t *testing.T) {
	sum := sha256.Sum256([]byte("sk-1"))
	h := hex.EncodeToString(sum[:])
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "keys.toml")
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	keys, err := config.LoadAPIKeys(write("[[key]]\nsha256 = \"" + strings.ToUpper(h) + "\"\ncaller = \"alice@example.com\"\ntier = \"pro\"\nexpires = 2027-01-31T00:00:00Z\n"))
	if err != nil {
		t.Fatal(err)
	}
	k, ok := keys[sum]
	if !ok || k.Caller != "alice@example.com" || k.Tier != "pro" || !k.Expires.Equal(time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("%+v %v", k, ok)
	}
	for _, tc := range []struct{ body, want string }{
		{"[[key]]\nsha256 = \"" + h + "\"\ncaller = \"a\"\nsecret = \"sk-1\"\n", "key #1: secret: unknown field"},
		{"[[key]]\nsha256 = \"" + h + "\"\ncaller = \"a\"\n[[key]]\nsha256 = \"" + h + "\"\ncaller = \"b\"\n", `key #2: sha256: the same key as caller "a"'s`},
		{"[[key]]\nsha256 = \"" + h + "\"\ncaller = \"a\"\nexpires = \"tomorrow\"\n", `key #1: expires "tomorrow": not an RFC 3339 time`},
		{"[[key]]\nsha256 = \"" + h[:10] + "\"\ncaller = \"a\"\n", "key #1: sha256: must be the 64 hex digits"},
		{"[[key]]\nsha256 = \"" + h + "\"\n", `key #1: caller "": must be 1 to 64`},
		{"[[key]]\nsha256 = \"" + h + "\"\ncaller = \"a\"\ntier = \"\"\n", "key #1: tier: must be a plan's name"},
		{"[key]\nsha256 = \"" + h + "\"\n", "write [[key]] tables"},
		{"[keys]\n", "keys: unknown table"},
	} {
		if _, err := config.LoadAPIKeys(write(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.body, err, tc.want)
		}
	}
}
