package audio

import "bytes"

// mpeg reads MPEG audio (MP3, layers I and II of MPEG-1, 2 and 2.5): the
// ID3v2 tags at the start, then frame after frame, each frame whose
// header is valid and whose length fits in the file accounted for at its
// samples, provided another frame, an ID3v1 tag or the end of the file
// follows it (as a decoder confirms its sync). Bytes between frames are
// raw, and so is a last frame cut short, any tag after the frames (ID3v1,
// APE) and free-format frames, whose length the header does not give.
func (r *reader) mpeg() {
	p := 0
	for n := id3Len(r.data); n > 0 && r.ok(); n = id3Len(r.data[p:]) {
		r.id3(p, n)
		p += n
	}
	for p < len(r.data) && r.ok() {
		if h := mpegAt(r.data, p); h.size > 0 && h.size <= len(r.data)-p && mpegFollowed(r.data[p+h.size:]) {
			r.account(p, p+h.size)
			r.addNs(h.samples, h.rate)
			p += h.size
			continue
		}
		i := bytes.IndexByte(r.data[p+1:], 0xFF)
		if i < 0 {
			return
		}
		p += 1 + i
	}
}

// mpegFollowed reports whether what follows a frame confirms it.
func mpegFollowed(b []byte) bool {
	return len(b) == 0 || mpegAt(b, 0).size > 0 || bytes.HasPrefix(b, []byte("TAG"))
}

// id3Len is the length of the ID3v2 tag at the start of b (with its
// footer), 0 if there is none or it does not fit in b.
func id3Len(b []byte) int {
	if len(b) < 10 || string(b[:3]) != "ID3" || b[3] < 2 || b[3] > 4 || b[4] == 0xFF ||
		(b[6]|b[7]|b[8]|b[9])&0x80 != 0 {
		return 0
	}
	n := 10 + (int(b[6])<<21 | int(b[7])<<14 | int(b[8])<<7 | int(b[9]))
	if b[3] == 4 && b[5]&0x10 != 0 {
		n += 10
	}
	if n > len(b) {
		return 0 // a tag longer than the file is not one
	}
	return n
}

// id3 reads the n-byte tag at p: its header and the padding of zeros that
// ends it are accounted for; its frames (text, pictures) are raw.
func (r *reader) id3(p, n int) {
	r.account(p, p+10)
	body := r.data[p+10 : p+n]
	used := len(bytes.TrimRight(body, "\x00"))
	r.account(p+10+used, p+n)
}

// mpegHeader is what a frame header says of its frame.
type mpegHeader struct {
	size          int   // bytes, header included; 0: no valid frame
	samples, rate int64 // per channel
}

// kbps are the bit rates of ISO/IEC 11172-3 and 13818-3 by table (MPEG-1
// layers I, II, III; MPEG-2/2.5 layer I; MPEG-2/2.5 layers II and III)
// and index.
var kbps = [5][15]int64{
	{0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448},
	{0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384},
	{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320},
	{0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256},
	{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160},
}

// mpegAt reads the frame header at b[p:].
func mpegAt(b []byte, p int) mpegHeader {
	if len(b)-p < 4 || b[p] != 0xFF || b[p+1]&0xE0 != 0xE0 {
		return mpegHeader{}
	}
	ver, layer := b[p+1]>>3&3, 4-int(b[p+1]>>1&3) // ver 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
	bri, sri, pad := b[p+2]>>4, b[p+2]>>2&3, int64(b[p+2]>>1&1)
	if ver == 1 || layer == 4 || bri == 0 || bri == 15 || sri == 3 || b[p+3]&3 == 2 {
		return mpegHeader{}
	}
	rate := [3]int64{44100, 48000, 32000}[sri] >> (3 - ver) // MPEG-2 halves, 2.5 quarters
	if ver == 0 {
		rate = [3]int64{11025, 12000, 8000}[sri]
	}
	table := layer - 1
	if ver != 3 {
		table = min(3+layer-1, 4)
	}
	bps := kbps[table][bri] * 1000
	h := mpegHeader{rate: rate}
	switch {
	case layer == 1:
		h.samples, h.size = 384, int((12*bps/rate+pad)*4)
	case layer == 3 && ver != 3:
		h.samples, h.size = 576, int(72*bps/rate+pad)
	default:
		h.samples, h.size = 1152, int(144*bps/rate+pad)
	}
	return h
}
