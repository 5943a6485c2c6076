package audio

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// TestSize: a meter is a few KiB, whatever it reads.
func TestSize(t *testing.T) {
	if s := unsafe.Sizeof(Meter{}); s > 5<<10 {
		t.Errorf("a meter is %d bytes", s)
	}
}

// TestBounded writes 50 MB streams and checks that the meter allocates
// nothing on the way and keeps up.
func TestBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("50 MB streams")
	}
	const size = 50 << 20
	rng := rand.New(rand.NewPCG(3, 4))
	random := make([]byte, 1<<20)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	mp3 := m128.frames(1 << 20 / m128.size())
	wav := pcm(1 << 20)
	for _, tc := range []struct {
		name       string
		head, body []byte
	}{
		{"mp3", nil, mp3},
		{"wav", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16}.body()), chunk{"data", nil, 0}), wav},
		{"flac", flacStream(44100, 0), random},
		{"random", []byte{0}, random},
		{"ID3 over everything", id3(nil, 1<<28-1), random},
	} {
		m := NewMeter("")
		m.Write(tc.head)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		for n := 0; n < size; n += len(tc.body) {
			m.Write(tc.body)
		}
		d := m.Duration()
		elapsed := time.Since(start)
		runtime.ReadMemStats(&after)
		if allocs := after.Mallocs - before.Mallocs; allocs > 10 {
			t.Errorf("%s: %d allocations", tc.name, allocs)
		}
		if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<10 {
			t.Errorf("%s: %d bytes allocated", tc.name, grown)
		}
		if elapsed > 5*time.Second {
			t.Errorf("%s: %v for 50 MB", tc.name, elapsed)
		}
		t.Logf("%s: %v in %v", tc.name, d, elapsed)
	}
}
