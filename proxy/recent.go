package proxy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/maphash"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// The strings a request is counted by (its caller's value, its rules'
// keys, its 429's Retry-After-Ms) are functions of a few request inputs,
// and the same inputs come back: a caller asking again, and above all a
// refused caller asking again, the attacker's hot path. recent keeps the
// string built last for each input in a direct-mapped table, so asking
// again costs a hash and a compare instead of an allocation. A slot holds
// the newest input hashed to it; an entry is immutable once published, so
// a lookup takes no lock. A miss builds the string as before and costs one
// allocation more (the entry); a table is at most recentSlots entries.
// These are memos of pure functions: a stale or evicted entry can only
// cost a rebuild, never a wrong answer.

const recentSlots = 4096 // a power of two

type recent[E any] struct {
	slots [recentSlots]atomic.Pointer[E]
}

// ways are the two slots an input may sit in: two inputs that hash to the
// same slot both stay.
func (c *recent[E]) ways(h uint64) [2]*atomic.Pointer[E] {
	i := h & (recentSlots - 1)
	return [2]*atomic.Pointer[E]{&c.slots[i], &c.slots[i^1]}
}

// put keeps e in the first empty way, else in the one h's high bit names.
func (c *recent[E]) put(h uint64, e *E) {
	w := c.ways(h)
	switch {
	case w[0].Load() == nil:
		w[0].Store(e)
	case w[1].Load() == nil:
		w[1].Store(e)
	default:
		w[h>>63].Store(e)
	}
}

var recentSeed = maphash.MakeSeed()

// ipEntry is a client address's caller value under one IPv6 prefix length.
type ipEntry struct {
	ip     netip.Addr
	prefix int
	value  string
}

var recentIPs recent[ipEntry]

// ipValue is "ip:" and ip, or its /prefix when ip is IPv6.
func ipValue(ip netip.Addr, prefix int) string {
	a := ip.As16()
	var h maphash.Hash
	h.SetSeed(recentSeed)
	h.Write(a[:])
	h.WriteByte(byte(prefix))
	sum := h.Sum64()
	for _, w := range recentIPs.ways(sum) {
		if e := w.Load(); e != nil && e.ip == ip && e.prefix == prefix {
			return e.value
		}
	}
	var buf [64]byte
	b := append(buf[:0], "ip:"...)
	if ip.Is6() {
		p, _ := ip.Prefix(prefix)
		b = p.AppendTo(b)
	} else {
		b = ip.AppendTo(b)
	}
	e := &ipEntry{ip: ip, prefix: prefix, value: string(b)}
	recentIPs.put(sum, e)
	return e.value
}

// keyEntry is an API key's caller value, found by the first 8 bytes of
// its SHA-256 (all the value is made of): the raw key is never kept.
type keyEntry struct {
	sum   [8]byte
	value string
}

var recentAPIKeys recent[keyEntry]

// hashKey is the public form of an API key: "key:" and the first 16 hex
// digits of its SHA-256 (64 bits: collisions between real keys are
// negligible).
func hashKey(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	// The sum is the hash: an attacker who grinds keys into one slot
	// costs only rebuilds (a seed would not stop that: slots are a few
	// bits of it).
	h := binary.LittleEndian.Uint64(sum[:8])
	for _, w := range recentAPIKeys.ways(h) {
		if e := w.Load(); e != nil && [8]byte(sum[:8]) == e.sum {
			return e.value
		}
	}
	var b [4 + 16]byte
	copy(b[:], "key:")
	hex.Encode(b[4:], sum[:8])
	e := &keyEntry{sum: [8]byte(sum[:8]), value: string(b[:])}
	recentAPIKeys.put(h, e)
	return e.value
}

// maxKeyParts is the most parts a rule's key may have that recentKeys
// keeps; longer keys are built every time.
const maxKeyParts = 6

// ruleKeyEntry is a rule key and the parts it was built from.
type ruleKeyEntry struct {
	n     int
	parts [maxKeyParts]limits.Part
	key   limits.Key
}

var recentKeys recent[ruleKeyEntry]

// ruleKey is limits.NewKey(parts...), kept for the parts seen last.
func ruleKey(parts []limits.Part) limits.Key {
	if len(parts) > maxKeyParts {
		return limits.NewKey(parts...)
	}
	var h maphash.Hash
	h.SetSeed(recentSeed)
	for _, p := range parts {
		h.WriteString(p.Name)
		h.WriteByte(0)
		h.WriteString(p.Value)
		h.WriteByte(0)
	}
	sum := h.Sum64()
	for _, w := range recentKeys.ways(sum) {
		if e := w.Load(); e != nil && e.n == len(parts) && samePartsAs(e, parts) {
			return e.key
		}
	}
	e := &ruleKeyEntry{n: len(parts), key: limits.NewKey(parts...)}
	for i, p := range parts {
		// A value may be a piece of a larger string (a request body's
		// field): the copy keeps the table from holding the rest alive.
		e.parts[i] = limits.Part{Name: p.Name, Value: strings.Clone(p.Value)}
	}
	recentKeys.put(sum, e)
	return e.key
}

func samePartsAs(e *ruleKeyEntry, parts []limits.Part) bool {
	for i, p := range parts {
		if e.parts[i] != p {
			return false
		}
	}
	return true
}

// msEntry is a Retry-After-Ms header value.
type msEntry struct {
	ms    int64
	value [1]string
}

var recentMs recent[msEntry]

// msValue is the header value of ms milliseconds. Waits of the same rule
// end at nearly the same moments, so few values are live at a time.
func msValue(ms int64) []string {
	if ms >= 0 && ms < int64(len(smallInts)) {
		return smallInts[ms]
	}
	h := uint64(ms) * 0x9e3779b97f4a7c15 // spread, so that its high bit varies
	for _, w := range recentMs.ways(h) {
		if e := w.Load(); e != nil && e.ms == ms {
			return e.value[:]
		}
	}
	e := &msEntry{ms: ms, value: [1]string{strconv.FormatInt(ms, 10)}}
	recentMs.put(h, e)
	return e.value[:]
}
