package audio

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// Ogg (RFC 3533) carries logical streams in pages:
//
//	"OggS" version(1) flags(1) granule(8) serial(4) sequence(4) CRC(4)
//	segments(1) lacing values(segments) body(sum of the lacing values)
//
// A packet is a run of lacing values ending with one below 255; flag 1
// marks a page whose first packet continues from the stream's previous
// page, 2 the first page of a stream (BOS), 4 its last (EOS). Each stream
// names its codec in its first packet: Opus, Vorbis, FLAC or Speex.
//
// The granule positions are the client's word, and so is every length and
// count in the headers; what a decoder plays is its packets. So a stream
// lasts the most of its largest granule position and of its packets added
// up, one by one (Opus: from each packet's TOC; Vorbis: from each packet's
// mode and the block sizes; Speex: the frames a packet of its header
// holds; FLAC: every frame header in the file, as for a FLAC file).
//
// The page CRC is not checked. A decoder drops a page whose CRC is wrong
// and looks for the next capture pattern from the byte after it, so it
// may find pages inside the body of the bad one. The meter walks pages by
// their lengths as if every CRC were right, and every other capture
// pattern, inside a page or not, is read as a page too and its packets
// cost the most any packet of the file can last: whatever pages a decoder
// finds, the meter has counted them at least once. A bad page can only
// make a file dearer.

// oggStreams is how many logical streams are followed at once.
const oggStreams = 8

// oggIDMax is how much of a packet's start is read at once: enough for
// every identification header (Speex's fields end at 68 bytes).
const oggIDMax = 80

// opusMaxPacket is the longest Opus packet, 120 ms, in 48 kHz samples.
const opusMaxPacket = 5760

type oggKind uint8

const (
	oggOpus oggKind = iota + 1
	oggVorbis
	oggFLAC
	oggSpeex
)

// oggStream is a logical stream whose codec the meter knows.
type oggStream struct {
	used    bool
	kind    oggKind
	eos     bool  // its last page was seen
	open    bool  // its last packet continues on its next page
	setup   bool  // and is the Vorbis setup header being read
	tried   bool  // Vorbis: a setup header has been read, well or not
	hdr     uint8 // header packets still to come (Opus and Speex comments)
	ch      uint8 // Vorbis channels
	bs0     uint8 // Vorbis block size exponents
	bs1     uint8
	prev    uint8 // Vorbis: exponent of the previous block (0: none yet)
	nmodes  uint8 // Vorbis modes read from the setup header (0: unknown)
	serial  uint32
	modes   uint64 // Vorbis: long-block flag by mode
	rate    int64
	preskip int64 // Opus
	perPkt  int64 // Speex samples a packet
	gmax    int64 // largest granule position (-1: none)
	samples int64 // samples of the packets counted
}

// oggState is what the meter knows of an Ogg file.
type oggState struct {
	seen     bool
	inPage   bool   // the walker is inside a page
	bos, eos bool   // the page's flags
	first    bool   // the next packet start is the page's first
	feed     bool   // the bytes up to next go to the Vorbis setup reader
	feedEnds bool   // and that packet ends on this page
	overflow bool   // a stream was not followed: unknown pages cost the most
	cur      int8   // the page's stream (-1: not followed)
	owner    int8   // stream whose setup header vs reads (-1: none)
	nseg     uint8  // lacing values of the page
	seg      int    // next lacing value
	serial   uint32 // the page's serial
	start    int64  // stream offset of the page
	body     int64  // stream offset of its body
	next     int64  // stream offset of the next packet start or page end
	maxPkt   int64  // longest packet any identification header allows, ns
	nested   int64  // packets of pages not walked, ns
	done     int64  // streams no longer followed, ns
	doneFLAC int64  // FLAC streams no longer followed, ns
	flac     bool   // a FLAC stream was identified
	lace     [255]byte
	streams  [oggStreams]oggStream
	vs       vorbisSetup
}

func (m *Meter) startOgg() {
	o := &m.ogg
	o.seen = true
	o.cur, o.owner = -1, -1
	m.scan = true
	m.sc = m.r
	m.st = stOgg
}

// oggHeader returns the length of the page header at the start of b (0:
// not a page), or wait if more bytes are needed to tell.
func oggHeader(b []byte, final bool) (n int, wait bool) {
	if len(b) < 5 || len(b) < 27 && string(b[:5]) == "OggS\x00" {
		return 0, !final
	}
	if string(b[:5]) != "OggS\x00" {
		return 0, false
	}
	n = 27 + int(b[26])
	if len(b) < n {
		return 0, !final
	}
	return n, false
}

// packetAt returns the in-page length of the packet whose first lacing
// value is lace[i], whether it ends on the page, and the index after it.
func packetAt(lace []byte, i int) (n int64, ends bool, next int) {
	for ; i < len(lace); i++ {
		n += int64(lace[i])
		if lace[i] < 255 {
			return n, true, i + 1
		}
	}
	return n, false, i
}

// oggStep walks pages: at a page start, a packet start, or the bytes of a
// page between them.
func (m *Meter) oggStep(final bool) bool {
	o := &m.ogg
	if !o.inPage {
		return m.oggSync(final)
	}
	if m.base+int64(m.r) == o.next {
		return m.oggEvent(final)
	}
	lim := int(min(o.next-m.base, int64(m.w)))
	if m.r == lim {
		if final {
			m.oggCut()
		}
		return false
	}
	stop := lim
	if i := bytes.IndexByte(m.buf[m.r:lim], 'O'); i >= 0 {
		stop = m.r + i
	}
	if stop == m.r {
		if m.oggNested(final) {
			return false
		}
		stop++
	}
	if from := int(max(int64(m.r), o.body-m.base)); o.feed && stop > from {
		o.vs.feed(m.buf[from:stop])
	}
	m.r = stop
	return true
}

// oggSync looks for a page at buf[r]; bytes that start none cost
// fallbackRate.
func (m *Meter) oggSync(final bool) bool {
	b := m.buf[m.r:m.w]
	if len(b) == 0 {
		return false
	}
	if i := bytes.IndexByte(b, 'O'); i != 0 {
		if i < 0 {
			i = len(b)
		}
		m.garbage += int64(i)
		m.r += i
		return true
	}
	n, wait := oggHeader(b, final)
	if wait {
		return false
	}
	if n == 0 {
		m.garbage++
		m.r++
		return true
	}
	m.oggPage(b[:n])
	return true
}

// oggPage starts the walker's page whose header h is at buf[r].
func (m *Meter) oggPage(h []byte) {
	o := &m.ogg
	flags := h[5]
	gran := int64(binary.LittleEndian.Uint64(h[6:]))
	serial := binary.LittleEndian.Uint32(h[14:])
	o.nseg = h[26]
	copy(o.lace[:], h[27:])
	o.serial = serial
	o.start = m.base + int64(m.r)
	o.body = o.start + int64(len(h))
	o.next = o.body
	o.inPage = true
	o.bos, o.eos = flags&2 != 0, flags&4 != 0
	o.cur = o.find(serial)
	// The header's bytes are read for capture patterns too: a decoder
	// that drops this page looks for one from its second byte on.
	m.r++
	o.seg = 0
	o.first = flags&1 == 0
	o.feed = false
	lace := o.lace[:o.nseg]
	if o.cur < 0 {
		if flags&1 != 0 { // the rest of a packet never started
			n, _, i := packetAt(lace, 0)
			o.next += n
			o.seg = i
		}
		return
	}
	s := &o.streams[o.cur]
	if gran >= 0 {
		s.gmax = max(s.gmax, gran)
	}
	if o.eos {
		s.eos = true
	}
	if flags&1 != 0 {
		n, ends, i := packetAt(lace, 0)
		o.next += n
		o.seg = i
		if s.open && s.setup {
			o.feed, o.feedEnds = true, ends
		}
		s.open = s.open && !ends
		return
	}
	if s.open {
		// A packet that never ended: a decoder drops it.
		s.open = false
		m.oggSetupEnd(o.cur, false)
	}
}

// oggEvent handles a packet start or the end of the page at buf[r].
func (m *Meter) oggEvent(final bool) bool {
	o := &m.ogg
	if o.feed {
		o.feed = false
		if o.feedEnds {
			m.oggSetupEnd(o.owner, true)
		}
	}
	if o.seg == int(o.nseg) {
		if o.cur < 0 && !o.overflow {
			m.garbage += o.next - o.start // a stream of no known codec
		}
		o.inPage = false
		return true
	}
	n, ends, i := packetAt(o.lace[:o.nseg], o.seg)
	need := int(min(n, oggIDMax))
	if m.w-m.r < need && !final {
		return false
	}
	pk := m.buf[m.r:min(m.r+need, m.w)]
	if final && len(pk) == 0 && n > 0 {
		m.oggCut() // the packet is not there
		return false
	}
	first := o.first
	o.first = false
	o.seg = i
	o.next += n
	m.oggPacket(pk, first, ends)
	return true
}

// oggCut ends a page the stream ends in: if it is of no known codec, what
// there is of it costs its size.
func (m *Meter) oggCut() {
	o := &m.ogg
	if o.cur < 0 && !o.overflow {
		m.garbage += m.base + int64(m.w) - o.start
	}
	o.inPage = false
}

// oggPacket counts the packet starting with pk on the walker's page.
func (m *Meter) oggPacket(pk []byte, first, ends bool) {
	o := &m.ogg
	if o.cur < 0 {
		var id oggStream
		if !o.identify(&id, pk, m) {
			if o.overflow {
				o.nested = addSat(o.nested, o.maxPkt)
			}
			return
		}
		i := m.oggAdd()
		if i < 0 {
			o.overflow = true
			return
		}
		id.serial = o.serial
		o.streams[i] = id
		o.cur = int8(i)
		o.streams[i].eos = o.eos
		if !ends {
			o.streams[i].open = true
		}
		return
	}
	s := &o.streams[o.cur]
	if !ends {
		s.open = true
	}
	if first && o.bos {
		var id oggStream
		if o.identify(&id, pk, m) {
			// A new stream reuses the serial: the old one is done.
			m.oggFold(s)
			id.serial, id.used, id.eos, id.open = s.serial, true, s.eos, s.open
			if o.owner == o.cur {
				o.owner = -1
			}
			*s = id
			return
		}
	}
	switch s.kind {
	case oggOpus:
		if s.hdr > 0 {
			s.hdr--
			return
		}
		s.samples = addSat(s.samples, opusSamples(pk))
	case oggSpeex:
		if s.hdr > 0 {
			s.hdr--
			return
		}
		s.samples = addSat(s.samples, s.perPkt)
	case oggVorbis:
		m.vorbisPacket(s, pk, ends)
	}
}

// vorbisPacket counts a Vorbis packet: an audio packet lasts a quarter of
// the previous block and a quarter of its own, its mode telling a long
// block from a short one. Without the modes, every block is long.
func (m *Meter) vorbisPacket(s *oggStream, pk []byte, ends bool) {
	o := &m.ogg
	if len(pk) == 0 {
		return
	}
	if pk[0]&1 != 0 { // a header packet
		if pk[0] == 5 && !s.tried && o.owner < 0 {
			o.vs.start(s.ch)
			o.owner = o.cur
			s.setup = true
			o.feed, o.feedEnds = true, ends
		}
		return
	}
	exp := s.bs1
	if s.nmodes > 0 {
		mode := pk[0] >> 1 & (1<<bits.Len8(s.nmodes-1) - 1)
		if mode >= s.nmodes {
			return // a decoder rejects the packet
		}
		if s.modes>>mode&1 == 0 {
			exp = s.bs0
		}
	}
	prev := s.prev
	if prev == 0 {
		prev = exp
	}
	s.samples = addSat(s.samples, 1<<prev/4+1<<exp/4)
	s.prev = exp
}

// oggSetupEnd ends the setup header read for stream i, whose packet ended
// (or was dropped).
func (m *Meter) oggSetupEnd(i int8, ended bool) {
	o := &m.ogg
	if i < 0 || o.owner != i {
		return
	}
	s := &o.streams[i]
	if ended && o.vs.ok {
		s.modes, s.nmodes = o.vs.modes, o.vs.nmodes
	}
	s.setup = false
	s.tried = true
	o.owner = -1
}

// oggNested reads a capture pattern at buf[r] inside the walker's page as
// a page: a decoder that drops the page around it finds it. Its packets
// cost the most a packet of the file can last. It reports whether it
// needs more bytes.
func (m *Meter) oggNested(final bool) (wait bool) {
	o := &m.ogg
	b := m.buf[m.r:m.w]
	n, wait := oggHeader(b, final)
	if wait || n == 0 {
		return wait
	}
	flags := b[5]
	lace := b[27:n]
	starts := int64(0)
	at := flags&1 == 0
	for _, v := range lace {
		if at {
			starts++
		}
		at = v < 255
	}
	serial := binary.LittleEndian.Uint32(b[14:])
	i := o.find(serial)
	if flags&1 == 0 && len(lace) > 0 {
		l, _, _ := packetAt(lace, 0)
		need := n + int(min(l, oggIDMax))
		if len(b) < need && !final {
			return true
		}
		var id oggStream
		if o.identify(&id, b[n:min(need, len(b))], m) {
			starts--
			if i < 0 {
				if j := m.oggAdd(); j >= 0 {
					id.serial = serial
					o.streams[j] = id
					i = int8(j)
				} else {
					o.overflow = true
				}
			}
		}
	}
	if gran := int64(binary.LittleEndian.Uint64(b[6:])); i >= 0 && gran >= 0 {
		o.streams[i].gmax = max(o.streams[i].gmax, gran)
	}
	o.nested = addSat(o.nested, mulSat(starts, o.maxPkt))
	return false
}

// identify reads an identification header into s and raises the longest
// packet of the file.
func (o *oggState) identify(s *oggStream, pk []byte, m *Meter) bool {
	le := binary.LittleEndian
	*s = oggStream{used: true, gmax: -1}
	var most int64
	switch {
	case len(pk) >= 19 && string(pk[:8]) == "OpusHead" && pk[8] < 16 && pk[9] > 0:
		s.kind, s.rate, s.hdr = oggOpus, 48000, 1
		s.preskip = int64(le.Uint16(pk[10:]))
		most = mulDivCeil(opusMaxPacket, 1e9, 48000)
	case len(pk) >= 30 && pk[0] == 1 && string(pk[1:7]) == "vorbis" && le.Uint32(pk[7:]) == 0:
		e0, e1 := pk[28]&15, pk[28]>>4
		s.ch = pk[11]
		s.rate = int64(le.Uint32(pk[12:]))
		if s.ch == 0 || s.rate == 0 || e0 < 6 || e0 > e1 || e1 > 13 || pk[29]&1 == 0 {
			return false
		}
		s.kind, s.bs0, s.bs1 = oggVorbis, e0, e1
		most = mulDivCeil(1<<e1/2, 1e9, s.rate)
	case len(pk) >= 51 && pk[0] == 0x7F && string(pk[1:5]) == "FLAC" && string(pk[9:13]) == "fLaC" && pk[13]&0x7F == 0:
		s.rate = int64(binary.BigEndian.Uint32(pk[27:]) >> 12)
		if s.rate == 0 {
			return false
		}
		s.kind = oggFLAC
		o.flac = true
		if f := &m.flac; f.rate == 0 || s.rate < f.rate {
			f.rate = s.rate
		}
	case len(pk) >= 68 && string(pk[:8]) == "Speex   ":
		s.rate = int64(le.Uint32(pk[36:]))
		size := int64(le.Uint32(pk[56:]))
		n := max(int64(le.Uint32(pk[64:])), 1)
		if s.rate == 0 || size == 0 {
			return false
		}
		s.kind, s.hdr, s.perPkt = oggSpeex, 1, mulSat(size, n)
		most = mulDivCeil(s.perPkt, 1e9, s.rate)
	default:
		return false
	}
	o.maxPkt = max(o.maxPkt, most)
	return true
}

// find returns the followed stream of a serial, or -1.
func (o *oggState) find(serial uint32) int8 {
	for i := range o.streams {
		if s := &o.streams[i]; s.used && s.serial == serial {
			return int8(i)
		}
	}
	return -1
}

// oggAdd returns a free slot for a new stream, or -1. When all are
// taken, a stream that has ended makes room; from then on, pages of no
// followed stream cost the most a packet can last, as when a stream could
// not be followed at all.
func (m *Meter) oggAdd() int {
	o := &m.ogg
	for i := range o.streams {
		if !o.streams[i].used {
			return i
		}
	}
	for i := range o.streams {
		if s := &o.streams[i]; s.eos && int8(i) != o.cur && int8(i) != o.owner {
			m.oggFold(s)
			*s = oggStream{}
			o.overflow = true
			return i
		}
	}
	return -1
}

// oggFold adds up a stream that is no longer followed.
func (m *Meter) oggFold(s *oggStream) {
	o := &m.ogg
	if s.kind == oggFLAC {
		o.doneFLAC = addSat(o.doneFLAC, s.ns())
	} else {
		o.done = addSat(o.done, s.ns())
	}
}
