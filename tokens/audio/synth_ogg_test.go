package audio

import (
	"encoding/binary"
)

// This file builds Ogg streams for the tests (RFC 3533, RFC 7845, the
// Vorbis I specification), independently of the meter's code.

// oggCRC is the Ogg page checksum: CRC-32, polynomial 0x04C11DB7, not
// reflected, initial value 0, computed bit by bit.
func oggCRC(b []byte) uint32 {
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
	binary.LittleEndian.PutUint32(h[22:], oggCRC(h))
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

// bitWriter writes bits the Vorbis way: first the low bits, into the low
// bits of each byte first.
type bitWriter struct {
	b []byte
	n int
}

func (w *bitWriter) put(v uint64, n int) {
	for i := range n {
		if w.n%8 == 0 {
			w.b = append(w.b, 0)
		}
		w.b[len(w.b)-1] |= byte(v>>i&1) << (w.n % 8)
		w.n++
	}
}

// vorbisSetupOpts says what a test setup header holds besides its modes.
type vorbisSetupOpts struct {
	rich     bool   // codebooks of every kind, both floors, cascades, submaps, coupling
	modes    []bool // long-block flag of each mode
	trailing []byte // bytes after the framing bit
}

// vorbisSetupHeader writes a setup header for ch channels.
func vorbisSetupHeader(ch int, o vorbisSetupOpts) []byte {
	w := &bitWriter{}
	for _, c := range []byte("\x05vorbis") {
		w.put(uint64(c), 8)
	}
	ilog := func(x int) int {
		n := 0
		for ; x > 0; x >>= 1 {
			n++
		}
		return n
	}
	book := func(dims, entries int, ordered, sparse bool, lookup int) {
		w.put(0x564342, 24)
		w.put(uint64(dims), 16)
		w.put(uint64(entries), 24)
		switch {
		case ordered:
			w.put(1, 1)
			w.put(2, 5) // first length - 1
			// entries in runs of 3
			for cur := 0; cur < entries; {
				n := min(3, entries-cur)
				w.put(uint64(n), ilog(entries-cur))
				cur += n
			}
		default:
			w.put(0, 1)
			w.put(b2u(sparse), 1)
			for i := range entries {
				if sparse {
					used := i%2 == 0
					w.put(b2u(used), 1)
					if !used {
						continue
					}
				}
				w.put(3, 5)
			}
		}
		w.put(uint64(lookup), 4)
		if lookup > 0 {
			w.put(0x12345678, 32)
			w.put(0x9abcdef0, 32)
			w.put(4, 4) // value bits - 1
			w.put(1, 1)
			values := entries * dims
			if lookup == 1 {
				r := 0
				for {
					p := 1
					for range dims {
						p *= r + 1
					}
					if p > entries {
						break
					}
					r++
				}
				values = r
			}
			w.put(0, values*5)
		}
	}
	if o.rich {
		w.put(4-1, 8)
		book(1, 8, false, false, 0)
		book(2, 16, false, true, 1)
		book(3, 10, true, false, 2)
		book(4, 81, false, false, 1)
	} else {
		w.put(0, 8)
		book(1, 2, false, false, 0)
	}
	w.put(0, 6) // one time-domain transform
	w.put(0, 16)
	if o.rich {
		w.put(2-1, 6)
		// floor 0
		w.put(0, 16)
		w.put(0, 8+16+16+6+8)
		w.put(2-1, 4)
		w.put(0, 16)
		// floor 1: 3 partitions of classes 0, 1, 0
		w.put(1, 16)
		w.put(3, 5)
		for _, c := range []int{0, 1, 0} {
			w.put(uint64(c), 4)
		}
		dims := []int{2, 3}
		for c, subs := range []int{0, 2} {
			w.put(uint64(dims[c]-1), 3)
			w.put(uint64(subs), 2)
			if subs > 0 {
				w.put(1, 8)
			}
			for range 1 << subs {
				w.put(0, 8)
			}
		}
		w.put(1, 2) // multiplier - 1
		w.put(7, 4) // range bits
		w.put(0x55, (2+3+2)*7)
	} else {
		w.put(0, 6)
		w.put(1, 16)
		w.put(0, 5)
		w.put(0, 2)
		w.put(4, 4)
	}
	// residues
	if o.rich {
		w.put(2-1, 6)
		for typ := range 2 {
			w.put(uint64(typ+1), 16)
			w.put(0, 24*3)
			w.put(3-1, 6)
			w.put(0, 8)
			cascades := []uint64{0x05, 0xFF, 0x81}
			for _, c := range cascades {
				w.put(c&7, 3)
				if c > 7 {
					w.put(1, 1)
					w.put(c>>3, 5)
				} else {
					w.put(0, 1)
				}
			}
			w.put(0, 8*(2+8+2))
		}
	} else {
		w.put(0, 6)
		w.put(0, 16)
		w.put(0, 24*3)
		w.put(0, 6)
		w.put(0, 8)
		w.put(0, 3)
		w.put(0, 1)
	}
	// mappings
	if o.rich {
		w.put(2-1, 6)
		for range 2 {
			w.put(0, 16)
			w.put(1, 1)
			w.put(2-1, 4) // two submaps
			w.put(1, 1)
			w.put(2-1, 8) // two coupling steps
			w.put(0, 2*2*ilog(ch-1))
			w.put(0, 2)
			w.put(0, 4*ch)
			w.put(0, 2*24)
		}
	} else {
		w.put(0, 6)
		w.put(0, 16)
		w.put(0, 1)
		w.put(0, 1)
		w.put(0, 2)
		w.put(0, 24)
	}
	w.put(uint64(len(o.modes)-1), 6)
	for _, long := range o.modes {
		w.put(b2u(long), 1)
		w.put(0, 16)
		w.put(0, 16)
		w.put(0, 8)
	}
	w.put(1, 1)
	return append(w.b, o.trailing...)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// vorbisStream is an Ogg Vorbis file: the three headers (the setup header
// on pages of at most segs lacing values), then the packets.
func vorbisStream(serial uint32, rate uint32, e0, e1 byte, setup []byte, segs int, gran func(done int) int64, pks ...[]byte) []byte {
	w := &oggWriter{serial: serial}
	zero := func(int) int64 { return 0 }
	out := w.write(2, 0, 255, zero, vorbisID(1, rate, e0, e1))
	out = append(out, w.write(0, 0, segs, zero, vorbisComment(), setup)...)
	return append(out, w.write(0, 4, 255, gran, pks...)...)
}

// flacOggHeader is the first packet of FLAC in Ogg: the mapping header and
// STREAMINFO.
func flacOggHeader(rate int) []byte {
	b := []byte("\x7fFLAC\x01\x00\x00\x01")
	return append(b, flacStream(rate, 0)...)
}

// speexHeader is a Speex header: rate, samples a frame, frames a packet.
func speexHeader(rate, frame, perPacket uint32) []byte {
	b := make([]byte, 80)
	copy(b, "Speex   1.2")
	le := binary.LittleEndian
	le.PutUint32(b[28:], 1)
	le.PutUint32(b[32:], 80)
	le.PutUint32(b[36:], rate)
	le.PutUint32(b[48:], 1)
	le.PutUint32(b[56:], frame)
	le.PutUint32(b[64:], perPacket)
	return b
}
