package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// TestRecentAnswersAsBuilt: the memo tables answer what building anew
// would, with far more inputs than slots (so slots collide and entries are
// replaced) and four goroutines asking at once.
func TestRecentAnswersAsBuilt(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 40_000 {
				n := rng.IntN(3 * recentSlots)
				v4 := netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
				if got, want := ipValue(v4, 64), "ip:"+v4.String(); got != want {
					t.Errorf("ipValue(%v) = %q, want %q", v4, got, want)
					return
				}
				v6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, byte(n >> 8), byte(n), 9: 1})
				prefix := 48 + 16*rng.IntN(2)
				p, _ := v6.Prefix(prefix)
				if got, want := ipValue(v6, prefix), "ip:"+p.String(); got != want {
					t.Errorf("ipValue(%v, %d) = %q, want %q", v6, prefix, got, want)
					return
				}
				parts := []limits.Part{{Name: "caller", Value: "ip:" + strconv.Itoa(n)}, {Name: "model", Value: strconv.Itoa(n % 7)}}[:1+rng.IntN(2)]
				if got, want := ruleKey(parts), limits.NewKey(parts...); got != want {
					t.Errorf("ruleKey(%v) = %v, want %v", parts, got, want)
					return
				}
				tok := "sk-" + strconv.Itoa(n)
				if got, want := hashKey(tok), builtHashKey(tok); got != want {
					t.Errorf("hashKey(%q) = %q, want %q", tok, got, want)
					return
				}
				ms := int64(rng.IntN(3 * recentSlots * 10))
				if got := msValue(ms); len(got) != 1 || got[0] != strconv.FormatInt(ms, 10) {
					t.Errorf("msValue(%d) = %q", ms, got)
					return
				}
			}
		})
	}
	wg.Wait()
}

// builtHashKey is hashKey without the table.
func builtHashKey(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return "key:" + hex.EncodeToString(sum[:8])
}

// TestRecentKeysHoldNoRequestBytes: a key part's value cut from a large
// request string is copied into the table, so that the table does not
// keep the request alive.
func TestRecentKeysHoldNoRequestBytes(t *testing.T) {
	body := strings.Repeat("x", 1<<20) + `{"user":"alice-recent-test"}`
	v := body[len(body)-18 : len(body)-2]
	ruleKey([]limits.Part{{Name: "body:user", Value: v}})
	for i := range recentKeys.slots {
		e := recentKeys.slots[i].Load()
		if e == nil || e.n != 1 || e.parts[0].Value != v {
			continue
		}
		if unsafe.StringData(e.parts[0].Value) == unsafe.StringData(v) {
			t.Fatal("the table holds a piece of the request's string")
		}
		return
	}
	t.Fatal("the key was not kept")
}
