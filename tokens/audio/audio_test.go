package audio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"
)

// measured is what Measure returned, with the raw pieces it handed out.
type measured struct {
	Result
	raw  [][]byte
	offs []int // each raw piece's offset in the input
	err  error
}

// measure runs Measure with the default limits and checks the coverage
// record: raw pieces are sub-slices of the input, in order, disjoint, and
// with the accounted bytes they make up the whole input.
func measure(t testing.TB, b []byte) measured {
	t.Helper()
	var m measured
	m.Result, m.err = Measure(b, Limits{}, func(p []byte) error {
		m.raw = append(m.raw, p)
		m.offs = append(m.offs, offsetIn(b, p))
		return nil
	})
	if m.err != nil {
		t.Fatalf("Measure: %v", m.err)
	}
	var rawN int64
	last := 0
	for i, p := range m.raw {
		if len(p) == 0 || m.offs[i] < last {
			t.Fatalf("raw piece %d (%d bytes at %d) is empty or out of order (after %d)", i, len(p), m.offs[i], last)
		}
		last = m.offs[i] + len(p)
		rawN += int64(len(p))
	}
	if rawN+m.Accounted != int64(len(b)) {
		t.Fatalf("raw %d + accounted %d != %d bytes", rawN, m.Accounted, len(b))
	}
	if m.Duration < 0 || m.PCMDuration < 0 {
		t.Fatalf("negative duration: %+v", m.Result)
	}
	return m
}

// offsetIn is p's offset in b; p must be a sub-slice of b.
func offsetIn(b, p []byte) int {
	if len(p) == 0 {
		return 0
	}
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(p))) - uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	if off < 0 || off+len(p) > len(b) {
		panic("a raw piece outside the input")
	}
	return off
}

// rawBytes is the raw pieces joined.
func (m measured) rawBytes() []byte { return bytes.Join(m.raw, nil) }

// isRaw reports whether b[from:to] was handed out raw whole.
func (m measured) isRaw(from, to int) bool {
	for i, p := range m.raw {
		if m.offs[i] <= from && to <= m.offs[i]+len(p) {
			return true
		}
	}
	return from == to
}

func at(samples, rate int64) time.Duration {
	return time.Duration(samples * int64(time.Second) / rate)
}

// realFiles are files made by real encoders (espeak-ng's voice, 2.12 s,
// through oggenc 1.4.2, opusenc 0.2 and FFmpeg 5.1's libvorbis, libopus,
// libspeex, AAC and FLAC encoders and its MP4, WebM and Ogg muxers), how
// long they decode to (FFmpeg 5.1, decoded samples ÷ sample rate), and
// the most the bound may exceed that by.
var realFiles = map[string]struct{ want, slack time.Duration }{
	"oggenc.ogg":              {at(33999, 16000), 100 * time.Millisecond}, // every packet a long block
	"ffmpeg-vorbis.ogg":       {at(33999, 16000), 100 * time.Millisecond},
	"opusenc.opus":            {at(101997, 48000), 40 * time.Millisecond}, // pre-skip and end trimming
	"ffmpeg-aac.m4a":          {at(34816, 16000), 300 * time.Millisecond}, // 1024 a frame, priming included
	"ffmpeg-aac-frag.mp4":     {at(35840, 16000), 300 * time.Millisecond},
	"ffmpeg-opus.webm":        {at(101997, 48000), 40 * time.Millisecond},
	"ffmpeg-opus-stream.webm": {at(101997, 48000), 40 * time.Millisecond}, // to a pipe: no sizes
}

// TestRealFiles: real files cost at least what they decode to, and not
// much more; what is raw is their metadata (tags, Vorbis's setup), a
// small part of the file.
func TestRealFiles(t *testing.T) {
	for name, f := range realFiles {
		b, err := os.ReadFile(filepath.Join("testdata", "real", name))
		if err != nil {
			t.Fatal(err)
		}
		m := measure(t, b)
		if m.Duration < f.want || m.Duration > f.want+f.slack {
			t.Errorf("%s: %v, decodes to %v (slack %v)", name, m.Duration, f.want, f.slack)
		}
		raw := len(b) - int(m.Accounted)
		t.Logf("%s: %v for %v; %d of %d bytes raw", name, m.Duration, f.want, raw, len(b))
		if raw > len(b)/2 {
			t.Errorf("%s: %d of %d bytes raw", name, raw, len(b))
		}
	}
	// Codecs this package does not read are raw whole but their headers.
	for _, name := range []string{"ffmpeg-speex.spx", "ffmpeg-flac.oga"} {
		b, err := os.ReadFile(filepath.Join("testdata", "real", name))
		if err != nil {
			t.Fatal(err)
		}
		if m := measure(t, b); m.Accounted != 0 || m.Duration != 0 {
			t.Errorf("%s: %+v", name, m.Result)
		}
	}
}
