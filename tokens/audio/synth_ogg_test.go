package audio

import (
	"encoding/binary"
)

// This file builds Ogg streams for the tests (RFC 3533, RFC 7845, the
// Vorbis I specification), independently of the meter's code.

// oggCRC is the Ogg page checksum: CRC-32, polynomial 0x04C11DB7, not
// reflected, initial value 0, computed bit by bit.
func testOggCRC(b []byte) uint32 {
	var crc uint32
	for _, x := range b {
		crc ^= uint32(x) << 24
		for range 8 {
			if crc&0x80000000 != 0 {
				crc = crc<<1 ^ 0x04C11DB7
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// oggPage is one page with a right CRC.
func oggPage(serial, seq uint32, flags byte, granule int64, lace, body []byte) []byte {
	h := []byte("OggS\x00")
	h = append(h, flags)
	h = binary.LittleEndian.AppendUint64(h, uint64(granule))
	h = binary.LittleEndian.AppendUint32(h, serial)
	h = binary.LittleEndian.AppendUint32(h, seq)
	h = append(h, 0, 0, 0, 0, byte(len(lace)))
	h = append(h, lace...)
	h = append(h, body...)
	binary.LittleEndian.PutUint32(h[22:], testOggCRC(h))
	return h
}

// oggWriter lays packets out on the pages of one logical stream.
type oggWriter struct {
	serial, seq uint32
	done        int // packets completed
}

// write puts packets on pages of at most segs lacing values each; the
// first page gets flags (BOS, …), the last one also last (EOS, …). Each
// page's granule position is gran(packets completed by its end), -1 when
// none completes on it.
func (w *oggWriter) write(flags, last byte, segs int, gran func(done int) int64, pks ...[]byte) []byte {
	type seg struct {
		n    byte
		data []byte
		end  bool // ends a packet
	}
	var all []seg
	for _, p := range pks {
		for len(p) >= 255 {
			all = append(all, seg{255, p[:255], false})
			p = p[255:]
		}
		all = append(all, seg{byte(len(p)), p, true})
	}
	var out []byte
	cont := false
	for i := 0; i < len(all); i += segs {
		page := all[i:min(i+segs, len(all))]
		var lace, body []byte
		ended := false
		for _, s := range page {
			lace = append(lace, s.n)
			body = append(body, s.data...)
			if s.end {
				w.done++
				ended = true
			}
		}
		f := flags
		if cont {
			f |= 1
		}
		if i+segs >= len(all) {
			f |= last
		}
		g := int64(-1)
		if ended {
			g = gran(w.done)
		}
		out = append(out, oggPage(w.serial, w.seq, f, g, lace, body)...)
		w.seq++
		flags = 0
		cont = !page[len(page)-1].end
	}
	return out
}

// opusHead is an OpusHead packet for one channel.
func opusHead(preskip uint16) []byte {
	b := []byte("OpusHead\x01\x01")
	b = binary.LittleEndian.AppendUint16(b, preskip)
	b = binary.LittleEndian.AppendUint32(b, 48000)
	return append(b, 0, 0, 0)
}

func opusTags() []byte { return []byte("OpusTags\x04\x00\x00\x00test\x00\x00\x00\x00") }

// opusStream is an Ogg Opus file of the packets, with pre-skip 312; its
// granule positions are the samples so far plus the pre-skip, or what
// gran says.
func opusStream(serial uint32, gran func(samples int64) int64, pks ...[]byte) []byte {
	w := &oggWriter{serial: serial}
	out := w.write(2, 0, 255, func(int) int64 { return 0 }, opusHead(312))
	out = append(out, w.write(0, 0, 255, func(int) int64 { return 0 }, opusTags())...)
	var samples []int64 // after each audio packet
	var t int64
	for _, p := range pks {
		t += testOpusSamples(p)
		samples = append(samples, t)
	}
	return append(out, w.write(0, 4, 255, func(done int) int64 {
		s := samples[done-3] + 312
		if gran != nil {
			return gran(s)
		}
		return s
	}, pks...)...)
}

// testOpusSamples is an Opus packet's length in 48 kHz samples, from the
// tables of RFC 6716, 3.1.
func testOpusSamples(p []byte) int64 {
	cfg := int(p[0] >> 3)
	var ms10 int64 // tenths of a millisecond
	switch {
	case cfg < 12:
		ms10 = []int64{100, 200, 400, 600}[cfg%4]
	case cfg < 16:
		ms10 = []int64{100, 200}[cfg%2]
	default:
		ms10 = []int64{25, 50, 100, 200}[cfg%4]
	}
	frames := int64(1)
	switch p[0] & 3 {
	case 1, 2:
		frames = 2
	case 3:
		frames = int64(p[1] & 63)
	}
	return frames * ms10 * 48 / 10
}

// repeat is n copies of a packet.
func repeat(p []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = p
	}
	return out
}

// vorbisID is a Vorbis identification header.
func vorbisID(ch byte, rate uint32, e0, e1 byte) []byte {
	b := []byte("\x01vorbis\x00\x00\x00\x00")
	b = append(b, ch)
	b = binary.LittleEndian.AppendUint32(b, rate)
	b = append(b, make([]byte, 12)...)
	return append(b, e1<<4|e0, 1)
}

func vorbisComment() []byte { return []byte("\x03vorbis\x04\x00\x00\x00test\x00\x00\x00\x00\x01") }

// vorbisStream is an Ogg Vorbis file: the three headers (the setup header
// on pages of at most segs lacing values), then the packets.
func vorbisStream(serial uint32, rate uint32, e0, e1 byte, setup []byte, segs int, gran func(done int) int64, pks ...[]byte) []byte {
	w := &oggWriter{serial: serial}
	zero := func(int) int64 { return 0 }
	out := w.write(2, 0, 255, zero, vorbisID(1, rate, e0, e1))
	out = append(out, w.write(0, 0, segs, zero, vorbisComment(), setup)...)
	return append(out, w.write(0, 4, 255, gran, pks...)...)
}
