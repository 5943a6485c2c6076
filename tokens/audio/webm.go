package audio

// EBML element IDs of Matroska and WebM that this package reads.
const (
	idTrackEntry  = 0xAE
	idTrackNumber = 0xD7
	idCodecID     = 0x86
	idDocType     = 0x4282
	idSimpleBlock = 0xA3
	idBlock       = 0xA1
)

// ebmlKind says how an element is read: 'm' a master, whose children
// follow (the walk is flat: nesting costs nothing), 'u' a number of at
// most 8 bytes, accounted for whole; 0 for strings, binaries and elements
// of other IDs (tags, attachments, Void, CodecPrivate), which are raw.
func ebmlKind(id uint64) byte {
	switch id {
	case 0x1A45DFA3, 0x18538067, 0x114D9B74, 0x4DBB, 0x1549A966, 0x1654AE6B, idTrackEntry, 0xE1, 0x1F43B675, 0xA0,
		0x1C53BB6B, 0xBB, 0xB7: // EBML header, Segment, SeekHead, Info, Tracks, Cluster, Cues and their masters
		return 'm'
	case 0x4286, 0x42F7, 0x42F2, 0x42F3, 0x4287, 0x4285, 0x53AB, 0x53AC, 0x2AD7B1, 0x4489, 0x4461,
		idTrackNumber, 0x73C5, 0x83, 0x9C, 0x56AA, 0x56BB, 0xB5, 0x9F, 0x6264, 0x88, 0xB9, 0x55AA, 0x23E383,
		0xE7, 0x9B, 0xFB, 0xA7, 0xAB, 0xB3, 0xF7, 0xF1, 0xF0, 0xB2, 0x5378:
		return 'u'
	}
	return 0
}

// ebml reads Matroska or WebM element by element. Blocks of Opus tracks
// count what their packet's TOC byte says (a laced block: 120 ms a
// frame) and account for the bytes such packets can take; blocks of other
// codecs are raw, since nothing in them bounds how long they play.
func (r *reader) ebml() {
	type track struct {
		number uint64
		opus   bool
	}
	var tracks []track
	if !ebmlHeader(r.data) {
		return // raw
	}
	for p := 0; p < len(r.data) && r.ok(); {
		id, n := ebmlVint(r.data[p:], true)
		size, m := ebmlVint(r.data[min(p+n, len(r.data)):], false)
		if n == 0 || m == 0 {
			return // the rest is raw
		}
		body := p + n + m
		end := body + int(min(size, uint64(len(r.data)-body)))
		switch kind := ebmlKind(id); {
		case kind == 'm':
			r.account(p, body)
			if id == idTrackEntry && len(tracks) < maxStreams {
				tracks = append(tracks, track{})
			}
			p = body
			continue
		case size == 1<<(7*m)-1:
			return // an unknown size is for masters only
		case kind == 'u' && end-body <= 8:
			r.account(p, end)
			if id == idTrackNumber && len(tracks) > 0 {
				tracks[len(tracks)-1].number = be.Uint64(append(make([]byte, 8-(end-body), 8), r.data[body:end]...))
			}
		case id == idCodecID && string(r.data[body:end]) == "A_OPUS" && len(tracks) > 0:
			tracks[len(tracks)-1].opus = true
			r.account(p, end)
		case id == idDocType && (string(r.data[body:end]) == "webm" || string(r.data[body:end]) == "matroska"):
			r.account(p, end)
		case id == idSimpleBlock || id == idBlock:
			num, k := ebmlVint(r.data[body:end], false)
			for _, t := range tracks {
				if k > 0 && t.number == num && t.opus && end-body >= k+3 {
					r.account(p, body+k+3)
					r.opusBlock(body+k+3, end, r.data[body+k+2]>>1&3 != 0)
					break
				}
			}
		}
		p = end
	}
}

// ebmlHeader reports whether b starts with an EBML header element whose
// body is all elements of the header.
func ebmlHeader(b []byte) bool {
	size, m := ebmlVint(b[4:], false)
	if m == 0 || size > 255 || int(size) > len(b)-4-m {
		return false
	}
	body := b[4+m : 4+m+int(size)]
	for len(body) > 0 {
		id, n := ebmlVint(body, true)
		size, m := ebmlVint(body[n:], false)
		if n != 2 || m == 0 || ebmlKind(id) != 'u' && id != idDocType || size > uint64(len(body)-n-m) {
			return false
		}
		body = body[n+m+int(size):]
	}
	return true
}

// opusBlock counts the Opus frames of a block's data[p:end].
func (r *reader) opusBlock(p, end int, laced bool) {
	frames, units := opusPacket(r.data[p:end])
	if laced && p < end {
		frames = int64(r.data[p]) + 1
		units = 48 * frames
	}
	r.account(p, p+int(min(int64(end-p), 8+frames*(2+48*1277))))
	r.addNs(units, 400) // 2.5 ms units
}

// ebmlVint reads a variable-length integer at the start of b: an element
// ID (with its marker bit, at most 4 bytes) or a size (without it, at
// most 8 bytes). It returns its length, 0 if there is none.
func ebmlVint(b []byte, isID bool) (uint64, int) {
	if len(b) == 0 || b[0] == 0 {
		return 0, 0
	}
	n := 1
	for b[0]<<(n-1)&0x80 == 0 {
		n++
	}
	if n > len(b) || isID && n > 4 {
		return 0, 0
	}
	v := uint64(b[0])
	if !isID {
		v &= 0xFF >> n
	}
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
	}
	return v, n
}
