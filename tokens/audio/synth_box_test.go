package audio

import (
	"math"
)

// This file builds MP4 (ISO/IEC 14496-12, -14, -1, -3) and Matroska/WebM
// (RFC 8794, the Matroska specification) files for the tests.

const ebmlHeaderID = 0x1A45DFA3

// box is an MP4 box of the parts.
func box(typ string, parts ...[]byte) []byte {
	body := cat(parts...)
	b := be.AppendUint32(nil, uint32(8+len(body)))
	return append(append(b, typ...), body...)
}

// fullBox is a box with a version and flags.
func fullBox(typ string, version byte, flags uint32, parts ...[]byte) []byte {
	vf := be.AppendUint32(nil, uint32(version)<<24|flags)
	return box(typ, append([][]byte{vf}, parts...)...)
}

func u32(v uint32) []byte { return be.AppendUint32(nil, v) }
func u64(v uint64) []byte { return be.AppendUint64(nil, v) }

// mvhd and mdhd: version 0 (32-bit times) or 1 (64-bit).
func timeBox(typ string, version byte, scale uint32, dur uint64) []byte {
	if version == 1 {
		return fullBox(typ, 1, 0, u64(0), u64(0), u32(scale), u64(dur), make([]byte, 80))
	}
	return fullBox(typ, 0, 0, u32(0), u32(0), u32(scale), u32(uint32(dur)), make([]byte, 80))
}

// asc is an AudioSpecificConfig: object type, sampling frequency index
// (15: explicit rate), channels; with sbr, the explicit SBR form.
func asc(aot, sfi int, rate uint32, ch int, sbr bool) []byte {
	var w msbWriter
	if sbr {
		w.put(5, 5)
	} else {
		w.put(uint64(aot), 5)
	}
	w.put(uint64(sfi), 4)
	if sfi == 15 {
		w.put(uint64(rate), 24)
	}
	w.put(uint64(ch), 4)
	if sbr {
		w.put(3, 4) // 48 kHz out
		w.put(uint64(aot), 5)
	}
	w.put(0, 3) // GASpecificConfig: 1024 samples a frame
	return w.b
}

// msbWriter writes bits high first.
type msbWriter struct {
	b []byte
	n int
}

func (w *msbWriter) put(v uint64, n int) {
	for i := n - 1; i >= 0; i-- {
		if w.n%8 == 0 {
			w.b = append(w.b, 0)
		}
		w.b[len(w.b)-1] |= byte(v>>i&1) << (7 - w.n%8)
		w.n++
	}
}

// desc is an MPEG-4 descriptor with its length in four bytes, as muxers
// write it.
func desc(tag byte, parts ...[]byte) []byte {
	body := cat(parts...)
	n := len(body)
	return append([]byte{tag, 0x80 | byte(n>>21&0x7F), 0x80 | byte(n>>14&0x7F), 0x80 | byte(n>>7&0x7F), byte(n & 0x7F)}, body...)
}

// esds carries an AudioSpecificConfig.
func esds(oti byte, config []byte) []byte {
	dcd := desc(4, []byte{oti, 0x15, 0, 0, 0}, u32(128000), u32(128000), desc(5, config))
	return fullBox("esds", 0, 0, desc(3, []byte{0, 1, 0}, dcd, desc(6, []byte{2})))
}

// mp4a is an audio sample entry (QuickTime version 0, 1 or 2).
func mp4a(version uint16, rate uint32, children ...[]byte) []byte {
	e := make([]byte, 28)
	be.PutUint16(e[6:], 1) // data reference index
	be.PutUint16(e[8:], version)
	be.PutUint16(e[16:], 2)
	be.PutUint16(e[18:], 16)
	be.PutUint32(e[24:], rate<<16)
	switch version {
	case 1:
		e = append(e, make([]byte, 16)...)
	case 2:
		e = append(e, make([]byte, 36)...)
	}
	return box("mp4a", append([][]byte{e}, children...)...)
}

// sttsBox is a time-to-sample table of (count, delta) pairs.
func sttsBox(pairs ...uint32) []byte {
	b := u32(uint32(len(pairs) / 2))
	for _, v := range pairs {
		b = append(b, u32(v)...)
	}
	return fullBox("stts", 0, 0, b)
}

var ftyp = box("ftyp", []byte("M4A \x00\x00\x02\x00isomiso2"))

// ebml is an element: its ID's bytes, its size in sizeLen bytes (0: the
// shortest; -1: unknown, in 8 bytes), the body.
func ebml(id uint32, sizeLen int, parts ...[]byte) []byte {
	body := cat(parts...)
	var b []byte
	for shift := 24; shift >= 0; shift -= 8 {
		if c := byte(id >> shift); c != 0 || len(b) > 0 {
			b = append(b, c)
		}
	}
	if sizeLen < 0 {
		return append(append(b, 0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF), body...)
	}
	n := uint64(len(body))
	if sizeLen == 0 {
		sizeLen = 1
		for n >= 1<<(7*sizeLen)-1 {
			sizeLen++
		}
	}
	v := n | 1<<(7*sizeLen)
	for i := sizeLen - 1; i >= 0; i-- {
		b = append(b, byte(v>>(8*i)))
	}
	return append(b, body...)
}

func ebmlUint(id uint32, v uint64) []byte {
	var b []byte
	for i := 7; i >= 0; i-- {
		if c := byte(v >> (8 * i)); c != 0 || len(b) > 0 || i == 0 {
			b = append(b, c)
		}
	}
	return ebml(id, 0, b)
}

func ebmlFloat(id uint32, f float64, size int) []byte {
	if size == 4 {
		return ebml(id, 0, u32(math.Float32bits(float32(f))))
	}
	return ebml(id, 0, u64(math.Float64bits(f)))
}

var ebmlHead = ebml(ebmlHeaderID, 0, ebmlUint(0x4286, 1), ebml(0x4282, 0, []byte("webm")))

// webmInfo is an Info element; duration < 0 leaves Duration out.
func webmInfo(scale uint64, duration float64) []byte {
	parts := [][]byte{ebmlUint(idTimecodeScal, scale)}
	if duration >= 0 {
		parts = append(parts, ebmlFloat(idDuration, duration, 8))
	}
	parts = append(parts, ebml(0x4D80, 0, []byte("test")))
	return ebml(idInfo, 0, parts...)
}

// webmTracksOf is a Tracks element of tracks 1, 2… of the codecs.
func webmTracksOf(codecs ...string) []byte {
	var entries [][]byte
	for i, c := range codecs {
		entries = append(entries, ebml(idTrackEntry, 0,
			ebmlUint(idTrackNumber, uint64(i+1)),
			ebmlUint(0x83, 2),
			ebml(idCodecID, 0, []byte(c)),
			ebml(0x63A2, 0, opusHead(312)),
		))
	}
	return ebml(idTracks, 0, entries...)
}

// simpleBlock is a SimpleBlock of a track (below 127) at a timecode.
func simpleBlock(track byte, tc int16, flags byte, data []byte) []byte {
	return ebml(idSimpleBlock, 0, []byte{0x80 | track, byte(uint16(tc) >> 8), byte(tc), flags}, data)
}

// webmCluster is a Cluster at a timecode with blocks of one track, one
// packet each, dt ticks apart; sizeLen as for ebml.
func webmCluster(sizeLen int, tc uint64, track byte, dt int16, pks ...[]byte) []byte {
	parts := [][]byte{ebmlUint(idTimecode, tc)}
	for i, p := range pks {
		parts = append(parts, simpleBlock(track, int16(i)*dt, 0x80, p))
	}
	return ebml(idCluster, sizeLen, parts...)
}

// Matroska element IDs the builders use (the reader has its own table).
const (
	idSegment      = 0x18538067
	idInfo         = 0x1549A966
	idTimecodeScal = 0x2AD7B1
	idDuration     = 0x4489
	idTracks       = 0x1654AE6B
	idCluster      = 0x1F43B675
	idTimecode     = 0xE7
)
