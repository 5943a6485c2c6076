// Package audio measures an upper bound of an audio file's duration from
// the frames actually present, so that a request's audio can be costed at
// the provider's audio rate.
//
// Each format is read by a small pull parser over the whole file (WAV,
// MPEG audio, FLAC, Ogg Opus and Vorbis, MP4/M4A AAC and Opus, WebM and
// Matroska Opus). A parser accounts only for the bytes whose structure it
// has checked: the headers it validated, the frames or packets it counted,
// the boxes and elements it walked. Every other byte is handed to the
// caller, in order, as raw bytes to be costed as text: a reader can only
// add to a cost, never hide bytes. The samples of a WAV file are valid
// audio whatever their bytes are; they are reported apart (Result.PCM) so
// that the caller can take the higher of their two readings.
//
// A duration is never read from a declared total (a header, a sample
// table's sum alone, a Matroska Duration): it is the sum over the frames
// present of the longest each frame can decode to.
package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"time"
)

// Limits bound the work of one Measure.
type Limits struct {
	// MaxSteps is the number of structures (frames, pages, packets,
	// boxes, elements, table entries) Measure may visit; past it, Measure
	// returns ErrBound. Every step consumes at least one byte of the file,
	// so len(data) steps are always enough; 0 means that many.
	MaxSteps int64
}

// Result is what Measure found.
type Result struct {
	// Duration bounds from above how long the accounted frames play,
	// PCM samples excluded.
	Duration time.Duration
	// PCM holds the sample bytes of a WAV data chunk (a sub-slice of the
	// input): valid audio whatever they are, so they can be read as text
	// just as well. They are accounted for; PCMDuration is their duration.
	PCM         []byte
	PCMDuration time.Duration
	// Accounted is the number of bytes accounted for (PCM included);
	// the other len(data)-Accounted bytes were handed to raw.
	Accounted int64
	// Steps is the work done, in the unit of Limits.MaxSteps.
	Steps int64
}

// ErrBound reports that Limits.MaxSteps was reached: the caller treats
// the file as over any token cap.
var ErrBound = errors.New("audio: over the work bound")

// Measure reads data as an audio file. Every byte it does not account
// for is handed to raw, in order, in one or more pieces (sub-slices of
// data, valid until raw returns); a file of no known format goes to raw
// whole. An error from raw stops Measure and is returned as is; the only
// other error is ErrBound. Measure never panics.
func Measure(data []byte, lim Limits, raw func([]byte) error) (Result, error) {
	r := &reader{data: data, raw: raw, maxSteps: lim.MaxSteps}
	if r.maxSteps <= 0 {
		r.maxSteps = int64(len(data))
	}
	r.sniff()
	r.flushNs()
	r.account(len(data), len(data)) // the rest is raw
	res := Result{
		Duration:    time.Duration(r.ns),
		PCM:         r.pcm,
		PCMDuration: time.Duration(r.pcmNs),
		Accounted:   r.accounted,
		Steps:       r.steps,
	}
	return res, r.err
}

// reader is one file being measured: its coverage record and its budget.
type reader struct {
	data []byte
	raw  func([]byte) error
	err  error

	pos       int // data[:pos] is decided: raw or accounted
	accounted int64
	dry       bool // a first walk that only reads (MP4): nothing is decided

	steps, maxSteps int64

	ns            int64 // duration of the accounted frames, in nanoseconds
	samples, rate int64 // samples at one rate not yet in ns
	pcm           []byte
	pcmNs         int64
}

// ok charges one step and reports whether reading may go on.
func (r *reader) ok() bool {
	if r.err != nil {
		return false
	}
	r.steps++
	if r.steps > r.maxSteps {
		r.err = ErrBound
		return false
	}
	return true
}

// account marks data[off:end] as accounted for; what lies between the
// last decided byte and off goes to raw. Parsers move forward: a range
// that starts before pos is cut to what is new.
func (r *reader) account(off, end int) {
	if r.dry {
		return
	}
	end = min(end, len(r.data))
	off = min(max(off, r.pos), end)
	if r.err == nil && off > r.pos {
		r.err = r.raw(r.data[r.pos:off])
	}
	r.accounted += int64(end - off)
	r.pos = end
}

// addNs adds n samples at rate Hz to the duration, rounded up. Runs of
// one rate are added up first: a division a frame would cost more than
// the frame's parsing.
func (r *reader) addNs(n, rate int64) {
	if rate != r.rate {
		r.flushNs()
		r.rate = rate
	}
	r.samples = addSat(r.samples, n)
}

func (r *reader) flushNs() {
	if r.samples > 0 && r.rate > 0 {
		r.ns = addSat(r.ns, mulDivCeil(r.samples, 1e9, r.rate))
	}
	r.samples = 0
}

// sniff recognises the format by its first bytes and reads the file.
func (r *reader) sniff() {
	b := r.data
	switch {
	case len(b) >= 12 && string(b[8:12]) == "WAVE" &&
		(string(b[:4]) == "RIFF" || string(b[:4]) == "RF64" || string(b[:4]) == "BW64"):
		r.wav()
	case bytes.HasPrefix(b, []byte("OggS")):
		r.ogg()
	case bytes.HasPrefix(b, []byte("fLaC")):
		r.flac()
	case bytes.HasPrefix(b, []byte("\x1a\x45\xdf\xa3")):
		r.ebml()
	case len(b) >= 8 && string(b[4:8]) == "ftyp":
		r.mp4()
	case bytes.HasPrefix(b, []byte("ID3")), len(b) >= 4 && mpegAt(b, 0).size > 0:
		r.mpeg()
	}
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

// mulDivCeil returns ⌈a×b/c⌉ for a, b ≥ 0 and c > 0, saturated at
// math.MaxInt64.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// addSat adds two non-negative numbers, saturated at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// mulSat returns a×b for a, b ≥ 0, saturated at math.MaxInt64.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

var (
	be = binary.BigEndian
	le = binary.LittleEndian
)
