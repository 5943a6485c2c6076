package audio

import (
	"bytes"
	"encoding/binary"
)

// flacState is what the meter knows of FLAC frames.
//
// A FLAC frame does not say how long it is: a decoder finds the next one by
// decoding this one, or by looking for the next sync code. So the meter
// does not walk frames; it counts every frame header in the stream, at
// every offset, whose CRC-8 is right. A decoder cannot play a frame without
// such a header, so the count is never short, whatever the metadata claims
// (STREAMINFO's total is not used); a false header turns up about once in
// 16 MiB of random bytes.
type flacState struct {
	meta     bool  // a "fLaC" stream: its metadata blocks are read
	next     int64 // stream offset of the next metadata block header
	done     bool  // the last metadata block has been read
	rate     int64 // smallest STREAMINFO sample rate (0: none yet)
	explicit int64 // frames that name their sample rate, nanoseconds
	samples  int64 // samples of frames at the STREAMINFO sample rate
}

// flacDefaultRate prices frames at the STREAMINFO sample rate when there
// is none (a decoder cannot play them): the lowest rate FLAC's table names.
const flacDefaultRate = 8000

// flacHeaderMax is the longest frame header: 4 fixed bytes, a coded number
// of up to 7, 2 of block size, 2 of sample rate and the CRC-8.
const flacHeaderMax = 16

func (f *flacState) ns() int64 {
	rate := f.rate
	if rate == 0 {
		rate = flacDefaultRate
	}
	return addSat(f.explicit, mulDivCeil(f.samples, 1e9, rate))
}

// flacScan counts the frame headers starting from buf[*cur] and reads the
// metadata blocks of a "fLaC" stream on the way.
func (m *Meter) flacScan(cur *int, final bool) bool {
	f := &m.flac
	moved := false
	for f.meta && !f.done {
		off := f.next - m.base
		if off+4 > int64(m.w) {
			break
		}
		b := m.buf[off:m.w]
		typ := b[0] & 0x7F
		size := int64(b[1])<<16 | int64(b[2])<<8 | int64(b[3])
		if typ == 0 && size >= 34 {
			if len(b) < 4+14 {
				break
			}
			// STREAMINFO: the sample rate is 20 bits at byte 10.
			rate := int64(binary.BigEndian.Uint32(b[4+10:]) >> 12)
			if rate > 0 && (f.rate == 0 || rate < f.rate) {
				f.rate = rate
			}
		}
		if b[0]&0x80 != 0 || typ == 127 {
			f.done = true
		}
		f.next += 4 + size
		moved = true
	}
	lim := m.w - (flacHeaderMax - 1)
	if final {
		lim = m.w
		f.done = true
	}
	if f.meta && !f.done {
		lim = int(min(int64(lim), f.next-m.base))
	}
	for *cur < lim {
		i := bytes.IndexByte(m.buf[*cur:lim], 0xFF)
		if i < 0 {
			*cur = lim
			break
		}
		x := *cur + i
		if x+1 < m.w && m.buf[x+1]&0xFE != 0xF8 && m.buf[x+1] != 0xFF { // not a sync
			*cur = x + 1
			moved = true
			continue
		}
		if y := min(ffRun(m.buf[:m.w], x), lim); y > x {
			*cur = y
			moved = true
			continue
		}
		if bs, rate, ok := flacHeader(m.buf[x:min(x+flacHeaderMax, m.w)]); ok {
			if rate > 0 {
				f.explicit = addSat(f.explicit, mulDivCeil(bs, 1e9, rate))
			} else {
				f.samples = addSat(f.samples, bs)
			}
		}
		*cur = x + 1
		moved = true
	}
	return moved
}

// flacRates are the sample rates of codes 1 to 11.
var flacRates = [12]int64{0, 88200, 176400, 192000, 8000, 16000, 22050, 24000, 32000, 44100, 48000, 96000}

// flacHeader reads a frame header at the start of b and returns its block
// size and sample rate (0: STREAMINFO's). It is lenient where decoders
// differ (reserved bits, 7-byte frame numbers) and strict where all agree:
// the sync code, reserved codes, and the CRC-8.
func flacHeader(b []byte) (bs, rate int64, ok bool) {
	if len(b) < 5 || b[0] != 0xFF || b[1]&0xFE != 0xF8 {
		return 0, 0, false
	}
	bsCode, rateCode := b[2]>>4, b[2]&15
	if bsCode == 0 || rateCode == 15 || b[3]>>4 >= 11 || b[3]>>1&7 == 3 {
		return 0, 0, false
	}
	// The frame or sample number, UTF-8 style in 1 to 7 bytes.
	i := 5
	switch c := b[4]; {
	case c < 0x80:
	case c&0xE0 == 0xC0:
		i += 1
	case c&0xF0 == 0xE0:
		i += 2
	case c&0xF8 == 0xF0:
		i += 3
	case c&0xFC == 0xF8:
		i += 4
	case c&0xFE == 0xFC:
		i += 5
	case c == 0xFE:
		i += 6
	default:
		return 0, 0, false
	}
	if len(b) < i {
		return 0, 0, false
	}
	for _, c := range b[5:i] {
		if c&0xC0 != 0x80 {
			return 0, 0, false
		}
	}
	extra := 0
	switch bsCode {
	case 6:
		extra = 1
	case 7:
		extra = 2
	}
	switch rateCode {
	case 12:
		extra++
	case 13, 14:
		extra += 2
	}
	if len(b) < i+extra+1 {
		return 0, 0, false
	}
	switch {
	case bsCode == 1:
		bs = 192
	case bsCode <= 5:
		bs = 576 << (bsCode - 2)
	case bsCode == 6:
		bs = int64(b[i]) + 1
		i++
	case bsCode == 7:
		bs = (int64(b[i])<<8 | int64(b[i+1])) + 1
		i += 2
	default:
		bs = 256 << (bsCode - 8)
	}
	switch rateCode {
	case 12:
		rate = int64(b[i]) * 1000
		i++
	case 13:
		rate = int64(b[i])<<8 | int64(b[i+1])
		i += 2
	case 14:
		rate = (int64(b[i])<<8 | int64(b[i+1])) * 10
		i += 2
	default:
		rate = flacRates[rateCode]
	}
	if rateCode >= 12 && rate == 0 {
		return 0, 0, false
	}
	if crc8(b[:i]) != b[i] {
		return 0, 0, false
	}
	return bs, rate, true
}

// crc8 is FLAC's frame header CRC: polynomial x^8+x^2+x+1, initial 0.
func crc8(b []byte) byte {
	var c byte
	for _, x := range b {
		c ^= x
		for range 8 {
			if c&0x80 != 0 {
				c = c<<1 ^ 0x07
			} else {
				c <<= 1
			}
		}
	}
	return c
}
