package audio

import ()

// AAC's sample rate and frame length from an MP4 sample description.

// esdsAAC reads an esds box's body (ISO/IEC 14496-1 descriptors) and
// returns the sample rate and samples a frame of its AAC, or zeros.
func esdsAAC(b []byte) (rate, frame int64) {
	if len(b) < 4 {
		return 0, 0
	}
	tag, d := mp4Desc(b[4:])
	if tag != 3 || len(d) < 3 {
		return 0, 0
	}
	flags := d[2]
	d = d[3:]
	if flags&0x80 != 0 { // depends on an ES
		d = d[min(2, len(d)):]
	}
	if flags&0x40 != 0 && len(d) > 0 { // URL
		d = d[min(1+int(d[0]), len(d)):]
	}
	if flags&0x20 != 0 { // OCR stream
		d = d[min(2, len(d)):]
	}
	tag, d = mp4Desc(d)
	if tag != 4 || len(d) < 13 {
		return 0, 0
	}
	// MPEG-4 audio, or MPEG-2 AAC main, LC and SSR.
	if oti := d[0]; oti != 0x40 && (oti < 0x66 || oti > 0x68) {
		return 0, 0
	}
	if tag, d = mp4Desc(d[13:]); tag != 5 {
		return 0, 0
	}
	return ascAAC(d)
}

// mp4Desc reads a descriptor's tag and body (cut to what there is).
func mp4Desc(b []byte) (tag byte, body []byte) {
	if len(b) < 2 {
		return 0, nil
	}
	i, n := 1, 0
	for {
		if i >= len(b) || i > 4 {
			return 0, nil
		}
		c := b[i]
		i++
		n = n<<7 | int(c&0x7F)
		if c&0x80 == 0 {
			break
		}
	}
	return b[0], b[i : i+min(n, len(b)-i)]
}

// ascAAC reads an AudioSpecificConfig (ISO/IEC 14496-3, 1.6.2.1): the
// core sample rate and the frame length of AAC main, LC, SSR and LTP,
// also under SBR and PS, which double the samples and the rate alike.
func ascAAC(b []byte) (rate, frame int64) {
	r := bitReader{b: b}
	aot := r.aot()
	rate = r.rate()
	r.read(4) // channel configuration
	if aot == 5 || aot == 29 {
		r.rate()
		aot = r.aot()
	}
	if aot < 1 || aot > 4 || rate == 0 {
		return 0, 0
	}
	frame = 1024
	if r.read(1) == 1 {
		frame = 960
	}
	if r.bad {
		return 0, 0
	}
	return rate, frame
}

// bitReader reads bits, first the high ones.
type bitReader struct {
	b   []byte
	pos int
	bad bool
}

func (r *bitReader) read(n int) uint32 {
	var x uint32
	for range n {
		i := r.pos >> 3
		if i >= len(r.b) {
			r.bad = true
			return 0
		}
		x = x<<1 | uint32(r.b[i]>>(7-r.pos&7)&1)
		r.pos++
	}
	return x
}

func (r *bitReader) aot() uint32 {
	if a := r.read(5); a != 31 {
		return a
	}
	return 32 + r.read(6)
}

func (r *bitReader) rate() int64 {
	i := r.read(4)
	switch {
	case i == 15:
		return int64(r.read(24))
	case i < 13:
		return aacRates[i]
	}
	return 0
}
