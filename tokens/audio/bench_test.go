package audio

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// hostile are 1 MiB inputs built to make a reader work hardest per byte.
func hostile() map[string][]byte {
	const size = 1 << 20
	fill := func(head, unit []byte) []byte {
		b := append([]byte(nil), head...)
		for len(b) < size {
			b = append(b, unit...)
		}
		return b[:size]
	}
	rng := rand.New(rand.NewPCG(5, 6))
	random := make([]byte, size)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	// A FLAC frame header of a 192-sample block with nothing after it.
	tiny := flacFrame(1, 0, 4, 0, 0, 0)
	zeroPage := oggPage(1, 0, 0, 0, nil, nil)
	emptyPackets := oggPage(1, 0, 0, 0, make([]byte, 255), nil)
	nest := bytes.Repeat([]byte{0x18, 0x53, 0x80, 0x67, 0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, 1)
	stsz := fullBox("stsz", 0, 0, u32(0), u32(size/4-64), make([]byte, size-256))
	return map[string][]byte{
		"mp3 of 24-byte frames":   fill(nil, mpeg{ver: 2, layer: 3, kbps: 8, rate: 24000}.bytes()),
		"mp3 sync everywhere":     fill([]byte{0xFF, 0xFB, 0x90, 0xC4}, []byte{0xFF}),
		"flac header-only frames": fill(flacStream(8000, 0), tiny),
		"flac sync everywhere":    fill(flacStream(8000, 0), []byte{0xFF, 0xF8}),
		"ogg empty pages":         fill(opusStream(1, nil), zeroPage),
		"ogg 255 empty packets":   fill(opusStream(1, nil), emptyPackets),
		"ogg CRC-less pages":      fill(nil, []byte("OggS\x00")),
		"mp4 8-byte boxes":        fill(ftyp, box("free")),
		"mp4 deep containers":     fill(ftyp, []byte("\x00\x00\x00\x08moov")),
		"mp4 huge stsz":           cat(ftyp, box("moov", box("trak", box("mdia", box("minf", box("stbl", fullBox("stsd", 0, 0, u32(1), mp4a(0, 16000, esds(0x40, asc(2, 8, 0, 1, false)))), stsz)))))),
		"mp4 huge declared size":  fill(ftyp, cat(u32(1), []byte("mdat"), u64(1<<62))),
		"ebml deep nesting":       fill(ebmlHead, nest),
		"ebml tiny elements":      fill(cat(ebmlHead, webmTracksOf("A_OPUS")), []byte{0xE7, 0x80}),
		"webm 2-byte opus blocks": fill(cat(ebmlHead, webmTracksOf("A_OPUS")), []byte{0xA3, 0x85, 0x81, 0, 0, 0x80, 0xFB}),
		"wav":                     fill(riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 8000, bits: 8}.body()), chunk{"data", nil, 0}), random),
		"random":                  random,
		"ID3 then random":         cat([]byte("ID3\x04\x00\x00\x00\x00\x00\x00"), random),
	}
}

// BenchmarkHostile reports the work per MiB of hostile inputs; the
// contract allows 25 ms of CPU per MiB for all of a request's costing.
func BenchmarkHostile(b *testing.B) {
	for name, in := range hostile() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				if _, err := Measure(in, Limits{}, func([]byte) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(float64(len(in))/(1<<20)), "ns/MiB")
		})
	}
}

// TestHostileFast checks the bound in a test run: no hostile input takes
// more than 25 ms of CPU a MiB (CPU time of the thread, best of 3: the
// machine may be shared).
func TestHostileFast(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("timing")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for name, in := range hostile() {
		best := time.Duration(1 << 62)
		for range 3 {
			start := threadCPU()
			const runs = 5
			for range runs {
				Measure(in, Limits{}, func([]byte) error { return nil })
			}
			best = min(best, (threadCPU()-start)/runs*(1<<20)/time.Duration(len(in)))
		}
		t.Logf("%s: %v a MiB", name, best)
		if best > 25*time.Millisecond {
			t.Errorf("%s: %v a MiB", name, best)
		}
	}
}

// threadCPU is the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil { // RUSAGE_THREAD
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
