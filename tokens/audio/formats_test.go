package audio

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const prose = "Ignore the audio. These words are text, and text costs tokens.\n"

// opus20 is an Opus packet of one 20 ms CELT frame.
var opus20 = append([]byte{31 << 3}, bytes.Repeat([]byte{7}, 79)...)

// mp4File is an M4A of one AAC track (AudioSpecificConfig: LC at 16 kHz)
// with n samples of size bytes in one mdat after moov.
func mp4File(n, size int, mdat []byte) []byte {
	sizes := make([]byte, 0, 4*n)
	for range n {
		sizes = append(sizes, u32(uint32(size))...)
	}
	stbl := box("stbl",
		fullBox("stsd", 0, 0, u32(1), mp4a(0, 16000, esds(0x40, asc(2, 8, 0, 1, false)))),
		sttsBox(uint32(n), 1024),
		fullBox("stsc", 0, 0, u32(0)),
		fullBox("stsz", 0, 0, u32(0), u32(uint32(n)), sizes),
		fullBox("stco", 0, 0, u32(0)),
	)
	trak := box("trak",
		fullBox("tkhd", 0, 3, u32(0), u32(0), u32(1), make([]byte, 72)),
		box("mdia", timeBox("mdhd", 0, 16000, uint64(n)*1024),
			fullBox("hdlr", 0, 0, u32(0), []byte("soun"), []byte("SoundHandler\x00")),
			box("minf", box("smhd", make([]byte, 8)), stbl)))
	return cat(ftyp, box("moov", trak), box("mdat", mdat))
}

// TestFormats: each format's bound, and which bytes are raw.
func TestFormats(t *testing.T) {
	wav16 := wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16}
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	flacFrames := func(n int) []byte {
		var b []byte
		for i := range n {
			b = append(b, flacFrame(12, 0, 9, 0, uint32(i), 300)...) // 4096 samples at 44.1 kHz
		}
		return b
	}
	webm := func(pks ...[]byte) []byte {
		return cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, -1), webmTracksOf("A_OPUS"), webmCluster(-1, 0, 1, 20, pks...)))
	}
	for _, tc := range []struct {
		name     string
		b        []byte
		dur, pcm time.Duration
		raw      string // a run of bytes that must be raw
	}{
		{"wav", riff("RIFF", ck("fmt ", wav16.body()), ck("LIST", []byte(prose)), chunk{"data", pcm(32000), 0}), 0, time.Second, prose},
		{"wav, lower declared rate", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16, byteRate: 16000}.body()), ck("data", pcm(32000))), 0, 2 * time.Second, ""},
		{"wav, extensible float", riff("RF64", ck("fmt ", wavFmt{tag: 0xFFFE, ch: 2, rate: 8000, bits: 32, sub: 3}.body()), ck("data", pcm(64000))), 0, time.Second, ""},
		{"wav, compressed: raw", riff("RIFF", ck("fmt ", wavFmt{tag: 0x55, ch: 1, rate: 16000, bits: 16}.body()), ck("data", []byte(prose))), 0, 0, prose},
		{"wav, no fmt: raw", riff("RIFF", ck("data", []byte(prose))), 0, 0, prose},
		{"mp3", m128.frames(100), at(100*1152, 44100), 0, ""},
		{"mp3, ID3 tag text raw", cat(id3([]byte(prose+"\x00\x00\x00\x00"), -1), m128.frames(10)), at(10*1152, 44100), 0, prose},
		{"mp3, bytes between frames raw", cat(m128.frames(3), []byte(prose), m128.frames(3)), at(5*1152, 44100), 0, prose},
		{"mp3, a frame nothing follows is raw", cat(m128.frames(3), m128.bytes()[:4], []byte(strings.Repeat(prose, 10))), at(3*1152, 44100), 0, prose},
		{"flac", flacStream(44100, 0, flacFrames(10)), at(10*4096, 44100), 0, ""},
		{"flac, tags raw", cat([]byte("fLaC\x04\x00\x00\x40"), []byte(prose), flacStream(44100, 0, flacFrames(2))[4:]), at(2*4096, 44100), 0, prose},
		{"ogg opus", opusStream(1, nil, repeat(opus20, 50)...), time.Second, 0, "OpusTags"},
		{"ogg opus, code 3 packets of 3 frames", opusStream(1, nil, repeat(append([]byte{31<<3 | 3, 3}, make([]byte, 30)...), 10)...), 600 * time.Millisecond, 0, "OpusTags"},
		{"ogg vorbis", vorbisStream(1, 16000, 8, 11, []byte("\x05vorbis"+prose+"\x01"), 255, func(int) int64 { return 0 }, repeat([]byte{0, 1, 2}, 10)...), at(10*1024, 16000), 0, prose},
		{"mp4 aac", mp4File(100, 300, make([]byte, 30000)), at(100*1024, 16000), 0, "SoundHandler"},
		{"mp4 aac, mdat past the samples raw", mp4File(10, 300, cat(make([]byte, 3000), []byte(prose))), at(10*1024, 16000), 0, prose[:8]},
		{"webm opus", webm(repeat(opus20, 50)...), time.Second, 0, "OpusHead"},
	} {
		m := measure(t, tc.b)
		if m.Duration < tc.dur || m.Duration > tc.dur+time.Millisecond || m.PCMDuration != tc.pcm {
			t.Errorf("%s: %v and PCM %v, want %v and %v", tc.name, m.Duration, m.PCMDuration, tc.dur, tc.pcm)
		}
		if i := bytes.Index(tc.b, []byte(tc.raw)); tc.raw != "" && (i < 0 || !m.isRaw(i, i+len(tc.raw))) {
			t.Errorf("%s: %q is not raw", tc.name, tc.raw)
		}
		if tc.raw == "" && m.Accounted != int64(len(tc.b)) {
			t.Errorf("%s: %d of %d bytes raw: %q", tc.name, int64(len(tc.b))-m.Accounted, len(tc.b), m.rawBytes())
		}
	}
}

// TestSignatureThenProse: after a format's signature, prose is raw.
func TestSignatureThenProse(t *testing.T) {
	text := strings.Repeat(prose, 1500)
	for _, sig := range []string{"ID3", "ID3\x04\x00\x00", "RIFF", "RIFF\x00\x00\x00\x00WAVE", "OggS", "fLaC", "\x1aE\xdf\xa3",
		string(ftyp), "\xff\xfb\x90\xc4", string(ebmlHead), "OggS\x00\x02" + strings.Repeat("\x00", 21)} {
		m := measure(t, []byte(sig+text))
		if !m.isRaw(len(sig), len(sig)+len(text)) || m.Duration != 0 {
			t.Errorf("%q: %d bytes accounted, %v", sig, m.Accounted, m.Duration)
		}
	}
}

// TestBound: the step budget stops a reading with ErrBound, and raw's
// error stops it as is.
func TestBound(t *testing.T) {
	b := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}.frames(100)
	if _, err := Measure(b, Limits{MaxSteps: 10}, func([]byte) error { return nil }); err != ErrBound {
		t.Errorf("10 steps for 100 frames: %v", err)
	}
	stop := bytes.ErrTooLarge
	if _, err := Measure(cat(b[:417], []byte(prose), b), Limits{}, func([]byte) error { return stop }); err != stop {
		t.Errorf("raw's error: %v", err)
	}
}
