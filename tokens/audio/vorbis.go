package audio

import "math/bits"

// vorbisSetup reads a Vorbis setup header (Vorbis I specification, 4.2.4)
// as its bytes go by, for the one thing the meter needs from it: which
// modes use the long block. The modes come last, after codebooks, floors,
// residues and mappings whose lengths are known only by reading them, so
// all of it is read, field by field, as a decoder does (a reader that
// looks for the modes backwards from the end, as FFmpeg's parser does,
// can be fooled by bytes after the framing bit, which decoders ignore).
// When anything is off, the modes stay unknown and every block counts as
// long, the most a packet can last.
type vorbisSetup struct {
	acc      uint64 // bits not yet read, first in the low bits
	nacc     uint8
	ph       uint8
	after    uint8 // phase after a skip
	ok, bad  bool
	ch       uint8
	sparse   bool
	lookup   uint8
	nclass   int8 // floor 1: highest class + 1
	nparts   uint8
	subs     uint8 // floor 1: subclasses of the class being read
	nmaps    uint8
	submaps  uint8
	nmodes   uint8
	n, i     uint32 // items at the current level and the one being read
	j, k     uint32
	entries  uint32
	dims     uint32
	cur      uint32
	acc2     uint32 // residue: books of the cascades
	skip     uint64 // bits to skip
	modes    uint64
	classes  [31]uint8
	classDim [16]uint8
}

// Phases of vorbisSetup.
const (
	vsSkip = iota
	vsBooks
	vsBook
	vsBookSize
	vsBookOrdered
	vsSparse
	vsEntry
	vsOrdLen
	vsOrdNum
	vsLookup
	vsLookupBits
	vsTimes
	vsTime
	vsFloors
	vsFloor
	vsFloor0
	vsFloor1Parts
	vsFloor1Class
	vsFloor1Dim
	vsFloor1Mult
	vsResidues
	vsResidue
	vsResidueClass
	vsCascade
	vsMaps
	vsMap
	vsMapCoupling
	vsMapReserved
	vsModes
	vsMode
	vsFraming
	vsDone
)

// start begins a setup header of a stream of ch channels; the packet's
// first byte is next.
func (v *vorbisSetup) start(ch uint8) {
	*v = vorbisSetup{ch: ch}
	v.skipThen(7*8, vsBooks) // packet type and "vorbis"
}

func (v *vorbisSetup) skipThen(n uint64, next uint8) {
	v.skip, v.after, v.ph = n, next, vsSkip
}

// feed reads the next bytes of the packet.
func (v *vorbisSetup) feed(b []byte) {
	for v.ph != vsDone {
		if v.ph == vsSkip && v.nacc == 0 && v.skip >= 8 && len(b) > 0 {
			k := min(uint64(len(b)), v.skip/8)
			b = b[k:]
			v.skip -= k * 8
			continue
		}
		for v.nacc <= 56 && len(b) > 0 {
			v.acc |= uint64(b[0]) << v.nacc
			v.nacc += 8
			b = b[1:]
		}
		if !v.step() && len(b) == 0 {
			return
		}
	}
}

// has reports whether n bits are there to read.
func (v *vorbisSetup) has(n uint8) bool { return v.nacc >= n }

// get reads n ≤ 32 bits that are there.
func (v *vorbisSetup) get(n uint8) uint32 {
	x := uint32(v.acc & (1<<n - 1))
	v.acc >>= n
	v.nacc -= n
	return x
}

func (v *vorbisSetup) fail() bool {
	v.bad = true
	v.ph = vsDone
	return false
}

// ilog is the number of bits of x (Vorbis I, 9.2.1).
func ilog(x uint32) uint8 { return uint8(bits.Len32(x)) }

// lookup1Values is the largest r with r^dims ≤ entries (Vorbis I, 9.2.3).
func lookup1Values(entries, dims uint32) uint64 {
	if dims > 24 { // entries < 2^24 < 2^dims
		return 1
	}
	lo, hi := uint64(1), uint64(entries)
	for lo < hi { // the largest r in [lo, hi] whose power fits
		mid := lo + (hi-lo+1)/2
		p, ok := uint64(1), true
		for range dims {
			if p > uint64(entries)/mid {
				ok = false
				break
			}
			p *= mid
		}
		if ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// step reads one field or a run of them; it reports false when it needs
// more bits than there are.
func (v *vorbisSetup) step() bool {
	switch v.ph {
	case vsSkip:
		k := uint8(min(v.skip, uint64(v.nacc)))
		if k == 0 && v.skip > 0 {
			return false
		}
		v.acc >>= k
		v.nacc -= k
		v.skip -= uint64(k)
		if v.skip == 0 {
			v.ph = v.after
		}
	case vsBooks:
		if !v.has(8) {
			return false
		}
		v.n, v.i = v.get(8)+1, 0
		v.ph = vsBook
	case vsBook:
		if v.i == v.n {
			v.ph = vsTimes
			break
		}
		if !v.has(24) {
			return false
		}
		if v.get(24) != 0x564342 {
			return v.fail()
		}
		v.ph = vsBookSize
	case vsBookSize:
		if !v.has(41) {
			return false
		}
		v.dims, v.entries = v.get(16), v.get(24)
		if v.dims == 0 || v.entries == 0 {
			return v.fail()
		}
		v.cur = 0
		if v.get(1) == 1 {
			v.ph = vsOrdLen
		} else {
			v.ph = vsSparse
		}
	case vsSparse:
		if !v.has(1) {
			return false
		}
		v.sparse = v.get(1) == 1
		v.ph = vsEntry
	case vsEntry:
		for v.cur < v.entries {
			switch {
			case !v.sparse:
				if !v.has(5) {
					return false
				}
				v.get(5)
			case !v.has(1):
				return false
			case v.acc&1 == 0:
				v.get(1)
			case !v.has(6):
				return false
			default:
				v.get(6)
			}
			v.cur++
		}
		v.ph = vsLookup
	case vsOrdLen:
		if !v.has(5) {
			return false
		}
		v.get(5)
		v.ph = vsOrdNum
	case vsOrdNum:
		for v.cur < v.entries {
			n := ilog(v.entries - v.cur)
			if !v.has(n) {
				return false
			}
			num := v.get(n)
			if num > v.entries-v.cur {
				return v.fail()
			}
			v.cur += num
		}
		v.ph = vsLookup
	case vsLookup:
		if !v.has(4) {
			return false
		}
		switch v.lookup = uint8(v.get(4)); v.lookup {
		case 0:
			v.i++
			v.ph = vsBook
		case 1, 2:
			v.skipThen(64, vsLookupBits) // minimum and delta
		default:
			return v.fail()
		}
	case vsLookupBits:
		if !v.has(5) {
			return false
		}
		vbits := uint64(v.get(4)) + 1
		v.get(1) // sequence_p
		values := uint64(v.entries) * uint64(v.dims)
		if v.lookup == 1 {
			values = lookup1Values(v.entries, v.dims)
		}
		v.i++
		v.skipThen(values*vbits, vsBook)
	case vsTimes:
		if !v.has(6) {
			return false
		}
		v.n, v.i = v.get(6)+1, 0
		v.ph = vsTime
	case vsTime:
		for ; v.i < v.n; v.i++ {
			if !v.has(16) {
				return false
			}
			if v.get(16) != 0 {
				return v.fail()
			}
		}
		v.ph = vsFloors
	case vsFloors:
		if !v.has(6) {
			return false
		}
		v.n, v.i = v.get(6)+1, 0
		v.ph = vsFloor
	case vsFloor:
		if v.i == v.n {
			v.ph = vsResidues
			break
		}
		if !v.has(16) {
			return false
		}
		switch v.get(16) {
		case 0: // order, rate, bark map size, amplitude bits and offset
			v.skipThen(8+16+16+6+8, vsFloor0)
		case 1:
			v.ph = vsFloor1Parts
		default:
			return v.fail()
		}
	case vsFloor0:
		if !v.has(4) {
			return false
		}
		v.i++
		v.skipThen(uint64(v.get(4)+1)*8, vsFloor)
	case vsFloor1Parts:
		if !v.has(5) {
			return false
		}
		v.nparts, v.j, v.nclass = uint8(v.get(5)), 0, 0
		v.ph = vsFloor1Class
	case vsFloor1Class:
		for ; v.j < uint32(v.nparts); v.j++ {
			if !v.has(4) {
				return false
			}
			c := uint8(v.get(4))
			v.classes[v.j] = c
			v.nclass = max(v.nclass, int8(c)+1)
		}
		v.k = 0
		v.ph = vsFloor1Dim
	case vsFloor1Dim:
		if v.k == uint32(v.nclass) {
			v.ph = vsFloor1Mult
			break
		}
		if !v.has(5) {
			return false
		}
		subs := uint8(v.acc >> 3 & 3)
		if subs > 0 && !v.has(13) {
			return false
		}
		v.classDim[v.k] = uint8(v.get(3)) + 1
		v.get(2)
		if subs > 0 {
			v.get(8) // master book
		}
		v.k++
		v.skipThen(uint64(8)<<subs, vsFloor1Dim)
	case vsFloor1Mult:
		if !v.has(6) {
			return false
		}
		v.get(2)
		rangeBits := uint64(v.get(4))
		var n uint64
		for _, c := range v.classes[:v.nparts] {
			n += uint64(v.classDim[c])
		}
		v.i++
		v.skipThen(n*rangeBits, vsFloor)
	case vsResidues:
		if !v.has(6) {
			return false
		}
		v.n, v.i = v.get(6)+1, 0
		v.ph = vsResidue
	case vsResidue:
		if v.i == v.n {
			v.ph = vsMaps
			break
		}
		if !v.has(16) {
			return false
		}
		if v.get(16) > 2 {
			return v.fail()
		}
		v.skipThen(24*3, vsResidueClass) // begin, end, partition size
	case vsResidueClass:
		if !v.has(14) {
			return false
		}
		v.k, v.j, v.acc2 = v.get(6)+1, 0, 0
		v.get(8) // classbook
		v.ph = vsCascade
	case vsCascade:
		for ; v.j < v.k; v.j++ {
			if !v.has(4) {
				return false
			}
			flag := v.acc>>3&1 == 1
			if flag && !v.has(9) {
				return false
			}
			c := v.get(3)
			v.get(1)
			if flag {
				c |= v.get(5) << 3
			}
			v.acc2 += uint32(bits.OnesCount32(c))
		}
		v.i++
		v.skipThen(uint64(v.acc2)*8, vsResidue)
	case vsMaps:
		if !v.has(6) {
			return false
		}
		v.n, v.i = v.get(6)+1, 0
		v.nmaps = uint8(v.n)
		v.ph = vsMap
	case vsMap:
		if v.i == v.n {
			v.ph = vsModes
			break
		}
		if !v.has(17) {
			return false
		}
		flag := v.acc>>16&1 == 1
		if flag && !v.has(21) {
			return false
		}
		if v.get(16) != 0 {
			return v.fail()
		}
		v.get(1)
		v.submaps = 1
		if flag {
			v.submaps = uint8(v.get(4)) + 1
		}
		v.ph = vsMapCoupling
	case vsMapCoupling:
		if !v.has(1) {
			return false
		}
		if v.acc&1 == 0 {
			v.get(1)
			v.ph = vsMapReserved
			break
		}
		if !v.has(9) {
			return false
		}
		v.get(1)
		steps := uint64(v.get(8)) + 1
		v.skipThen(steps*2*uint64(ilog(uint32(v.ch)-1)), vsMapReserved)
	case vsMapReserved:
		if !v.has(2) {
			return false
		}
		if v.get(2) != 0 {
			return v.fail()
		}
		n := uint64(v.submaps) * 24
		if v.submaps > 1 {
			n += uint64(v.ch) * 4
		}
		v.i++
		v.skipThen(n, vsMap)
	case vsModes:
		if !v.has(6) {
			return false
		}
		v.n, v.i = v.get(6)+1, 0
		v.ph = vsMode
	case vsMode:
		for ; v.i < v.n; v.i++ {
			if !v.has(41) {
				return false
			}
			long := v.get(1)
			if v.get(16) != 0 || v.get(16) != 0 || v.get(8) >= uint32(v.nmaps) {
				return v.fail()
			}
			v.modes |= uint64(long) << v.i
		}
		v.ph = vsFraming
	case vsFraming:
		if !v.has(1) {
			return false
		}
		if v.get(1) != 1 {
			return v.fail()
		}
		v.ok = true
		v.nmodes = uint8(v.n)
		v.ph = vsDone
	}
	return true
}
