package audio

import (
	"bytes"
	"encoding/binary"
)

// This file builds small audio streams for the tests, from the format
// specifications rather than from the meter's own tables.

// wavFmt is a fmt chunk's fields.
type wavFmt struct {
	tag      uint16
	ch       uint16
	rate     uint32
	byteRate uint32 // 0: rate × align
	align    uint16 // 0: ch × bits/8
	bits     uint16
	sub      uint16 // WAVE_FORMAT_EXTENSIBLE's subformat when tag is 0xFFFE
}

func (f wavFmt) body() []byte {
	align := f.align
	if align == 0 {
		align = f.ch * ((f.bits + 7) / 8)
	}
	byteRate := f.byteRate
	if byteRate == 0 {
		byteRate = f.rate * uint32(align)
	}
	le := binary.LittleEndian
	b := le.AppendUint16(nil, f.tag)
	b = le.AppendUint16(b, f.ch)
	b = le.AppendUint32(b, f.rate)
	b = le.AppendUint32(b, byteRate)
	b = le.AppendUint16(b, align)
	b = le.AppendUint16(b, f.bits)
	if f.tag == 0xFFFE {
		b = le.AppendUint16(b, 22)     // cbSize
		b = le.AppendUint16(b, f.bits) // valid bits
		b = le.AppendUint32(b, 0)      // channel mask
		b = le.AppendUint16(b, f.sub)
		b = append(b, ksSubtypeTail...)
	}
	return b
}

// chunk is a RIFF chunk; size overrides the declared size when not -1.
type chunk struct {
	id   string
	body []byte
	size int64
}

func ck(id string, body []byte) chunk { return chunk{id: id, body: body, size: -1} }

// riff builds a RIFF/WAVE file (magic "RIFF", "RF64"…) from chunks, padding
// odd bodies.
func riff(magic string, chunks ...chunk) []byte {
	var b bytes.Buffer
	for _, c := range chunks {
		b.WriteString(c.id)
		size := uint32(len(c.body))
		if c.size >= 0 {
			size = uint32(c.size)
		}
		b.Write(binary.LittleEndian.AppendUint32(nil, size))
		b.Write(c.body)
		if len(c.body)%2 == 1 {
			b.WriteByte(0)
		}
	}
	out := []byte(magic)
	out = binary.LittleEndian.AppendUint32(out, uint32(4+b.Len()))
	out = append(out, "WAVE"...)
	return append(out, b.Bytes()...)
}

// pcm is n bytes of a ramp that never looks like a header.
func pcm(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 97)
	}
	return b
}

// mpeg is an MPEG audio frame header's fields: version 3 MPEG-1, 2
// MPEG-2, 0 MPEG-2.5; layer 1, 2 or 3.
type mpeg struct {
	ver, layer  int
	kbps, rate  int
	pad         bool
	payloadByte byte
}

// tables from ISO/IEC 11172-3 and 13818-3.
var (
	testKbps = map[[2]int][]int{
		{1, 1}: {32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448},
		{1, 2}: {32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384},
		{1, 3}: {32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320},
		{2, 1}: {32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256},
		{2, 2}: {8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160},
		{2, 3}: {8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160},
	}
	testRates = map[int][]int{3: {44100, 48000, 32000}, 2: {22050, 24000, 16000}, 0: {11025, 12000, 8000}}
)

func (f mpeg) header() []byte {
	family := 2
	if f.ver == 3 {
		family = 1
	}
	bri := 0
	if f.kbps != 0 {
		for i, k := range testKbps[[2]int{family, f.layer}] {
			if k == f.kbps {
				bri = i + 1
			}
		}
		if bri == 0 {
			panic("bad bitrate")
		}
	}
	sri := -1
	for i, r := range testRates[f.ver] {
		if r == f.rate {
			sri = i
		}
	}
	if sri < 0 {
		panic("bad rate")
	}
	pad := 0
	if f.pad {
		pad = 1
	}
	return []byte{
		0xFF,
		0xE0 | byte(f.ver)<<3 | byte(4-f.layer)<<1 | 1, // no CRC
		byte(bri)<<4 | byte(sri)<<2 | byte(pad)<<1,
		0xC4, // mono, original, no emphasis
	}
}

// size is the frame's length in bytes.
func (f mpeg) size() int {
	pad := 0
	if f.pad {
		pad = 1
	}
	switch {
	case f.layer == 1:
		return (12*f.kbps*1000/f.rate + pad) * 4
	case f.layer == 3 && f.ver != 3:
		return 72*f.kbps*1000/f.rate + pad
	}
	return 144*f.kbps*1000/f.rate + pad
}

// bytes is the whole frame with a constant payload.
func (f mpeg) bytes() []byte {
	b := make([]byte, f.size())
	copy(b, f.header())
	for i := 4; i < len(b); i++ {
		b[i] = f.payloadByte
	}
	return b
}

// frames is n copies of f.
func (f mpeg) frames(n int) []byte {
	return bytes.Repeat(f.bytes(), n)
}

// id3 is an ID3v2.4 tag whose body is body and whose declared size is
// size (-1: the body's).
func id3(body []byte, size int) []byte {
	if size < 0 {
		size = len(body)
	}
	b := []byte{'I', 'D', '3', 4, 0, 0,
		byte(size >> 21 & 0x7F), byte(size >> 14 & 0x7F), byte(size >> 7 & 0x7F), byte(size & 0x7F)}
	return append(b, body...)
}

// flacStream is "fLaC", a STREAMINFO block (the last) and frames.
func flacStream(rate int, total uint64, frames ...[]byte) []byte {
	b := []byte("fLaC")
	b = append(b, 0x80, 0, 0, 34) // last block, STREAMINFO, 34 bytes
	si := make([]byte, 34)
	binary.BigEndian.PutUint16(si[0:], 4096)
	binary.BigEndian.PutUint16(si[2:], 4096)
	// sample rate (20 bits), channels-1 (3), bits-1 (5), total samples (36)
	v := uint64(rate)<<44 | 0<<41 | 15<<36 | total&(1<<36-1)
	binary.BigEndian.PutUint64(si[10:], v)
	b = append(b, si...)
	for _, f := range frames {
		b = append(b, f...)
	}
	return b
}

// flacFrame is a frame header with block-size code bsCode (and its explicit
// value), sample-rate code rateCode (and its explicit value), frame number
// num, followed by payload bytes of 0x00.
func flacFrame(bsCode, bsExtra, rateCode, rateExtra int, num uint32, payload int) []byte {
	h := []byte{0xFF, 0xF8, byte(bsCode<<4 | rateCode), 0x08} // mono, 16 bits
	switch {
	case num < 0x80:
		h = append(h, byte(num))
	case num < 0x800:
		h = append(h, 0xC0|byte(num>>6), 0x80|byte(num&0x3F))
	default:
		h = append(h, 0xE0|byte(num>>12), 0x80|byte(num>>6&0x3F), 0x80|byte(num&0x3F))
	}
	switch bsCode {
	case 6:
		h = append(h, byte(bsExtra-1))
	case 7:
		h = append(h, byte((bsExtra-1)>>8), byte(bsExtra-1))
	}
	switch rateCode {
	case 12:
		h = append(h, byte(rateExtra/1000))
	case 13:
		h = append(h, byte(rateExtra>>8), byte(rateExtra))
	case 14:
		h = append(h, byte(rateExtra/10>>8), byte(rateExtra/10))
	}
	h = append(h, testCRC8(h))
	return append(h, make([]byte, payload)...)
}

// testCRC8 is CRC-8/ATM computed the slow way.
func testCRC8(b []byte) byte {
	crc := 0
	for _, x := range b {
		for i := 7; i >= 0; i-- {
			bit := (crc>>7)&1 ^ int(x>>i)&1
			crc = crc << 1 & 0xFF
			if bit == 1 {
				crc ^= 0x07
			}
		}
	}
	return byte(crc)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// ksSubtypeTail is the end of the KSDATAFORMAT_SUBTYPE GUIDs of
// WAVE_FORMAT_EXTENSIBLE whose first two bytes are a WAVE format tag.
const ksSubtypeTail = "\x00\x00\x00\x00\x10\x00\x80\x00\x00\xAA\x00\x38\x9B\x71"
