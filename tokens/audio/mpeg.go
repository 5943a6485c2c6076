package audio

import "bytes"

// MPEG audio frame headers (ISO/IEC 11172-3, 13818-3 and the MPEG 2.5
// extension):
//
//	AAAAAAAA AAABBCCD EEEEFFGH IIJJKLMM
//
// A sync, B version (00 2.5, 01 reserved, 10 MPEG-2, 11 MPEG-1), C layer
// (00 reserved, 01 III, 10 II, 11 I), E bitrate index, F sample-rate index,
// G padding. A header is valid when a decoder accepts it (FFmpeg's
// ff_mpa_check_header): bitrate index 15 and sample-rate index 3 are not.
// Bitrate index 0 is free format: the frame's length is not in the header.

// mpegBitrates is in kbit/s, by [MPEG-1?][layer I, II, III][index].
var mpegBitrates = [2][3][15]int32{
	{ // MPEG-2 and 2.5
		{0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256},
		{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160},
		{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160},
	},
	{ // MPEG-1
		{0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448},
		{0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384},
		{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320},
	},
}

var mpegRates = [3]int32{44100, 48000, 32000}

// frame is one frame's duration and length in bytes (0: free format).
type frame struct {
	ns   int64
	size int
}

// mpegHeader reads the frame header at b[:4].
func mpegHeader(b []byte) (frame, bool) {
	if b[0] != 0xFF || b[1]&0xE0 != 0xE0 {
		return frame{}, false
	}
	ver := b[1] >> 3 & 3
	layer := b[1] >> 1 & 3
	bri := b[2] >> 4
	sri := b[2] >> 2 & 3
	if ver == 1 || layer == 0 || bri == 15 || sri == 3 {
		return frame{}, false
	}
	rate := int64(mpegRates[sri])
	switch ver {
	case 2:
		rate /= 2
	case 0:
		rate /= 4
	}
	v1 := 0
	if ver == 3 {
		v1 = 1
	}
	l := 3 - int(layer) // 0: layer I, 1: II, 2: III
	samples, coef := int64(1152), int64(144)
	switch {
	case l == 0:
		samples, coef = 384, 12
	case l == 2 && v1 == 0:
		samples, coef = 576, 72
	}
	f := frame{ns: mulDivCeil(samples, 1e9, rate)}
	if bri == 0 {
		return f, true
	}
	pad := int64(b[2] >> 1 & 1)
	br := int64(mpegBitrates[v1][l][bri]) * 1000
	if l == 0 {
		f.size = int((coef*br/rate + pad) * 4)
	} else {
		f.size = int(coef*br/rate + pad)
	}
	return f, true
}

// id3Len returns the length of the ID3v2 tag that starts b[:10], as
// FFmpeg's ff_id3v2_match reads it.
func id3Len(b []byte) (int64, bool) {
	if b[0] != 'I' || b[1] != 'D' || b[2] != '3' || b[3] == 0xFF || b[4] == 0xFF ||
		(b[6]|b[7]|b[8]|b[9])&0x80 != 0 {
		return 0, false
	}
	n := 10 + (int64(b[6])<<21 | int64(b[7])<<14 | int64(b[8])<<7 | int64(b[9]))
	if b[5]&0x10 != 0 {
		n += 10 // footer
	}
	return n, true
}

// id3v1Len is the length of an ID3v1 tag ("TAG" and 125 bytes).
const id3v1Len = 128

// scanMPEG returns the duration of every MPEG audio header (free format
// included) starting in buf[from:to]; each needs its 4 bytes in buf[:w].
func (m *Meter) scanMPEG(from, to int) int64 {
	var ns int64
	for from < to {
		i := bytes.IndexByte(m.buf[from:to], 0xFF)
		if i < 0 {
			break
		}
		x := from + i
		if x+1 < m.w && m.buf[x+1] < 0xE0 { // not a sync
			from = x + 1
			continue
		}
		if y := ffRun(m.buf[:m.w], x); y > x {
			from = y
			continue
		}
		if x+4 <= m.w {
			if f, ok := mpegHeader(m.buf[x:]); ok {
				ns = addSat(ns, f.ns)
			}
		}
		from = x + 1
	}
	return ns
}

// ffRun returns, for b[x] == 0xFF, the first position from x on where an
// MPEG or FLAC header could start: none starts where the next two bytes
// are 0xFF too (FLAC's second byte is 0xF8 or 0xF9, and 0xFF as MPEG's
// third byte is bitrate index 15), so runs of 0xFF are passed over at once.
func ffRun(b []byte, x int) int {
	for x+2 < len(b) && b[x+1] == 0xFF && b[x+2] == 0xFF {
		x++
	}
	return x
}

// mpegSync is where a frame should start: a frame, a tag, or garbage.
func (m *Meter) mpegSync(final bool) bool {
	b := m.buf[m.r:m.w]
	if len(b) < 10 && !final {
		return false
	}
	if len(b) >= 4 {
		if f, ok := mpegHeader(b); ok && f.size > 0 {
			m.frameLen = f.size
			m.frameNs = addSat(m.frameNs, f.ns)
			m.st = stMpegFrame
			return true
		}
	}
	if len(b) >= 10 {
		if n, ok := id3Len(b); ok {
			m.startTag(n, stMpegSync)
			return true
		}
	}
	if len(b) >= 3 && string(b[:3]) == "TAG" {
		m.startTag(id3v1Len, stMpegSync)
		return true
	}
	if len(b) == 0 {
		return false
	}
	m.st = stMpegGarbage
	return true
}

// mpegFrame waits for the frame at buf[r] and the 4 bytes after it. A
// frame followed by a frame or a tag is taken as read. Any other frame may
// be a false header a decoder skips while it reads the frames inside, so
// every header inside it counts too.
func (m *Meter) mpegFrame(final bool) bool {
	end := m.r + m.frameLen
	if m.w < end+4 {
		if !final {
			return false
		}
		m.frameNs = addSat(m.frameNs, m.scanMPEG(m.r+1, min(end, m.w)))
		m.r = min(end, m.w)
		m.st = stMpegSync
		return true
	}
	if !follows(m.buf[end : end+4]) {
		m.frameNs = addSat(m.frameNs, m.scanMPEG(m.r+1, end))
	}
	m.r = end
	m.st = stMpegSync
	return true
}

// follows reports whether b starts a frame or a tag.
func follows(b []byte) bool {
	if _, ok := mpegHeader(b); ok {
		return true
	}
	s := string(b[:3])
	return s == "ID3" || s == "TAG"
}

// mpegGarbage looks for the next frame header. The bytes before it cost
// fallbackRate; a free-format header counts its samples and is passed over
// (its length is unknown).
func (m *Meter) mpegGarbage(final bool) bool {
	lim := m.w - 3
	if final {
		lim = m.w
	}
	for m.r < lim {
		i := bytes.IndexByte(m.buf[m.r:lim], 0xFF)
		if i < 0 {
			m.garbage += int64(lim - m.r)
			m.r = lim
			break
		}
		m.garbage += int64(i)
		m.r += i
		if m.r+1 < m.w && m.buf[m.r+1] < 0xE0 { // not a sync
			m.garbage++
			m.r++
			continue
		}
		if y := min(ffRun(m.buf[:m.w], m.r), lim); y > m.r {
			m.garbage += int64(y - m.r)
			m.r = y
			continue
		}
		if m.r+4 <= m.w {
			if f, ok := mpegHeader(m.buf[m.r:]); ok {
				if f.size > 0 {
					m.st = stMpegSync
					return true
				}
				m.frameNs = addSat(m.frameNs, f.ns)
			}
		}
		m.garbage++
		m.r++
	}
	return false
}
