package audio

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// realFiles are files made by real encoders (espeak-ng's voice, 2.12 s,
// through oggenc 1.4.2, opusenc 0.2 and FFmpeg 5.1's libvorbis, libopus,
// libspeex, AAC and FLAC encoders and its MP4, WebM and Ogg muxers), and
// how long they decode to (FFmpeg 5.1, decoded samples ÷ sample rate).
var realFiles = map[string]time.Duration{
	"oggenc.ogg":              at(33999, 16000),
	"ffmpeg-vorbis.ogg":       at(33999, 16000),
	"opusenc.opus":            at(101997, 48000),
	"ffmpeg-speex.spx":        at(34240, 16000),
	"ffmpeg-flac.oga":         at(4000, 8000),
	"ffmpeg-aac.m4a":          at(34816, 16000),
	"ffmpeg-aac-frag.mp4":     at(35840, 16000),
	"ffmpeg-opus.webm":        at(101997, 48000),
	"ffmpeg-opus-stream.webm": at(101997, 48000), // to a pipe: no sizes, no Duration
}

// TestRealFiles: real files cost what they decode to, or a little more
// (Opus's end trimming, Vorbis's first packet, AAC's priming), never less;
// Ogg files the same with every granule position erased.
func TestRealFiles(t *testing.T) {
	for name, want := range realFiles {
		b, err := os.ReadFile(filepath.Join("testdata", "real", name))
		if err != nil {
			t.Fatal(err)
		}
		got := measure(b, 0)
		within(t, name, got, want, 70*time.Millisecond)
		for _, p := range []int{1, 13, 4096} {
			if q := measure(b, p); q != got {
				t.Errorf("%s in pieces of %d: %v, whole %v", name, p, q, got)
			}
		}
		if string(b[:4]) == "OggS" {
			within(t, name+" without granules", measure(noGranules(b), 0), want, 70*time.Millisecond)
		}
	}
}

// noGranules sets every page's granule position to -1.
func noGranules(b []byte) []byte {
	out := append([]byte{}, b...)
	off := 0
	for _, p := range splitPages(b) {
		binary.LittleEndian.PutUint64(out[off+6:], ^uint64(0))
		off += len(p)
	}
	return out
}
