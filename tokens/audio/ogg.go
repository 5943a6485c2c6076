package audio

import "bytes"

// ogg reads Ogg pages (RFC 3533) whose CRC is good, of Opus and Vorbis
// streams (chained and multiplexed ones add up). Each audio packet counts
// the longest it can decode to: an Opus packet what its TOC byte says
// (RFC 6716 §3.1), a Vorbis packet half its long block, and it accounts
// for no more bytes than a packet of that length can take. Header
// packets are read where a decoder reads them; the Opus and Vorbis
// comment packets and the Vorbis setup packet are raw, as are pages of
// other streams, bad pages and bytes between pages.
func (r *reader) ogg() {
	var streams []*oggStream
	for p := 0; p < len(r.data) && r.ok(); {
		n, checked := oggPageLen(r.data[p:])
		r.steps += int64(checked / 2) // the CRC's work: a page may claim 64 KiB
		if n == 0 {
			i := bytes.Index(r.data[p+1:], []byte("OggS"))
			if i < 0 {
				break
			}
			p += 1 + i
			continue
		}
		streams = r.oggPage(p, n, streams)
		p += n
	}
	for _, s := range streams {
		r.addNs(s.samples, s.rate)
	}
}

// maxStreams bounds the streams followed; pages of more are raw.
const maxStreams = 16

// oggStream is one logical stream.
type oggStream struct {
	serial    uint32
	vorbis    bool  // else Opus
	rate      int64 // samples a second
	long      int64 // Vorbis: samples of a long block's packet
	maxPacket int64 // Vorbis: the most bytes an audio packet accounts for
	packets   int64 // packets begun
	samples   int64

	open  bool  // the last packet goes on in the next page
	audio bool  // the open packet is audio
	room  int64 // bytes the open packet may still account for
}

// oggPageLen is the length of the page at the start of b, 0 if b does not
// start with a whole page with a good CRC; checked is how many bytes the
// CRC was computed over.
func oggPageLen(b []byte) (n, checked int) {
	if len(b) < 27 || string(b[:4]) != "OggS" || b[4] != 0 || len(b) < 27+int(b[26]) {
		return 0, 0
	}
	n = 27 + int(b[26])
	for _, l := range b[27:n] {
		n += int(l)
	}
	if n > len(b) {
		return 0, 0
	}
	c := crc32Ogg(0, b[:22])
	c = crc32Ogg(c, []byte{0, 0, 0, 0})
	if crc32Ogg(c, b[26:n]) != le.Uint32(b[22:]) {
		return 0, n
	}
	return n, n
}

// oggPage reads the n-byte page at p and returns the streams.
func (r *reader) oggPage(p, n int, streams []*oggStream) []*oggStream {
	page := r.data[p : p+n]
	serial := le.Uint32(page[14:])
	var s *oggStream
	for _, t := range streams {
		if t.serial == serial {
			s = t
		}
	}
	lacing := page[27 : 27+int(page[26])]
	off := p + 27 + len(lacing)
	if s == nil && page[5]&2 != 0 && len(streams) < maxStreams && len(lacing) > 0 {
		first := r.data[off : off+int(min(lacing[0], 255))]
		if s = newOggStream(serial, first); s != nil {
			streams = append(streams, s)
		}
	}
	if s == nil {
		return streams // raw
	}
	r.account(p, off)
	if page[5]&1 == 0 {
		s.open = false
	}
	start := off
	for i, l := range lacing {
		off += int(l)
		if l == 255 && i < len(lacing)-1 {
			continue
		}
		if l == 0 && !s.open && s.packets >= 2 && !s.vorbis { // an empty Opus packet: lost, 120 ms
			s.packets++
			s.samples += 48 * 120
			continue
		}
		if !s.open {
			s.begin(r.data[start:off])
		}
		s.open = l == 255
		if s.audio {
			k := int(min(int64(off-start), s.room))
			r.account(start, start+k)
			s.room -= int64(k)
		}
		start = off
	}
	return streams
}

// newOggStream starts a stream on its first packet, nil if the codec is
// not one this package reads.
func newOggStream(serial uint32, b []byte) *oggStream {
	switch {
	case len(b) >= 19 && string(b[:8]) == "OpusHead" && b[8]&0xF0 == 0:
		return &oggStream{serial: serial, rate: 48000}
	case len(b) >= 30 && string(b[:7]) == "\x01vorbis" && b[29]&1 == 1:
		ch, rate, exp := int64(b[11]), int64(le.Uint32(b[12:])), b[28]>>4
		if ch == 0 || rate == 0 || exp < 6 || exp > 13 || b[28]&15 > exp {
			return nil
		}
		return &oggStream{serial: serial, vorbis: true, rate: rate, long: 1 << exp / 2, maxPacket: ch << exp * 2}
	}
	return nil
}

// begin starts a packet whose first bytes in this page are b: it counts
// its samples and sets what it may account for.
func (s *oggStream) begin(b []byte) {
	i := s.packets
	s.packets++
	s.audio, s.room = true, 0
	switch {
	case i == 0: // the identification header, which started the stream
		s.room = 300
	case !s.vorbis && i >= 2:
		frames, units := opusPacket(b)
		s.samples += units * 120
		s.room = 2 + frames*1277
	case s.vorbis && i >= 3 && (len(b) == 0 || b[0]&1 == 0):
		if len(b) > 0 {
			s.samples += s.long
		}
		s.room = s.maxPacket
	default: // comments, setup, or a header packet out of place: raw
		s.audio = false
	}
}

// opusPacket returns the frames of an Opus packet and its duration in
// units of 2.5 ms, from its TOC byte (a packet with none counts as lost:
// the most a packet lasts, 120 ms).
func opusPacket(b []byte) (frames, units int64) {
	if len(b) == 0 {
		return 0, 48
	}
	cfg := b[0] >> 3
	var per int64
	switch {
	case cfg < 12:
		per = [4]int64{4, 8, 16, 24}[cfg&3]
	case cfg < 16:
		per = [2]int64{4, 8}[cfg&1]
	default:
		per = [4]int64{1, 2, 4, 8}[cfg&3]
	}
	switch {
	case b[0]&3 == 0:
		frames = 1
	case b[0]&3 < 3:
		frames = 2
	case len(b) > 1 && b[1]&0x3F != 0:
		frames = int64(b[1] & 0x3F)
	default:
		frames = 48
	}
	return frames, min(frames*per, 48)
}

// oggCRC is the table of Ogg's CRC-32 (polynomial 0x04C11DB7, not
// reflected).
var oggCRC = func() (t [256]uint32) {
	for i := range t {
		c := uint32(i) << 24
		for range 8 {
			if c&0x80000000 != 0 {
				c = c<<1 ^ 0x04C11DB7
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc32Ogg(c uint32, b []byte) uint32 {
	for _, v := range b {
		c = c<<8 ^ oggCRC[byte(c>>24)^v]
	}
	return c
}
