package tokens

import (
	"bytes"
	"hash/maphash"
	"math/bits"
)

// rankTable maps a token's bytes to its merge rank. It is an
// open-addressed hash table over one byte arena, and holds no pointers:
// the garbage collector never scans it. A map[string]int of 200,000
// tokens holds as many string pointers, and every GC cycle of the proxy
// marked them all (a quarter of the CPU of a small request's count went
// to that). Lookups are as fast as the map's.
type rankTable struct {
	arena []byte // every token's bytes, one after the other
	slots []rankSlot
	mask  uint64
	seed  maphash.Seed
}

// rankSlot is one token: its bytes are arena[off:off+n]; n == 0 marks an
// empty slot (no token is empty). tag is the hash's top bits, compared
// before the bytes.
type rankSlot struct {
	off  uint32
	rank uint32
	n    uint16
	tag  uint16
}

func newRankTable(ranks map[string]int) *rankTable {
	size := 1 << bits.Len(uint(2*len(ranks))) // load factor at most 1/2
	t := &rankTable{slots: make([]rankSlot, size), mask: uint64(size - 1), seed: maphash.MakeSeed()}
	total := 0
	for tok := range ranks {
		total += len(tok)
	}
	t.arena = make([]byte, 0, total)
	for tok, r := range ranks {
		if tok == "" || len(tok) > 1<<16-1 {
			continue // no such token in tiktoken's files
		}
		h := maphash.String(t.seed, tok)
		i := h & t.mask
		for t.slots[i].n != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = rankSlot{off: uint32(len(t.arena)), rank: uint32(r), n: uint16(len(tok)), tag: uint16(h >> 48)}
		t.arena = append(t.arena, tok...)
	}
	return t
}

// get returns tok's rank.
func (t *rankTable) get(tok []byte) (int, bool) {
	h := maphash.Bytes(t.seed, tok)
	tag, n := uint16(h>>48), uint16(len(tok))
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.n == 0 {
			return 0, false
		}
		if s.tag == tag && s.n == n && bytes.Equal(t.arena[s.off:s.off+uint32(n)], tok) {
			return int(s.rank), true
		}
	}
}
