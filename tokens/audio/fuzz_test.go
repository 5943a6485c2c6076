package audio

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// seeds are small files of every format, whole and cut.
func seeds(t testing.TB) [][]byte {
	out := [][]byte{
		riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 8000, bits: 8}.body()), ck("data", pcm(300))),
		mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}.frames(3),
		cat(id3([]byte("TIT2\x00\x00\x00\x03\x00\x00\x00hi\x00\x00"), -1), mpeg{ver: 2, layer: 2, kbps: 8, rate: 16000}.frames(3)),
		flacStream(44100, 0, flacFrame(12, 0, 9, 0, 0, 50), flacFrame(6, 100, 12, 8000, 1, 50)),
		opusStream(1, nil, repeat(opus20, 5)...),
		vorbisStream(1, 16000, 8, 11, []byte("\x05vorbis\x01"), 255, func(int) int64 { return 0 }, repeat([]byte{0, 1}, 5)...),
		mp4File(5, 30, make([]byte, 150)),
		cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, -1), webmTracksOf("A_OPUS"), webmCluster(-1, 0, 1, 20, repeat(opus20, 3)...))),
	}
	names, _ := filepath.Glob(filepath.Join("testdata", "real", "*"))
	sort.Strings(names)
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b[:min(len(b), 1500)])
	}
	return out
}

// FuzzMeasure: Measure never panics, hands out raw pieces in order that
// with the accounted bytes make up the input (measure checks it), stays
// within len(data) steps, and gives the same answer twice.
func FuzzMeasure(f *testing.F) {
	for _, b := range seeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := measure(t, b)
		if m.Steps > int64(len(b)) {
			t.Fatalf("%d steps for %d bytes", m.Steps, len(b))
		}
		if again := measure(t, b); again.Result.Duration != m.Duration || again.Accounted != m.Accounted {
			t.Fatalf("two readings: %+v, %+v", m.Result, again.Result)
		}
	})
}

// TestMutations is the fuzz property over seeds with random bytes
// changed, inserted and cut, for the runs without -fuzz.
func TestMutations(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, seed := range seeds(t) {
		for range 300 {
			b := append([]byte(nil), seed...)
			for range 1 + rng.IntN(4) {
				switch i := rng.IntN(len(b) + 1); rng.IntN(3) {
				case 0:
					if i < len(b) {
						b[i] = byte(rng.Uint32())
					}
				case 1:
					b = append(b[:i], append([]byte{byte(rng.Uint32())}, b[i:]...)...)
				default:
					b = b[:i]
				}
			}
			if m := measure(t, b); m.Steps > int64(len(b)) {
				t.Fatalf("%d steps for %d bytes", m.Steps, len(b))
			}
		}
	}
	random := make([]byte, 1<<16)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	measure(t, random)
}
