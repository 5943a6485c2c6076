package audio

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// Matroska and WebM files are EBML elements: an ID (1 to 4 bytes, the
// length in its leading zeros), a size (1 to 8 bytes alike; all ones:
// unknown), the body. The meter walks them as they go by:
//
//	EBML header
//	Segment
//	  Info: TimecodeScale (ns a tick, 1,000,000 unless said), Duration (ticks, a float)
//	  Tracks / TrackEntry: TrackNumber, CodecID
//	  Cluster: Timecode, SimpleBlock, BlockGroup / Block
//
// Duration is the client's word, and so are the block timestamps. A
// decoder plays the blocks: each Opus block's packet is counted from its
// TOC byte (a block of several laced packets as that many of the longest
// packets). A file lasts the most of its Duration, its last block's
// timestamp and its Opus packets; without a Duration, the blocks of other
// codecs cost their size at 16 kbit/s instead, and a file with none of
// these costs its size. A Segment or Cluster of unknown size (as browsers
// record them) ends where an element of a higher level starts. Elements
// that cannot be read are passed over as a decoder does, looking for the
// next top-level element of a Segment; the bytes on the way cost 16
// kbit/s, and so do top-level elements of unknown types.

// EBML IDs.
const (
	ebmlHeaderID   = 0x1A45DFA3
	idSegment      = 0x18538067
	idSeekHead     = 0x114D9B74
	idInfo         = 0x1549A966
	idTracks       = 0x1654AE6B
	idCluster      = 0x1F43B675
	idCues         = 0x1C53BB6B
	idChapters     = 0x1043A770
	idTags         = 0x1254C367
	idAttachments  = 0x1941A469
	idTimecodeScal = 0x2AD7B1
	idDuration     = 0x4489
	idTrackEntry   = 0xAE
	idTrackNumber  = 0xD7
	idCodecID      = 0x86
	idTimecode     = 0xE7
	idSimpleBlock  = 0xA3
	idBlockGroup   = 0xA0
	idBlock        = 0xA1
	idVoid         = 0xEC
	idCRC32        = 0xBF
)

const (
	webmDepth  = 4
	webmTracks = 8
)

type ebmlElem struct {
	end  int64 // stream offset of its end (of its parent's when open)
	id   uint32
	open bool // of unknown size
}

type webmTrack struct {
	num  uint64
	opus bool
}

type webmState struct {
	seen     bool
	sync     bool // looking for a top-level element after bytes that cannot be read
	inInfo   bool
	trOpus   bool // the TrackEntry being read is Opus
	depth    int8
	ntracks  int8
	trNum    uint64
	from     int64
	scale    int64 // ns a tick in force (0: 1,000,000)
	infoScal int64 // TimecodeScale of the Info being read
	infoDur  float64
	durNs    int64 // largest Duration, ns
	cluster  int64 // the Cluster's timecode
	maxEnd   int64 // largest block timestamp, ns
	opus     int64 // Opus samples at 48 kHz
	other    int64 // bytes of blocks of other tracks
	stack    [webmDepth]ebmlElem
	tracks   [webmTracks]webmTrack
}

// ebmlVint reads a variable-length number of at most max bytes at the
// start of b: its value (the length marker kept when id), its length, and
// whether all its value bits are ones. n is 0 when b is too short, -1
// when it is no such number.
func ebmlVint(b []byte, maxLen int, id bool) (v uint64, n int, ones bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	n = bits.LeadingZeros8(b[0]) + 1
	if n > maxLen {
		return 0, -1, false
	}
	if len(b) < n {
		return 0, 0, false
	}
	mask := uint64(0xFF) >> n
	v = uint64(b[0]) & mask
	all := v == mask
	if id {
		v = uint64(b[0])
	}
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
		all = all && c == 0xFF
	}
	return v, n, all
}

func level1(id uint32) bool {
	switch id {
	case idSeekHead, idInfo, idTracks, idCluster, idCues, idChapters, idTags, idAttachments:
		return true
	}
	return false
}

// webmStep reads the element header at buf[r].
func (m *Meter) webmStep(final bool) bool {
	x := &m.webm
	if x.sync {
		return m.webmSync(final)
	}
	pos := m.base + int64(m.r)
	for x.depth > 0 && pos >= x.stack[x.depth-1].end {
		m.webmPop()
	}
	b := m.buf[m.r:m.w]
	if len(b) == 0 {
		return false
	}
	id64, idn, _ := ebmlVint(b, 4, true)
	var size uint64
	var sn int
	var unknown bool
	if idn > 0 {
		size, sn, unknown = ebmlVint(b[idn:], 8, false)
	}
	if idn < 0 || sn < 0 {
		m.webmBad()
		return true
	}
	if idn == 0 || sn == 0 {
		if !final {
			return false
		}
		m.garbage += int64(len(b)) // a header cut short
		m.r = m.w
		return true
	}
	id := uint32(id64)
	// Elements of unknown size end where one of a higher level starts.
	for x.depth > 0 && x.stack[x.depth-1].open {
		top := x.stack[x.depth-1].id
		if id == ebmlHeaderID || id == idSegment || top == idCluster && level1(id) {
			m.webmPop()
			continue
		}
		break
	}
	hlen := int64(idn + sn)
	parentEnd := int64(math.MaxInt64)
	var parent uint32
	if x.depth > 0 {
		parentEnd, parent = x.stack[x.depth-1].end, x.stack[x.depth-1].id
	}
	end := parentEnd
	switch {
	case unknown && (id == idSegment || id == idCluster):
	case unknown:
		m.webmBad()
		return true
	case parentEnd-pos-hlen < 0 || size > uint64(parentEnd-pos-hlen):
		m.webmBad()
		return true
	default:
		end = pos + hlen + int64(size)
	}
	switch parent {
	case 0:
		switch id {
		case idSegment:
			return m.webmPush(id, end, unknown, hlen)
		case ebmlHeaderID, idVoid, idCRC32:
			m.startSkip(end-pos, stWebm, false)
		default:
			m.startSkip(end-pos, stWebm, true)
		}
		return true
	case idSegment:
		switch id {
		case idInfo:
			x.inInfo, x.infoScal, x.infoDur = true, 0, 0
			return m.webmPush(id, end, false, hlen)
		case idTracks:
			return m.webmPush(id, end, false, hlen)
		case idCluster:
			x.cluster = 0
			return m.webmPush(id, end, unknown, hlen)
		}
	case idTracks:
		if id == idTrackEntry {
			x.trNum, x.trOpus = 0, false
			return m.webmPush(id, end, false, hlen)
		}
	case idCluster:
		switch id {
		case idBlockGroup:
			return m.webmPush(id, end, false, hlen)
		case idSimpleBlock:
			return m.webmBlock(b, end-pos, hlen, final)
		}
	case idBlockGroup:
		if id == idBlock {
			return m.webmBlock(b, end-pos, hlen, final)
		}
	}
	switch {
	case id == idTimecodeScal && parent == idInfo,
		id == idDuration && parent == idInfo,
		id == idTrackNumber && parent == idTrackEntry,
		id == idCodecID && parent == idTrackEntry,
		id == idTimecode && parent == idCluster:
		if size > 32 {
			break
		}
		if int64(len(b)) < hlen+int64(size) {
			if !final {
				return false
			}
			break
		}
		m.webmLeaf(id, b[hlen:hlen+int64(size)])
	}
	m.startSkip(end-pos, stWebm, false)
	return true
}

func (m *Meter) webmPush(id uint32, end int64, open bool, hlen int64) bool {
	x := &m.webm
	if x.depth == webmDepth {
		m.startSkip(end-m.base-int64(m.r), stWebm, false)
		return true
	}
	x.stack[x.depth] = ebmlElem{end: end, id: id, open: open}
	x.depth++
	m.r += int(hlen)
	return true
}

func (m *Meter) webmPop() {
	x := &m.webm
	x.depth--
	switch x.stack[x.depth].id {
	case idInfo:
		x.durNs = max(x.durNs, x.infoNs())
		if x.infoScal > 0 {
			x.scale = x.infoScal
		}
		x.inInfo = false
	case idTrackEntry:
		if x.ntracks < webmTracks && x.trNum > 0 {
			x.tracks[x.ntracks] = webmTrack{num: x.trNum, opus: x.trOpus}
			x.ntracks++
		}
	}
}

// infoNs is the Duration of the Info being read, ns.
func (x *webmState) infoNs() int64 {
	scale := x.infoScal
	if scale == 0 {
		scale = 1e6
	}
	d := x.infoDur * float64(scale)
	switch {
	case !(d > 0): // NaN too
		return 0
	case d >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(math.Ceil(d))
}

// webmLeaf reads an element's body.
func (m *Meter) webmLeaf(id uint32, b []byte) {
	x := &m.webm
	var u uint64
	for _, c := range b[:min(len(b), 8)] {
		u = u<<8 | uint64(c)
	}
	switch id {
	case idTimecodeScal:
		if u > 0 && u <= math.MaxInt64 {
			x.infoScal = int64(u)
		}
	case idDuration:
		switch len(b) {
		case 4:
			x.infoDur = float64(math.Float32frombits(uint32(u)))
		case 8:
			x.infoDur = math.Float64frombits(u)
		}
	case idTrackNumber:
		x.trNum = u
	case idCodecID:
		x.trOpus = string(b) == "A_OPUS"
	case idTimecode:
		x.cluster = int64(min(u, math.MaxInt64))
	}
}

// webmBlock reads a SimpleBlock or Block of size bytes (its header hlen
// of them): track number, timecode, flags, then the frames.
func (m *Meter) webmBlock(b []byte, size, hlen int64, final bool) bool {
	x := &m.webm
	need := hlen + min(size-hlen, 8+2+1+2)
	if int64(len(b)) < need && !final {
		return false
	}
	p := b[hlen:min(need, int64(len(b)))]
	track, n, _ := ebmlVint(p, 8, false)
	if n <= 0 || len(p) < n+3 {
		m.startSkip(size, stWebm, false)
		return true
	}
	tc := int64(int16(binary.BigEndian.Uint16(p[n:])))
	flags := p[n+2]
	data := p[n+3:]
	payload := size - hlen - int64(n+3)
	opus := false
	for i := range x.ntracks {
		if x.tracks[i].num == track {
			opus = x.tracks[i].opus
		}
	}
	var samples int64
	switch {
	case !opus:
		x.other = addSat(x.other, size-hlen)
	case flags&6 == 0: // one packet
		if payload == 0 {
			data = nil
		}
		samples = opusSamples(data)
	case len(data) > 0: // laced: the frame count less one, then sizes
		samples = (int64(data[0]) + 1) * opusMaxPacket
	default:
		samples = opusMaxPacket
	}
	x.opus = addSat(x.opus, samples)
	if t := x.cluster + tc; t >= 0 && x.cluster >= 0 {
		scale := x.scale
		if scale == 0 {
			scale = 1e6
		}
		end := addSat(mulSat(t, scale), mulDivCeil(samples, 1e9, 48000))
		x.maxEnd = max(x.maxEnd, end)
	}
	m.startSkip(size, stWebm, false)
	return true
}

// webmBad starts looking for the next top-level element of a Segment, as
// a decoder does after an element it cannot read.
func (m *Meter) webmBad() {
	m.webm.sync = true
	m.garbage++
	m.r++
}

// webmSync looks for an element ID a decoder resumes at; the bytes before
// it cost fallbackRate.
func (m *Meter) webmSync(final bool) bool {
	x := &m.webm
	start := m.r
	for ; m.r+4 <= m.w; m.r++ {
		switch m.buf[m.r] {
		case 0x1A, 0x18, 0x11, 0x15, 0x16, 0x1F, 0x1C, 0x10, 0x12, 0x19:
		default:
			continue
		}
		id := binary.BigEndian.Uint32(m.buf[m.r:])
		if id != ebmlHeaderID && id != idSegment && !level1(id) {
			continue
		}
		m.garbage += int64(m.r - start)
		for x.depth > 0 {
			m.webmPop()
		}
		if level1(id) { // inside a Segment that runs on
			x.stack[0] = ebmlElem{end: math.MaxInt64, id: idSegment, open: true}
			x.depth = 1
		}
		x.sync = false
		return true
	}
	if final {
		m.r = m.w
	}
	m.garbage += int64(m.r - start)
	return m.r > start
}

// webmNs is the duration of a Matroska or WebM file.
func (m *Meter) webmNs() int64 {
	x := &m.webm
	dur := x.durNs
	if x.inInfo {
		dur = max(dur, x.infoNs())
	}
	opus := mulDivCeil(x.opus, 1e9, 48000)
	if dur > 0 {
		return max(dur, x.maxEnd, opus, bytesNs(m.garbage, fallbackRate))
	}
	d := max(x.maxEnd, addSat(opus, bytesNs(addSat(x.other, m.garbage), fallbackRate)))
	if d == 0 {
		d = bytesNs(m.n-x.from, fallbackRate)
	}
	return d
}
