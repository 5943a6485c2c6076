package audio

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// ISO base media files (MP4, M4A, MOV, 3GP) are boxes: a 32-bit size (1:
// a 64-bit size follows the type; 0: to the end of the file or of the
// box around), a four-character type, the body. The meter walks them as
// they go by, reads the few it needs and passes over the rest by their
// size, mdat (the media) included, wherever moov is.
//
// A file lasts the most of what it declares: the movie header (mvhd, and
// mehd for fragmented files) and, for each track, its media header
// (mdhd), its time-to-sample table (stts) and the sample durations of its
// fragments (trun), each in its own timescale. For AAC, whose every
// sample decodes to 1024 samples (960 in some files) whatever the tables
// say, the samples of the track (stsz, trun) at the sample rate of its
// AudioSpecificConfig count too. A file that declares no duration costs
// its size at 16 kbit/s, and so do the bytes of top-level boxes of no
// known type, when that is more.
const (
	mp4Depth   = 8   // boxes open at once
	mp4Tracks  = 8   // tracks followed (a further one is added up on its own)
	mp4LeafMax = 256 // bytes of a box read at once
)

var (
	boxMoov = fourcc("moov")
	boxTrak = fourcc("trak")
	boxMdia = fourcc("mdia")
	boxMinf = fourcc("minf")
	boxStbl = fourcc("stbl")
	boxStsd = fourcc("stsd")
	boxMp4a = fourcc("mp4a")
	boxWave = fourcc("wave")
	boxMvex = fourcc("mvex")
	boxMoof = fourcc("moof")
	boxTraf = fourcc("traf")
)

func fourcc(s string) uint32 { return binary.BigEndian.Uint32([]byte(s)) }

type mp4Box struct {
	end int64
	typ uint32
}

type mp4Track struct {
	id    uint32
	trex  uint32 // default sample duration of its fragments (trex)
	scale int64  // mdhd timescale
	durNs int64  // mdhd duration
	stts  int64  // time-to-sample total, in its timescale
	frag  int64  // sample durations of its fragments, in its timescale
	count int64  // samples (stsz, trun)
	frame int64  // AAC samples a frame (0: not AAC)
	rate  int64  // AAC sample rate
}

// ns is how long a track lasts.
func (t *mp4Track) ns() int64 {
	d := t.durNs
	if t.scale > 0 {
		d = max(d, mulDivCeil(addSat(t.stts, t.frag), 1e9, t.scale))
	}
	if t.frame > 0 && t.rate > 0 {
		d = max(d, mulDivCeil(t.count, t.frame*1e9, t.rate))
	}
	return d
}

type mp4State struct {
	seen    bool
	trunDur bool  // the trun's entries start with a duration
	tfhdHas bool  // the traf's tfhd has a default sample duration
	table   uint8 // entries being read: 's' stts, 't' trun
	depth   int8
	trak    int8 // track of the trak being read (-1: none)
	traf    int8 // track of the traf being read (-1: none)
	ntracks int8
	tfhdDur uint32
	entSize int
	entLeft int64
	entEnd  int64
	from    int64 // stream offset where the file starts
	scale   int64 // movie timescale
	movie   int64 // movie duration, ns
	lost    int64 // tracks beyond the table, ns
	stack   [mp4Depth]mp4Box
	tracks  [mp4Tracks + 1]mp4Track // the last one reads a track beyond the table
}

// mp4Start reports whether b starts with a box that starts such files.
func mp4Start(b []byte) bool {
	if size := binary.BigEndian.Uint32(b); size > 1 && size < 8 {
		return false
	}
	switch string(b[4:8]) {
	case "ftyp", "styp", "moov", "mdat", "free", "skip", "wide", "pnot", "moof", "sidx":
		return true
	}
	return false
}

// mp4Known reports whether a top-level box of type typ is of a known type.
func mp4Known(b []byte) bool {
	switch string(b) {
	case "ftyp", "styp", "moov", "mdat", "free", "skip", "wide", "pnot", "moof", "mfra",
		"sidx", "ssix", "prft", "emsg", "meta", "udta", "uuid", "pdin":
		return true
	}
	return false
}

// mp4Step reads the box header at buf[r], or a table's entries.
func (m *Meter) mp4Step(final bool) bool {
	x := &m.mp4
	pos := m.base + int64(m.r)
	for x.depth > 0 && pos >= x.stack[x.depth-1].end {
		x.depth--
		switch x.stack[x.depth].typ {
		case boxTrak:
			if x.trak == mp4Tracks {
				x.lost = max(x.lost, x.tracks[mp4Tracks].ns())
			}
			x.trak = -1
		case boxTraf:
			x.traf = -1
		}
	}
	if x.table != 0 {
		return m.mp4Entries(final)
	}
	parentEnd := int64(math.MaxInt64)
	var parent uint32
	if x.depth > 0 {
		parentEnd, parent = x.stack[x.depth-1].end, x.stack[x.depth-1].typ
	}
	b := m.buf[m.r:m.w]
	if len(b) == 0 {
		return false
	}
	if len(b) < 8 || len(b) < 16 && binary.BigEndian.Uint32(b) == 1 {
		if !final {
			return false
		}
		m.mp4Bad(parentEnd - pos) // a header cut short
		return true
	}
	hlen := int64(8)
	size := int64(binary.BigEndian.Uint32(b))
	switch size {
	case 0:
		size = parentEnd - pos
	case 1:
		size, hlen = int64(binary.BigEndian.Uint64(b[8:])), 16
	}
	if size = min(size, parentEnd-pos); size < hlen {
		m.mp4Bad(parentEnd - pos)
		return true
	}
	typ := binary.BigEndian.Uint32(b[4:])
	name := string(b[4:8])
	if x.depth == 0 {
		switch {
		case typ == boxMoov || typ == boxMoof:
			return m.mp4Push(b, size, hlen, 0, final)
		case !mp4Known(b[4:8]):
			m.startSkip(size, stMP4, true)
			return true
		}
		m.startSkip(size, stMP4, false)
		return true
	}
	switch parent {
	case boxMoov:
		switch name {
		case "mvhd", "trak", "mvex":
		default:
			name = ""
		}
	case boxTrak:
		if name != "tkhd" && name != "mdia" {
			name = ""
		}
	case boxMdia:
		if name != "mdhd" && name != "minf" {
			name = ""
		}
	case boxMinf:
		if name != "stbl" {
			name = ""
		}
	case boxStbl:
		switch name {
		case "stts", "stsz", "stz2", "stsd":
		default:
			name = ""
		}
	case boxStsd:
		if name != "mp4a" {
			name = ""
		}
	case boxMp4a:
		if name != "esds" && name != "wave" {
			name = ""
		}
	case boxWave:
		if name != "esds" {
			name = ""
		}
	case boxMvex:
		if name != "trex" && name != "mehd" {
			name = ""
		}
	case boxMoof:
		if name != "traf" {
			name = ""
		}
	case boxTraf:
		if name != "tfhd" && name != "trun" {
			name = ""
		}
	default:
		name = ""
	}
	switch name {
	case "trak", "mvex", "mdia", "minf", "stbl", "wave", "traf":
		return m.mp4Push(b, size, hlen, 0, final)
	case "stsd":
		return m.mp4Push(b, size, hlen, 8, final)
	case "mp4a":
		// The sound sample description: 28 bytes, 44 or 64 in
		// QuickTime's versions 1 and 2.
		if len(b) < int(hlen)+28 && size >= hlen+28 && !final {
			return false
		}
		pre := int64(28)
		if int64(len(b)) >= hlen+28 {
			switch binary.BigEndian.Uint16(b[hlen+8:]) {
			case 1:
				pre = 44
			case 2:
				pre = 64
			}
		}
		return m.mp4Push(b, size, hlen, pre, final)
	case "":
		m.startSkip(size, stMP4, false)
		return true
	}
	// A box to read: wait for its start.
	n := int(min(size, hlen+mp4LeafMax))
	if len(b) < n && !final {
		return false
	}
	body := b[hlen:min(n, len(b))]
	if name == "stts" || name == "trun" {
		if m.mp4Table(name, body, pos, size, hlen) {
			return true
		}
	} else {
		m.mp4Leaf(name, body)
	}
	m.startSkip(size, stMP4, false)
	return true
}

// mp4Bad handles a box that cannot be read: at the top level, the rest of
// the file is not known to be anything; inside a box, the rest of it is
// passed over.
func (m *Meter) mp4Bad(left int64) {
	if m.mp4.depth == 0 {
		m.startSkip(math.MaxInt64, stMP4, true)
		return
	}
	m.startSkip(left, stMP4, false)
}

// mp4Push opens a box of size bytes whose header is hlen bytes and whose
// children start pre bytes into the body.
func (m *Meter) mp4Push(b []byte, size, hlen, pre int64, final bool) bool {
	x := &m.mp4
	if int64(len(b)) < hlen+pre && size >= hlen+pre && !final {
		return false
	}
	if size < hlen+pre || int64(len(b)) < hlen+pre || x.depth == mp4Depth {
		m.startSkip(size, stMP4, false)
		return true
	}
	typ := binary.BigEndian.Uint32(b[4:])
	switch typ {
	case boxTrak:
		x.trak = x.ntracks
		if x.ntracks < mp4Tracks {
			x.ntracks++
		}
		x.tracks[x.trak] = mp4Track{}
	case boxTraf:
		x.traf, x.tfhdHas = -1, false
	}
	x.stack[x.depth] = mp4Box{end: m.base + int64(m.r) + size, typ: typ}
	x.depth++
	m.r += int(hlen + pre)
	return true
}

// track returns the track of the trak being read, or nil.
func (x *mp4State) track() *mp4Track {
	if x.trak < 0 {
		return nil
	}
	return &x.tracks[x.trak]
}

// find returns the track whose ID is id, or -1.
func (x *mp4State) find(id uint32) int8 {
	for i := range x.ntracks {
		if x.tracks[i].id == id {
			return i
		}
	}
	return -1
}

// mp4Leaf reads the start of a box.
func (m *Meter) mp4Leaf(name string, b []byte) {
	x := &m.mp4
	be := binary.BigEndian
	t := x.track()
	switch name {
	case "mvhd", "mdhd":
		scale, dur, ok := mp4Duration(b)
		if !ok {
			return
		}
		ns := int64(0)
		if scale > 0 {
			ns = mulDivCeil(dur, 1e9, scale)
		}
		switch {
		case name == "mvhd":
			x.scale = scale
			x.movie = max(x.movie, ns)
		case t != nil:
			t.scale = scale
			t.durNs = max(t.durNs, ns)
		}
	case "tkhd":
		if t == nil || len(b) < 24 {
			return
		}
		if b[0] == 1 {
			t.id = be.Uint32(b[20:])
		} else {
			t.id = be.Uint32(b[12:])
		}
	case "stsz", "stz2":
		if t != nil && len(b) >= 12 {
			t.count = addSat(t.count, int64(be.Uint32(b[8:])))
		}
	case "esds":
		if t == nil {
			return
		}
		if rate, frame := esdsAAC(b); rate > 0 && (t.rate == 0 || rate < t.rate) {
			t.rate, t.frame = rate, frame
		}
	case "trex":
		if len(b) >= 16 {
			if i := x.find(be.Uint32(b[4:])); i >= 0 {
				x.tracks[i].trex = be.Uint32(b[12:])
			}
		}
	case "mehd":
		if len(b) < 8 {
			return
		}
		var dur int64
		switch {
		case b[0] == 1 && len(b) >= 12:
			dur = int64(be.Uint64(b[4:]))
		case b[0] != 1 && len(b) >= 8:
			dur = int64(be.Uint32(b[4:]))
		}
		if dur > 0 && x.scale > 0 {
			x.movie = max(x.movie, mulDivCeil(dur, 1e9, x.scale))
		}
	case "tfhd":
		if len(b) < 8 {
			return
		}
		flags := be.Uint32(b) & 0xFFFFFF
		x.traf = x.find(be.Uint32(b[4:]))
		off := 8
		if flags&1 != 0 {
			off += 8
		}
		if flags&2 != 0 {
			off += 4
		}
		if flags&8 != 0 && len(b) >= off+4 {
			x.tfhdDur, x.tfhdHas = be.Uint32(b[off:]), true
		}
	}
}

// mp4Duration reads the timescale and duration of an mvhd or mdhd body;
// a duration of all ones is unknown.
func mp4Duration(b []byte) (scale, dur int64, ok bool) {
	be := binary.BigEndian
	switch {
	case len(b) >= 32 && b[0] == 1:
		scale, dur = int64(be.Uint32(b[20:])), int64(be.Uint64(b[24:]))
	case len(b) >= 20 && b[0] != 1:
		d := be.Uint32(b[16:])
		if d == math.MaxUint32 {
			return 0, 0, false
		}
		scale, dur = int64(be.Uint32(b[12:])), int64(d)
	default:
		return 0, 0, false
	}
	return scale, dur, dur >= 0
}

// mp4Table starts reading an stts or trun box's entries; it reports false
// when there are none to read.
func (m *Meter) mp4Table(name string, b []byte, pos, size, hlen int64) bool {
	x := &m.mp4
	be := binary.BigEndian
	if len(b) < 8 {
		return false
	}
	count := int64(be.Uint32(b[4:]))
	fixed := int64(8)
	x.entSize = 8
	x.table = 's'
	if name == "trun" {
		flags := be.Uint32(b) & 0xFFFFFF
		if flags&1 != 0 {
			fixed += 4
		}
		if flags&4 != 0 {
			fixed += 4
		}
		x.entSize = 4 * bits.OnesCount32(flags&0xF00)
		x.trunDur = flags&0x100 != 0
		x.table = 't'
		if x.traf < 0 {
			x.table = 0
			return false
		}
		t := &x.tracks[x.traf]
		t.count = addSat(t.count, count)
		if !x.trunDur {
			dur := t.trex
			if x.tfhdHas {
				dur = x.tfhdDur
			}
			t.frag = addSat(t.frag, mulSat(count, int64(dur)))
			x.table = 0
			return false
		}
	} else if x.trak < 0 {
		x.table = 0
		return false
	}
	if hlen+fixed > size || int64(len(b)) < fixed {
		x.table = 0
		return false
	}
	x.entLeft = count
	x.entEnd = pos + size
	m.r += int(hlen + fixed)
	return true
}

// mp4Entries reads the entries of a table that are in the buffer.
func (m *Meter) mp4Entries(final bool) bool {
	x := &m.mp4
	pos := m.base + int64(m.r)
	n := min((x.entEnd-pos)/int64(x.entSize), x.entLeft, int64((m.w-m.r)/x.entSize))
	if n == 0 {
		if m.w-m.r >= x.entSize || final || x.entLeft == 0 || pos+int64(x.entSize) > x.entEnd {
			x.table = 0
			m.startSkip(x.entEnd-pos, stMP4, false)
			return true
		}
		return false
	}
	be := binary.BigEndian
	if x.table == 's' {
		t := x.track()
		for i := range int(n) {
			e := m.buf[m.r+i*8:]
			t.stts = addSat(t.stts, int64(be.Uint32(e))*int64(be.Uint32(e[4:])))
		}
	} else {
		t := &x.tracks[x.traf]
		for i := range int(n) {
			t.frag = addSat(t.frag, int64(be.Uint32(m.buf[m.r+i*x.entSize:])))
		}
	}
	m.r += int(n) * x.entSize
	x.entLeft -= n
	return true
}

// mp4Ns is the duration of an MP4 file.
func (m *Meter) mp4Ns() int64 {
	x := &m.mp4
	d := max(x.movie, x.lost)
	for i := range x.ntracks {
		d = max(d, x.tracks[i].ns())
	}
	if x.trak == mp4Tracks {
		d = max(d, x.tracks[mp4Tracks].ns())
	}
	if d == 0 {
		return bytesNs(m.n-x.from, fallbackRate)
	}
	return max(d, bytesNs(m.garbage, fallbackRate))
}

// aacRates are the sample rates of the sampling frequency indexes.
var aacRates = [13]int64{96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350}
