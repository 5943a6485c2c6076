// Package audio measures the duration of an audio file from its bytes, fed
// in order and in pieces, so that a request's audio can be costed at the
// provider's audio rate without ever holding the file whole.
//
// The header is written by the client and the provider decodes what is
// really there, so every figure comes from the bytes actually present, never
// from a declared size or count alone (a declared duration only ever adds:
// the meter takes the most of it and of what it counts), and anything the
// meter cannot read as audio costs its size at 16 kbit/s. See
// Meter.Duration for the rules and the one exception.
package audio

import (
	"bytes"
	"encoding/binary"
	"io"
	"time"
)

var _ io.Writer = (*Meter)(nil)

// fallbackRate is what bytes cost when they cannot be read as audio of a
// known rate: 16 kbit/s, i.e. 2000 bytes a second (SPEC §4.6).
const fallbackRate = 2000

// floorRate bounds every format the meter reads from above (a 768 kHz,
// 256-channel, 64-bit WAV is under 1.6 GB/s): any non-empty input costs at
// least its size at this rate, so nothing written is ever free.
const floorRate = 1 << 31

// bufSize holds the longest run of bytes a decision waits for: an MPEG
// audio frame (2881 bytes at most) and the header after it.
const bufSize = 4096

// state is what the meter expects at buf[r].
type state uint8

const (
	stSniff       state = iota // start of stream or after a leading ID3 tag
	stTag                      // inside an ID3v2 or ID3v1 tag
	stWavChunk                 // a RIFF chunk header
	stWavFmt                   // the start of a fmt chunk's body
	stWavFree                  // header bytes that cost nothing (ds64)
	stWavSkip                  // a chunk body that is not audio
	stWavData                  // the data chunk, to the end of the stream
	stMpegSync                 // where an MPEG audio frame should start
	stMpegFrame                // an MPEG audio frame starting at buf[r]
	stMpegGarbage              // bytes between frames
	stFlacScan                 // FLAC metadata and frames
	stSkip                     // bytes passed over by count (MP4 boxes, EBML elements)
	stOgg                      // Ogg pages
	stMP4                      // an MP4 box header, or a table's entries
	stWebm                     // an EBML element header, or a block
)

// Meter measures the duration of one audio file written to it in order, in
// pieces of any size. Memory is bounded (a few KiB) whatever the file's
// size.
type Meter struct {
	buf  [bufSize]byte
	r, w int   // buf[r:w] is written but not yet consumed
	base int64 // stream offset of buf[0]
	n    int64 // bytes written
	st   state

	// afterTag is where an ID3 tag ends: stSniff at the start of the stream,
	// stMpegSync in MPEG audio.
	afterTag state
	tagEnd   int64 // stream offset where the current tag ends

	// MPEG audio.
	frameLen int   // length of the frame at buf[r] in stMpegFrame
	frameNs  int64 // MPEG frames counted, nanoseconds
	tagNs    int64 // MPEG headers found inside tags, nanoseconds
	garbage  int64 // bytes that are not audio, costed at fallbackRate

	// unknown is set when the bytes were not recognised: they cost the
	// most of their size at fallbackRate, the MPEG frames walked in them
	// and the FLAC frames found in them.
	unknown     bool
	unknownFrom int64

	// scan is set when FLAC frame headers are looked for in every byte
	// from buf[sc] on (bytes of an unknown format, Ogg).
	scan bool
	sc   int

	// stSkip: skip bytes are passed over, then the state is skipTo;
	// with skipJunk they cost fallbackRate.
	skip     int64
	skipTo   state
	skipJunk bool

	wav  wavState
	flac flacState
	ogg  oggState
	mp4  mp4State
	webm webmState
}

// NewMeter returns a meter; format is a hint ("wav", "mp3", a media type
// such as "audio/mpeg", or ""), the bytes decide when they are
// recognisable.
//
// The hint never changes the result: it is written by the same client as
// the bytes, every format the meter reads announces itself in its first
// bytes, and bytes it cannot read cost the same whatever they are called.
func NewMeter(format string) *Meter {
	_ = format
	return &Meter{}
}

// Write takes the next piece of the file. It never fails.
func (m *Meter) Write(p []byte) (int, error) {
	n := len(p)
	m.n += int64(n)
	for len(p) > 0 {
		if m.r == m.w {
			if k := m.skipDirect(p); k > 0 {
				p = p[k:]
				continue
			}
		}
		if m.w == len(m.buf) {
			m.compact()
		}
		k := copy(m.buf[m.w:], p)
		m.w += k
		p = p[k:]
		m.run(false)
	}
	return n, nil
}

// compact moves the bytes still needed to the front of the buffer.
func (m *Meter) compact() {
	lo := m.r
	if m.scan {
		lo = min(lo, m.sc)
		m.sc -= lo
	}
	m.base += int64(lo)
	m.w = copy(m.buf[:], m.buf[lo:m.w])
	m.r -= lo
}

// skipDirect consumes bytes that need no look-ahead straight from p,
// without copying them, and returns how many it took.
func (m *Meter) skipDirect(p []byte) int {
	switch m.st {
	case stWavData:
		m.base += int64(len(p))
		return len(p)
	case stWavSkip, stWavFree:
		k := m.wavTake(len(p))
		m.base += int64(k)
		return k
	case stSkip:
		if m.scan {
			return 0
		}
		k := int(min(int64(len(p)), m.skip))
		m.base += int64(k)
		m.skipped(k)
		return k
	}
	return 0
}

// startSkip passes over the next n bytes (math.MaxInt64: to the end of the
// stream), then goes to state then; with junk the bytes cost fallbackRate.
func (m *Meter) startSkip(n int64, then state, junk bool) {
	if n <= 0 {
		m.st = then
		return
	}
	m.skip, m.skipTo, m.skipJunk = n, then, junk
	m.st = stSkip
}

// skipped accounts for k bytes passed over in stSkip.
func (m *Meter) skipped(k int) {
	m.skip -= int64(k)
	if m.skipJunk {
		m.garbage += int64(k)
	}
	if m.skip == 0 {
		m.st = m.skipTo
	}
}

// run consumes what the bytes in buf[r:w] allow. With final set, the
// stream has ended and every pending decision is taken on what is there.
func (m *Meter) run(final bool) {
	for m.step(final) {
	}
	if m.scan {
		m.flacScan(&m.sc, final)
	}
}

// step takes one decision and reports whether it consumed bytes or
// changed state.
func (m *Meter) step(final bool) bool {
	switch m.st {
	case stSniff:
		return m.sniff(final)
	case stTag:
		return m.tag(final)
	case stWavChunk, stWavFmt, stWavFree, stWavSkip, stWavData:
		return m.wavStep(final)
	case stMpegSync:
		return m.mpegSync(final)
	case stMpegFrame:
		return m.mpegFrame(final)
	case stMpegGarbage:
		return m.mpegGarbage(final)
	case stFlacScan:
		return m.flacScan(&m.r, final)
	case stSkip:
		if m.r == m.w {
			return false
		}
		k := int(min(int64(m.w-m.r), m.skip))
		m.r += k
		m.skipped(k)
		return true
	case stOgg:
		return m.oggStep(final)
	case stMP4:
		return m.mp4Step(final)
	case stWebm:
		return m.webmStep(final)
	}
	return false
}

// sniff recognises the format from the first bytes (after any ID3 tags).
func (m *Meter) sniff(final bool) bool {
	b := m.buf[m.r:m.w]
	if len(b) < 12 && !final {
		return false
	}
	if len(b) == 0 {
		return false
	}
	if len(b) >= 10 {
		if n, ok := id3Len(b); ok {
			m.startTag(n, stSniff)
			return true
		}
	}
	if len(b) >= 12 && string(b[8:12]) == "WAVE" {
		switch string(b[:4]) {
		case "RIFF", "RF64", "BW64":
			m.r += 12
			m.wav.seen = true
			m.st = stWavChunk
			return true
		}
	}
	if bytes.HasPrefix(b, []byte("OggS\x00")) {
		m.startOgg()
		return true
	}
	if len(b) >= 4 && binary.BigEndian.Uint32(b) == ebmlHeaderID {
		m.webm.seen = true
		m.webm.from = m.base + int64(m.r)
		m.st = stWebm
		return true
	}
	if len(b) >= 8 && mp4Start(b) {
		m.mp4.seen = true
		m.mp4.from = m.base + int64(m.r)
		m.mp4.trak = -1
		m.mp4.traf = -1
		m.st = stMP4
		return true
	}
	if bytes.HasPrefix(b, []byte("fLaC")) {
		m.r += 4
		m.flac.meta = true
		m.flac.next = m.base + int64(m.r)
		m.st = stFlacScan
		return true
	}
	if len(b) >= 4 {
		if h, ok := mpegHeader(b); ok && h.size > 0 {
			m.st = stMpegSync
			return true
		}
	}
	m.startUnknown()
	return true
}

// startUnknown reads the bytes from buf[r] on as bytes of an unknown
// format.
func (m *Meter) startUnknown() {
	m.unknown = true
	m.unknownFrom = m.base + int64(m.r)
	m.scan = true
	m.sc = m.r
	m.st = stMpegGarbage
}

// startTag starts a tag of n bytes at buf[r]; next is the state after it.
func (m *Meter) startTag(n int64, next state) {
	m.tagEnd = m.base + int64(m.r) + n
	m.afterTag = next
	m.st = stTag
}

// tag skips a tag by its declared size. Its bytes cost nothing, but every
// MPEG audio header inside it counts as a frame: a tag that lies about its
// size cannot hide frames from the count, whatever a decoder makes of it.
func (m *Meter) tag(final bool) bool {
	end := m.tagEnd - m.base // may lie beyond the buffer
	lim := m.w - 3           // positions with a whole header behind them
	if final {
		lim = m.w
	}
	stop := int(min(end, int64(lim)))
	if stop > m.r {
		m.tagNs = addSat(m.tagNs, m.scanMPEG(m.r, stop))
		m.r = stop
	}
	if int64(m.r) >= end {
		m.st = m.afterTag
		return true
	}
	if final {
		m.r = m.w
	}
	return false
}

// Duration is the audio's duration: read from the container when the
// format is recognised, else the size at 16 kbit/s (2000 bytes a second).
// It is never less than what the bytes written so far can hold:
//
//   - WAV (RIFF, RF64, BW64; PCM, float, A-law, µ-law, also as
//     WAVE_FORMAT_EXTENSIBLE): every byte from the data chunk to the end of
//     the stream, whatever the chunk's size says, at sample rate × frame
//     size bytes a second, the frame size being the smaller of block align
//     and channels × sample bytes (or at the declared byte rate if that is
//     lower; with several fmt chunks, the lowest rate). Chunks before the
//     data cost their size at that rate too. MPEG audio in WAV is walked as MPEG
//     audio. With a compressed format, a fmt chunk of impossible values
//     (sample rate 0, block align 0…) or none before the data, the data
//     is read as bytes of an unknown format (below).
//   - MPEG audio (MP3, and MPEG-1/2/2.5 layers I and II): the sum of the
//     frames walked one by one, plus bytes between frames at 16 kbit/s. A
//     frame not followed by another frame (or a tag) has every MPEG header
//     inside it counted too, so a false frame cannot hide real ones. Free
//     format headers count their samples and their bytes.
//   - FLAC: every frame header (with a good CRC-8) anywhere in the stream,
//     at its block size and sample rate; the STREAMINFO total is not used.
//   - Ogg (Opus, Vorbis, FLAC, Speex; chained and multiplexed streams add
//     up): each stream lasts the most of its largest granule position and
//     of its packets counted one by one (Opus from each packet's TOC,
//     Vorbis from each packet's mode and the block sizes, Speex at its
//     header's frames a packet, FLAC from every frame header), less Opus's
//     pre-skip. Page CRCs are not checked: pages found inside other pages
//     count too, their packets as the longest a packet of the file can
//     be. Bytes in no page, and pages of streams of no known codec, cost
//     16 kbit/s on top.
//   - MP4, M4A, MOV, 3GP (ISO base media): the most of mvhd, mehd, and for
//     each track mdhd, its stts table plus its fragments' sample
//     durations, and for AAC its samples at 1024 a frame at the rate of its
//     AudioSpecificConfig; or, when that is more, the top-level boxes of
//     unknown types at 16 kbit/s. mdat is passed over by its size
//     wherever moov is. A file that declares no duration costs its size.
//   - Matroska and WebM: the most of Info's Duration (× TimecodeScale),
//     the last block's timestamp and the Opus blocks counted from their
//     TOC bytes (laced: the longest packet each), and bytes that cannot
//     be read or are in top-level elements of unknown types at 16
//     kbit/s; without a Duration, blocks of other codecs cost their size
//     at 16 kbit/s, and a file with nothing of these costs its size.
//   - ID3v2 tags (before any format, and between MPEG frames) and ID3v1
//     tags are skipped by their size; every MPEG header inside them counts.
//   - Anything else (AAC in ADTS, raw PCM…): the most of its size at 16
//     kbit/s, the MPEG frames walked in it and the FLAC frame headers found
//     in it.
//
// For MP4 and Matroska audio in codecs other than AAC (MP4) and Opus
// (Matroska), the duration is what the file declares: a decoder may play
// more than that.
//
// Duration may be called at any point; later bytes may lower it slightly
// (an MPEG frame followed by another is no longer suspected of hiding
// frames).
func (m *Meter) Duration() time.Duration {
	c := *m // finishing consumes the pending bytes: do it on a copy
	c.run(true)
	return c.total()
}

// total adds up the buckets of a finished meter.
func (m *Meter) total() time.Duration {
	walk := addSat(m.frameNs, bytesNs(m.garbage, fallbackRate))
	var d int64
	switch {
	case m.wav.seen:
		d = m.wav.ns(walk, m.flac.ns(), m.n)
	case m.ogg.seen:
		d = m.oggNs()
	case m.mp4.seen:
		d = m.mp4Ns()
	case m.webm.seen:
		d = m.webmNs()
	case m.unknown:
		d = max(walk, m.flac.ns(), bytesNs(m.n-m.unknownFrom, fallbackRate))
	case m.flac.meta:
		d = addSat(walk, m.flac.ns())
	default:
		d = walk
	}
	d = addSat(d, m.tagNs)
	d = max(d, bytesNs(m.n, floorRate))
	return time.Duration(d)
}

// Tokens converts a duration to input tokens at OpenAI's published rate
// for audio input, rounded up: user audio is 1 token per 100 ms
// (https://developers.openai.com/api/docs/guides/realtime-costs, "Audio
// tokens in user messages are 1 token per 100 ms of audio").
func Tokens(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	const per = 100 * time.Millisecond
	t := d / per
	if d%per != 0 {
		t++
	}
	return int(t)
}
