package audio

import "math"

// mp4 reads an ISO base media file (MP4, M4A, MOV, 3GP) in two walks
// over its boxes. The first reads the sample tables (stsz, and trun in
// fragments) of the sound tracks in AAC or Opus: each sample counts the
// longest an access unit of its codec lasts (AAC: 1024 samples at the
// rate of its AudioSpecificConfig, 2048 with explicit SBR, 4096 for other
// object types; 279 ms when that rate is not given; Opus: 120 ms), and
// it may account for the bytes an access unit can take. The second walk
// accounts for the boxes it checked (containers' headers, tables whose
// size matches their entry count, small boxes of numbers) and, in mdat,
// for as many bytes as those samples may take. Everything else — other
// tracks' samples, names, metadata, free space — is raw.
func (r *reader) mp4() {
	m := &mp4Reader{r: r, collect: true}
	r.dry = true
	m.boxes(0, len(r.data), 0)
	r.dry, m.collect = false, false
	for _, t := range m.tracks {
		if t.sound && t.frameNs > 0 {
			m.budget = addSat(m.budget, t.bytes)
			r.ns = addSat(r.ns, mulSat(t.samples, t.frameNs))
		}
	}
	m.boxes(0, len(r.data), 0)
}

// mp4Track is a track's codec and what its samples add up to.
type mp4Track struct {
	id             uint32
	sound          bool
	frameNs, maxAU int64 // the longest an access unit lasts, the most bytes it takes
	defaultSize    int64 // trex's
	samples, bytes int64
}

type mp4Reader struct {
	r       *reader
	collect bool // the first walk: read the tables
	tracks  []*mp4Track
	cur     *mp4Track // the trak, or the traf's track
	size    int64     // the traf's default sample size
	budget  int64     // sample bytes mdat may still account for
}

// mp4Kind says how a box is read: 'c' a container of boxes, 'n' a small
// box of numbers only, accounted for whole; 0 any other box.
func mp4Kind(typ string) byte {
	switch typ {
	case "moov", "trak", "mdia", "minf", "stbl", "moof", "traf", "mvex", "edts", "dinf":
		return 'c'
	case "mvhd", "mdhd", "smhd", "elst", "mehd", "mfhd", "tfdt", "dref", "stss", "sdtp", "sgpd", "sbgp", "iods", "btrt":
		return 'n'
	}
	return 0
}

// boxes walks the boxes in data[p:end].
func (m *mp4Reader) boxes(p, end, depth int) {
	r := m.r
	for p+8 <= end && r.ok() {
		size, hdr := int64(be.Uint32(r.data[p:])), 8
		typ := string(r.data[p+4 : p+8])
		switch {
		case size == 1 && p+16 <= end:
			size, hdr = int64(min(be.Uint64(r.data[p+8:]), math.MaxInt64)), 16
		case size == 0:
			size = int64(end - p)
		}
		if size < int64(hdr) {
			return // the rest is raw
		}
		next := p + int(min(size, int64(end-p)))
		body := p + hdr
		switch kind := mp4Kind(typ); {
		case kind == 'c' && depth < 8:
			r.account(p, body)
			if typ == "trak" && m.collect {
				m.cur = &mp4Track{}
				if len(m.tracks) < maxStreams {
					m.tracks = append(m.tracks, m.cur)
				}
			}
			m.boxes(body, next, depth+1)
		case typ == "mdat":
			r.account(p, body)
			k := int(min(int64(next-body), m.budget))
			r.account(body, body+k)
			m.budget -= int64(k)
		case typ == "ftyp" && size <= 64 && size%4 == 0,
			kind == 'n' && size <= 256,
			m.leaf(typ, r.data[body:next]):
			r.account(p, next)
		}
		p = next
	}
}

// leaf reads a box of the sample tables and reports whether it is
// well formed.
func (m *mp4Reader) leaf(typ string, b []byte) bool {
	if len(b) < 8 {
		return false
	}
	n := int64(be.Uint32(b[4:])) // the entry count, for most tables
	switch typ {
	case "hdlr":
		if m.collect && m.cur != nil && len(b) >= 12 {
			m.cur.sound = string(b[8:12]) == "soun"
		}
		return false // its name is text
	case "tkhd":
		if m.collect && m.cur != nil {
			at := 12 + 8*int(b[0]&1) // version 1: 64-bit times
			if len(b) >= at+4 {
				m.cur.id = be.Uint32(b[at:])
			}
		}
		return len(b) <= 256
	case "stts", "ctts", "stsc", "stco", "co64":
		width := int64(8)
		switch typ {
		case "stsc":
			width = 12
		case "stco":
			width = 4
		}
		return int64(len(b)) == 8+n*width
	case "stsd":
		if m.collect && m.cur != nil && n >= 1 {
			m.sampleEntry(b[8:])
		}
		return len(b) <= 1024
	case "stsz":
		return m.stsz(b)
	case "trex":
		if m.collect && len(b) >= 24 {
			if t := m.track(be.Uint32(b[4:])); t != nil {
				t.defaultSize = int64(be.Uint32(b[16:]))
			}
		}
		return len(b) == 24
	case "tfhd":
		return m.tfhd(b)
	case "trun":
		return m.trun(b)
	}
	return false
}

func (m *mp4Reader) track(id uint32) *mp4Track {
	for _, t := range m.tracks {
		if t.id == id {
			return t
		}
	}
	return nil
}

// sampleEntry reads a track's first sample description: its codec.
func (m *mp4Reader) sampleEntry(b []byte) {
	if len(b) < 36 {
		return
	}
	switch string(b[4:8]) {
	case "mp4a":
		// 8 header, 8 reserved and index, 20 of the audio entry, then esds.
		m.cur.frameNs, m.cur.maxAU = mulDivCeil(2048, 1e9, 7350), 6144
		if e := b[36:min(len(b), int(be.Uint32(b)))]; len(e) >= 8 && string(e[4:8]) == "esds" {
			if aot, rate := aacConfig(e[8:min(len(e), int(be.Uint32(e)))]); rate > 0 {
				frame := int64(4096)
				switch aot {
				case 1, 2, 3, 4:
					frame = 1024
				case 5, 29:
					frame = 2048
				}
				m.cur.frameNs = mulDivCeil(frame, 1e9, rate)
			}
		}
	case "Opus":
		m.cur.frameNs, m.cur.maxAU = 120e6, 2+48*1277
	}
}

// aacConfig finds the AudioSpecificConfig in an esds box's body (ISO/IEC
// 14496-1 descriptors: ES, DecoderConfig, DecoderSpecificInfo) and
// returns its object type and first sampling rate, 0 if there is none.
func aacConfig(b []byte) (aot, rate int64) {
	b = b[min(4, len(b)):] // version and flags
	for len(b) >= 2 {
		tag, n, l := b[0], 0, 1
		for ; l < len(b) && l <= 4; l++ {
			n = n<<7 | int(b[l]&0x7F)
			if b[l]&0x80 == 0 {
				break
			}
		}
		body := b[min(l+1, len(b)):]
		body = body[:min(n, len(body))]
		switch {
		case tag == 3 && len(body) >= 3:
			skip, f := 3, body[2]
			if f&0x80 != 0 {
				skip += 2
			}
			if f&0x40 != 0 && skip < len(body) {
				skip += 1 + int(body[skip])
			}
			if f&0x20 != 0 {
				skip += 2
			}
			b = body[min(skip, len(body)):]
		case tag == 4:
			b = body[min(13, len(body)):]
		case tag == 5 && len(body) >= 2:
			return ascRate(body)
		default:
			return 0, 0
		}
	}
	return 0, 0
}

// aacRates are the sampling rates by index (ISO/IEC 14496-3 1.6.3.3).
var aacRates = [13]int64{96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350}

// ascRate reads an AudioSpecificConfig's object type and rate.
func ascRate(b []byte) (aot, rate int64) {
	var w [8]byte
	copy(w[:], b)
	v, at := be.Uint64(w[:]), 5 // v's bits, from the top; at: bits read
	aot = int64(v >> 59)
	if aot == 31 {
		aot, at = 32+int64(v>>53&63), 11
	}
	idx := v << at >> 60
	switch {
	case idx < 13:
		rate = aacRates[idx]
	case idx == 15:
		rate = int64(v << (at + 4) >> 40)
	}
	return aot, rate
}

// stsz reads a sample size table.
func (m *mp4Reader) stsz(b []byte) bool {
	if len(b) < 12 {
		return false
	}
	fixed, n := int64(be.Uint32(b[4:])), int64(be.Uint32(b[8:]))
	if fixed == 0 && int64(len(b)) != 12+4*n || fixed != 0 && len(b) != 12 {
		return false
	}
	t := m.cur
	if !m.collect || t == nil || t.maxAU == 0 {
		return true
	}
	t.samples = addSat(t.samples, n)
	if fixed != 0 {
		t.bytes = addSat(t.bytes, mulSat(n, min(fixed, t.maxAU)))
		return true
	}
	for i := range int(n) {
		if !m.r.ok() {
			break
		}
		t.bytes += min(int64(be.Uint32(b[12+4*i:])), t.maxAU)
	}
	return true
}

// tfhd reads a fragment's track header.
func (m *mp4Reader) tfhd(b []byte) bool {
	flags := be.Uint32(b) & 0xFFFFFF
	want := 8
	for _, f := range [...]struct {
		bit   uint32
		width int
	}{{1, 8}, {2, 4}, {8, 4}, {0x10, 4}, {0x20, 4}} {
		if flags&f.bit != 0 {
			if f.bit == 0x10 && len(b) >= want+4 {
				m.size = int64(be.Uint32(b[want:]))
			}
			want += f.width
		}
	}
	if m.collect {
		m.cur = m.track(be.Uint32(b[4:]))
		if m.cur != nil && flags&0x10 == 0 {
			m.size = m.cur.defaultSize
		}
	}
	return len(b) == want
}

// trun reads a fragment's track run.
func (m *mp4Reader) trun(b []byte) bool {
	flags, n := be.Uint32(b)&0xFFFFFF, int64(be.Uint32(b[4:]))
	head := 8 + 4*int(flags&1) + 4*int(flags>>2&1)
	width := 0
	for _, bit := range []uint32{0x100, 0x200, 0x400, 0x800} {
		if flags&bit != 0 {
			width += 4
		}
	}
	if int64(len(b)) != int64(head)+n*int64(width) {
		return false
	}
	t := m.cur
	if !m.collect || t == nil || t.maxAU == 0 {
		return true
	}
	t.samples = addSat(t.samples, n)
	if flags&0x200 == 0 {
		t.bytes = addSat(t.bytes, mulSat(n, min(m.size, t.maxAU)))
		return true
	}
	at := head + 4*int(flags>>8&1) // the first sample's size
	for i := range int(n) {
		if !m.r.ok() {
			break
		}
		t.bytes += min(int64(be.Uint32(b[at+i*width:])), t.maxAU)
	}
	return true
}
