package audio

import "encoding/binary"

// wavState is what the meter knows of a RIFF/WAVE file (also RF64 and BW64,
// whose sizes live in a ds64 chunk: the meter reads no size it could trust
// less than the bytes themselves, so they need nothing more).
type wavState struct {
	seen     bool
	left     int64 // bytes left in a stWavFree or stWavSkip run
	fmtNeed  int   // bytes of the fmt body read
	rest     int64 // bytes of the chunk after a fmt or ds64 head
	junk     int64 // bytes of chunks before the data
	linRate  int64 // smallest byte rate of a linear fmt chunk (0: none)
	other    bool  // a fmt chunk that is compressed or impossible
	mpeg     bool  // a fmt chunk of MPEG audio
	data     bool  // the data chunk has started
	dataFrom int64 // its stream offset
}

// fmtHead is how much of a fmt chunk is read (WAVE_FORMAT_EXTENSIBLE is 40);
// beyond it the chunk costs like any other.
const fmtHead = 64

// ksSubtypeTail is the end of the KSDATAFORMAT_SUBTYPE GUIDs of
// WAVE_FORMAT_EXTENSIBLE whose first two bytes are a WAVE format tag.
const ksSubtypeTail = "\x00\x00\x00\x00\x10\x00\x80\x00\x00\xAA\x00\x38\x9B\x71"

// wavStep reads chunks until the data chunk, which runs to the end of the
// stream: its declared size can lie small (the bytes after it are still
// there for a decoder that reads on, as FFmpeg does past the data chunk)
// or large (only the bytes present are counted).
func (m *Meter) wavStep(final bool) bool {
	w := &m.wav
	b := m.buf[m.r:m.w]
	switch m.st {
	case stWavChunk:
		if len(b) < 8 {
			if final && len(b) > 0 {
				w.junk += int64(len(b))
				m.r = m.w
				return true
			}
			return false
		}
		size := int64(binary.LittleEndian.Uint32(b[4:]))
		pad := size & 1
		m.r += 8
		switch string(b[:4]) {
		case "data":
			w.data = true
			w.dataFrom = m.base + int64(m.r)
			switch {
			case w.mpeg:
				m.st = stMpegSync
			case w.other || w.linRate == 0:
				// Compressed, impossible or no format: the data is
				// read like bytes of an unknown format.
				m.startUnknown()
			default:
				m.st = stWavData
			}
		case "fmt ":
			if size < 16 {
				w.other = true
				w.left = size + pad
				m.st = stWavSkip
				break
			}
			w.fmtNeed = int(min(size, fmtHead))
			w.rest = size + pad - int64(w.fmtNeed)
			m.st = stWavFmt
		case "ds64":
			w.left = min(size, fmtHead)
			w.rest = size + pad - w.left
			m.st = stWavFree
		default:
			w.left = size + pad
			m.st = stWavSkip
		}
		return true
	case stWavFmt:
		if len(b) < w.fmtNeed {
			if final && len(b) > 0 {
				w.junk += int64(len(b))
				m.r = m.w
				return true
			}
			return false
		}
		w.format(b[:w.fmtNeed])
		m.r += w.fmtNeed
		w.left = w.rest
		m.st = stWavSkip
		return true
	case stWavFree, stWavSkip:
		if len(b) == 0 {
			return false
		}
		m.r += m.wavTake(len(b))
		return true
	case stWavData:
		if len(b) == 0 {
			return false
		}
		m.r = m.w
		return true
	}
	return false
}

// wavTake consumes up to n bytes of a stWavFree or stWavSkip run and
// returns how many it took.
func (m *Meter) wavTake(n int) int {
	w := &m.wav
	k := int(min(int64(n), w.left))
	w.left -= int64(k)
	if m.st == stWavSkip {
		w.junk += int64(k)
	}
	if w.left == 0 {
		if m.st == stWavFree {
			w.left = w.rest
			m.st = stWavSkip
		} else {
			m.st = stWavChunk
		}
	}
	return k
}

// format reads a fmt chunk's body.
func (w *wavState) format(b []byte) {
	le := binary.LittleEndian
	tag := le.Uint16(b)
	ch := int64(le.Uint16(b[2:]))
	rate := int64(le.Uint32(b[4:]))
	byteRate := int64(le.Uint32(b[8:]))
	align := int64(le.Uint16(b[12:]))
	bits := int64(le.Uint16(b[14:]))
	if tag == 0xFFFE { // WAVE_FORMAT_EXTENSIBLE
		if len(b) < 40 || string(b[26:40]) != ksSubtypeTail {
			w.other = true
			return
		}
		tag = le.Uint16(b[24:])
	}
	switch tag {
	case 0x0050, 0x0055: // MPEG audio, MPEG layer III
		w.mpeg = true
		return
	case 0x0001, 0x0003, 0x0006, 0x0007: // PCM, IEEE float, A-law, µ-law
	default:
		w.other = true
		return
	}
	if rate == 0 || rate > 768000 || ch == 0 || ch > 256 || bits == 0 || bits > 64 || align == 0 {
		w.other = true
		return
	}
	// A decoder reads channels × sample bytes per frame; block align and
	// the declared byte rate are only claims. Whichever is smallest makes
	// the data last longest.
	frameSize := min(align, ch*((bits+7)/8))
	r := rate * frameSize
	if byteRate > 0 && byteRate < r {
		r = byteRate
	}
	if w.linRate == 0 || r < w.linRate {
		w.linRate = r
	}
}

// junkRate is what the chunks before the data cost. A decoder that reads
// the chunk structure differently (padding, sizes) reads them as samples:
// at the file's byte rate when it is linear, else at 16 kbit/s like any
// bytes of an unknown format.
func (w *wavState) junkRate() int64 {
	rate := w.linRate
	if rate == 0 || w.other || w.mpeg {
		rate = min(rate, fallbackRate)
		if rate == 0 {
			rate = fallbackRate
		}
	}
	return rate
}

// ns is the duration of a WAV file of n bytes. walk is what the MPEG
// walker found and flac the FLAC frames found in the data, when it was
// read as MPEG audio or as bytes of an unknown format. The data costs the
// most any of its fmt chunks makes of it.
func (w *wavState) ns(walk, flac, n int64) int64 {
	junk := bytesNs(w.junk, w.junkRate())
	if !w.data {
		return addSat(junk, walk)
	}
	size := n - w.dataFrom
	dn := walk
	if w.other || (w.linRate == 0 && !w.mpeg) {
		dn = max(dn, flac, bytesNs(size, fallbackRate))
	}
	if w.linRate > 0 {
		dn = max(dn, bytesNs(size, w.linRate))
	}
	return addSat(junk, dn)
}
