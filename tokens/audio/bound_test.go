package audio

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// TestSize: a meter is a few KiB, whatever it reads: the buffer and what
// each format needs to follow its streams (Ogg) or tracks (MP4, WebM).
func TestSize(t *testing.T) {
	if s := unsafe.Sizeof(Meter{}); s > 7<<10 {
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
	ogg, webm := oggBody(random), webmBody(random)
	for _, tc := range []struct {
		name       string
		head, body []byte
	}{
		{"mp3", nil, mp3},
		{"wav", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16}.body()), chunk{"data", nil, 0}), wav},
		{"flac", flacStream(44100, 0), random},
		{"random", []byte{0}, random},
		{"ID3 over everything", id3(nil, 1<<28-1), random},
		{"ogg opus", opusStream(1, nil), ogg},
		{"mp4 mdat", cat(ftyp, append(u32(1), "mdat"...), u64(16+size+1<<20)), random},
		{"webm opus", webmHead(), webm},
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

// oggBody is pages of Opus packets of 20 ms whose payloads are random.
func oggBody(random []byte) []byte {
	var pks [][]byte
	for i := 0; i+80 <= len(random)-1<<16; i += 80 {
		pks = append(pks, append([]byte{31 << 3}, random[i:i+79]...))
	}
	w := &oggWriter{serial: 1, seq: 2}
	return w.write(0, 0, 255, func(done int) int64 { return int64(done) * 960 }, pks...)
}

// webmHead starts a browser's recording: the Segment and a Cluster of
// unknown size.
func webmHead() []byte {
	return cat(ebmlHead, append(ebml(idSegment, -1, webmInfo(1000000, -1), webmTracksOf("A_OPUS")), ebml(idCluster, -1, ebmlUint(idTimecode, 0))...))
}

// webmBody is SimpleBlocks of Opus packets of 20 ms whose payloads are
// random.
func webmBody(random []byte) []byte {
	var b []byte
	for i := 0; i+80 <= len(random)-1<<16; i += 80 {
		b = append(b, simpleBlock(1, 0, 0x80, append([]byte{31 << 3}, random[i:i+79]...))...)
	}
	return b
}
