package audio

import (
	"bytes"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// at is how long n bytes last at rate bytes a second, rounded up to the
// nanosecond, computed independently of the meter.
func at(n, rate int64) time.Duration {
	num := new(big.Int).Mul(big.NewInt(n), big.NewInt(1e9))
	q, r := new(big.Int).QuoRem(num, big.NewInt(rate), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return time.Duration(q.Int64())
}

// fallback is n bytes at 16 kbit/s.
func fallback(n int) time.Duration { return at(int64(n), 2000) }

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 0},
		{0, 0},
		{1, 1},
		{100 * time.Millisecond, 1},
		{100*time.Millisecond + 1, 2},
		{time.Second, 10},
		{time.Minute, 600},
		{time.Hour, 36000},
		{1<<63 - 1, int((1<<63-1)/int64(100*time.Millisecond) + 1)},
	} {
		if got := Tokens(tc.d); got != tc.want {
			t.Errorf("Tokens(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestEmptyAndUnknown(t *testing.T) {
	if d := measure(nil, 0); d != 0 {
		t.Errorf("empty: %v, want 0", d)
	}
	for _, b := range [][]byte{
		{0},
		[]byte("RIFF"),
		[]byte("OggS\x00\x02 this is not parsed"),
		bytes.Repeat([]byte("plain text, not audio. "), 1000),
	} {
		if d, want := measure(b, 0), fallback(len(b)); d != want {
			t.Errorf("%.12q…: %v, want %v (16 kbit/s)", b, d, want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	b[0] = 0 // not a frame header
	if d, want := measure(b, 0), fallback(len(b)); d < want || d > want*11/10 {
		t.Errorf("random bytes: %v, want about %v", d, want)
	}
}

// TestPieces is the property that the size of the pieces never changes
// the result: every stream of the tests, in pieces of every size.
func TestPieces(t *testing.T) {
	for name, b := range corpus() {
		whole := measure(b, 0)
		if whole <= 0 {
			t.Errorf("%s: %v", name, whole)
		}
		sizes := []int{len(b) - 1, len(b) / 2, 4093, 4096, 4099}
		for p := 1; p <= min(len(b), 700); p++ {
			sizes = append(sizes, p)
		}
		for _, p := range sizes {
			if p < 1 {
				continue
			}
			if got := measure(b, p); got != whole {
				t.Fatalf("%s in pieces of %d: %v, whole: %v", name, p, got, whole)
			}
		}
		// Random piece sizes, and Duration between pieces.
		rng := rand.New(rand.NewPCG(uint64(len(b)), 7))
		m := NewMeter("")
		for rest := b; len(rest) > 0; {
			k := min(1+rng.IntN(5000), len(rest))
			m.Write(rest[:k])
			rest = rest[k:]
			m.Duration()
		}
		if got := m.Duration(); got != whole {
			t.Fatalf("%s in random pieces: %v, whole: %v", name, got, whole)
		}
	}
}

// corpus is the streams of the tests, by name. The fuzz target starts from
// them too.
func corpus() map[string][]byte {
	pcm16 := wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16}
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	m8 := mpeg{ver: 0, layer: 3, kbps: 8, rate: 8000}
	return map[string][]byte{
		"wav":         riff("RIFF", ck("fmt ", pcm16.body()), ck("data", pcm(32000))),
		"wav-list":    riff("RIFF", ck("LIST", []byte("INFOISFT\x05\x00\x00\x00Lavf\x00")), ck("fmt ", pcm16.body()), ck("data", pcm(3001))),
		"wav-short":   riff("RIFF", ck("fmt ", pcm16.body()), chunk{"data", pcm(20000), 100}),
		"wav-stream":  riff("RIFF", ck("fmt ", pcm16.body()), chunk{"data", pcm(20000), 0xFFFFFFFF}),
		"wav-ext":     riff("RIFF", ck("fmt ", wavFmt{tag: 0xFFFE, ch: 2, rate: 48000, bits: 32, sub: 3}.body()), ck("data", pcm(9600))),
		"rf64":        riff("RF64", ck("ds64", make([]byte, 28)), ck("fmt ", pcm16.body()), chunk{"data", pcm(6400), 0xFFFFFFFF}),
		"wav-mp3":     riff("RIFF", ck("fmt ", wavFmt{tag: 0x55, ch: 1, rate: 44100, bits: 0, align: 1, byteRate: 16000}.body()), ck("data", m128.frames(10))),
		"wav-adpcm":   riff("RIFF", ck("fmt ", wavFmt{tag: 0x11, ch: 1, rate: 8000, bits: 4, align: 256}.body()), ck("data", pcm(4000))),
		"mp3":         m128.frames(40),
		"mp3-id3":     cat(id3(pcm(300), -1), m128.frames(20), []byte("TAG"), make([]byte, 125)),
		"mp3-mixed":   cat(mpeg{ver: 3, layer: 3, kbps: 320, rate: 32000}.bytes(), m8.frames(30)),
		"mp3-garbage": cat(pcm(77), m128.frames(5), pcm(1000), m8.frames(5), pcm(33)),
		"mp2":         mpeg{ver: 2, layer: 2, kbps: 160, rate: 16000}.frames(5),
		"mp1":         mpeg{ver: 3, layer: 1, kbps: 448, rate: 32000, pad: true}.frames(5),
		"flac":        flacStream(44100, 0, flacFrame(12, 0, 0, 0, 0, 100), flacFrame(12, 0, 9, 0, 1, 90), flacFrame(6, 100, 13, 11025, 2, 0)),
		"random":      pcm(5000),

		"ogg-opus":          opusStream(1, nil, opus20, opus60, opus2p5, opus120, opus20, opus20),
		"ogg-opus-declared": opusSmall,
		"ogg-opus-nested":   nestedOgg(),
		"ogg-opus-chained":  cat(opusStream(1, nil, repeat(opus120, 5)...), opusStream(2, func(int64) int64 { return -1 }, repeat(opus20, 5)...)),
		"ogg-vorbis": vorbisStream(3, 44100, 8, 11, vorbisSetupHeader(1, vorbisSetupOpts{rich: true, modes: []bool{false, true}}), 3,
			func(int) int64 { return -1 }, []byte{0, 1}, []byte{2, 3}, []byte{2, 3}, []byte{0, 1}),
		"ogg-flac": cat((&oggWriter{serial: 4}).write(2, 0, 255, func(int) int64 { return 0 }, flacOggHeader(44100)),
			(&oggWriter{serial: 4, seq: 1}).write(0, 4, 255, func(int) int64 { return 8192 }, flacFrame(12, 0, 9, 0, 0, 20), flacFrame(12, 0, 9, 0, 1, 20))),
		"ogg-speex": cat((&oggWriter{serial: 6}).write(2, 0, 255, func(int) int64 { return 0 }, speexHeader(16000, 320, 2), []byte("comments")),
			(&oggWriter{serial: 6, seq: 1}).write(0, 4, 255, func(int) int64 { return -1 }, repeat([]byte{1, 2, 3}, 20)...)),
		"m4a":            m4aSmall,
		"m4a-mdat-first": cat(ftyp, mdat(3000, true), box("moov", timeBox("mvhd", 1, 1000, 3600000), aacTrack(1, 44100, 1, lc44, 10, 10, 0))),
		"mp4-fragments": cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 0), aacTrack(1, 48000, 0, asc(2, 3, 0, 1, false), 0),
			box("mvex", fullBox("trex", 0, 0, u32(1), u32(1), u32(1024), u32(0), u32(0)))),
			box("moof", box("traf", fullBox("tfhd", 0, 0, u32(1)), fullBox("trun", 0, 0x301, u32(2), u32(0), u32(1024), u32(6), u32(1024), u32(6)))), mdat(12, false)),
		"webm": webmSmall,
		"webm-browser": cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, -1), webmTracksOf("A_OPUS"),
			webmCluster(-1, 0, 1, 20, repeat(opus20, 10)...), webmCluster(-1, 200, 1, 20, repeat(opus120, 5)...))),
	}
}
