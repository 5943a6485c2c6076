package audio

import (
	"bytes"
	"math/bits"
)

// flac reads a native FLAC file: its metadata blocks (STREAMINFO and
// zero padding accounted for, the bodies of the others — tags, pictures,
// seek tables — raw), then its frames. A frame is found by its header
// (sync code and CRC-8, as a decoder finds it) and runs to the next
// header; it counts its header's block size, and it accounts for at most
// what that block can take uncompressed. Every header a decoder could
// sync on is counted, so the sum bounds the duration from above.
func (r *reader) flac() {
	r.account(0, 4)
	p, streamRate := 4, int64(0)
	for last := false; !last && p+4 <= len(r.data) && r.ok(); {
		typ, n := r.data[p]&0x7F, int(r.data[p+1])<<16|int(r.data[p+2])<<8|int(r.data[p+3])
		last = r.data[p]&0x80 != 0
		if typ > 6 || n > len(r.data)-p-4 {
			break // not a metadata block: the frames are looked for from here
		}
		end := p + 4 + n
		r.account(p, p+4)
		switch body := r.data[p+4 : end]; {
		case typ == 0 && n == 34 && len(body) == 34:
			streamRate = int64(be.Uint32(body[10:]) >> 12)
			r.account(p+4, end)
		case typ == 1 && len(bytes.TrimLeft(body, "\x00")) == 0:
			r.account(p+4, end)
		}
		p = end
	}
	h := flacNext(r.data, p, streamRate)
	for h.size > 0 && r.ok() {
		next := flacNext(r.data, h.at+2, streamRate)
		for next.size > 0 && next.at < h.at+h.size && r.ok() { // a header inside this one's header
			next = flacNext(r.data, next.at+1, streamRate)
		}
		end := len(r.data)
		if next.size > 0 {
			end = next.at
		}
		r.account(h.at, min(end, h.at+h.max))
		r.addNs(h.samples, h.rate)
		h = next
	}
}

// flacHeader is a frame header found at `at`.
type flacHeader struct {
	at, size      int   // size: header bytes, 0 when none was found
	max           int   // the most bytes the frame can take
	samples, rate int64 // block size and sample rate
}

// flacNext finds the first valid frame header at or after p.
func flacNext(b []byte, p int, streamRate int64) flacHeader {
	for p < len(b) {
		i := bytes.IndexByte(b[p:], 0xFF)
		if i < 0 {
			break
		}
		if h := flacAt(b, p+i, streamRate); h.size > 0 {
			return h
		}
		p += i + 1
	}
	return flacHeader{}
}

// flacRates are the sample rates by code 1 to 11.
var flacRates = [12]int64{0, 88200, 176400, 192000, 8000, 16000, 22050, 24000, 32000, 44100, 48000, 96000}

// flacAt reads the frame header at b[p:] (RFC 9639 §9.1).
func flacAt(b []byte, p int, streamRate int64) flacHeader {
	h := b[p:min(len(b), p+16)]
	if len(h) < 6 || h[1]&0xFE != 0xF8 || h[3]>>4 > 10 || h[3]&1 != 0 {
		return flacHeader{}
	}
	n := 4 + bits.LeadingZeros8(^h[4]) // the coded frame or sample number: 1 to 7 bytes
	switch n {
	case 4:
		n = 5
	case 5, 12:
		return flacHeader{}
	}
	bs, rc := int64(h[2]>>4), h[2]&15
	var samples int64
	switch {
	case bs == 0:
		return flacHeader{}
	case bs == 1:
		samples = 192
	case bs <= 5:
		samples = 576 << (bs - 2)
	case bs == 6 && n < len(h):
		samples, n = int64(h[n])+1, n+1
	case bs == 7 && n+1 < len(h):
		samples, n = int64(be.Uint16(h[n:]))+1, n+2
	case bs >= 8:
		samples = 256 << (bs - 8)
	}
	rate := streamRate
	switch {
	case rc >= 1 && rc <= 11:
		rate = flacRates[rc]
	case rc == 12 && n < len(h):
		rate, n = int64(h[n])*1000, n+1
	case rc == 13 && n+1 < len(h):
		rate, n = int64(be.Uint16(h[n:])), n+2
	case rc == 14 && n+1 < len(h):
		rate, n = int64(be.Uint16(h[n:]))*10, n+2
	case rc != 0:
		return flacHeader{}
	}
	if samples == 0 || rate == 0 || n >= len(h) || crc8(h[:n]) != h[n] {
		return flacHeader{}
	}
	ch := int64(h[3]>>4) + 1
	if ch > 8 {
		ch = 2
	}
	return flacHeader{at: p, size: n + 1, max: int(32 + ch*(4+samples*33/8)), samples: samples, rate: rate}
}

// crc8Table is FLAC's header CRC (polynomial x⁸+x²+x+1) by byte.
var crc8Table = func() (t [256]byte) {
	for i := range t {
		c := byte(i)
		for range 8 {
			if c&0x80 != 0 {
				c = c<<1 ^ 0x07
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc8(b []byte) byte {
	var c byte
	for _, v := range b {
		c = crc8Table[c^v]
	}
	return c
}
