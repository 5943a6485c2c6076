package audio

import "math"

// wav reads a RIFF, RF64 or BW64 WAVE file: its fmt chunks give the
// lowest byte rate the samples can play at, and everything from the data
// chunk's body to the end of the file is samples, whatever the chunk's
// declared size (decoders of streamed WAV files read to the end). Chunks
// of other types (LIST, fact, JUNK…) are not read: they are raw.
func (r *reader) wav() {
	r.account(0, 12)
	rate := int64(math.MaxInt64) // lowest byte rate of the fmt chunks seen
	for p := 12; p+8 <= len(r.data) && r.ok(); {
		id, size := string(r.data[p:p+4]), int64(le.Uint32(r.data[p+4:]))
		body := p + 8
		end := body + int(min(size+size&1, int64(len(r.data)-body)))
		switch id {
		case "data":
			r.account(p, body)
			if rate == math.MaxInt64 {
				return // no usable fmt: the samples are raw
			}
			r.account(body, len(r.data))
			r.pcm = r.data[body:]
			r.pcmNs = mulDivCeil(int64(len(r.pcm)), 1e9, rate)
			return
		case "fmt ":
			if br := wavRate(r.data[body:end]); br > 0 {
				rate = min(rate, br)
				r.account(p, min(end, body+40))
			}
		case "ds64":
			if size >= 28 && size <= 64 {
				r.account(p, end)
			}
		}
		p = end
	}
}

// wavRate is the lowest byte rate a fmt chunk's samples play at, or 0 if
// they are not PCM of a kind every decoder reads (integer, float, A-law,
// µ-law, also as WAVE_FORMAT_EXTENSIBLE): the declared byte rate, or less
// when the sample rate times the frame size (the smaller of the block
// align and the channels' whole bytes) is less.
func wavRate(f []byte) int64 {
	if len(f) < 16 {
		return 0
	}
	tag := le.Uint16(f)
	if tag == 0xFFFE && len(f) >= 26 {
		tag = le.Uint16(f[24:])
	}
	if tag != 1 && tag != 3 && tag != 6 && tag != 7 {
		return 0
	}
	ch, sr, declared := int64(le.Uint16(f[2:])), int64(le.Uint32(f[4:])), int64(le.Uint32(f[8:]))
	align, depth := int64(le.Uint16(f[12:])), int64(le.Uint16(f[14:]))
	frame := ch * ((depth + 7) / 8)
	if align > 0 {
		frame = min(frame, align)
	}
	rate := sr * frame
	if declared > 0 {
		rate = min(rate, declared)
	}
	return rate
}
