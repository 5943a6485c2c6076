package pdf

import (
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
)

// limitsFor are the limits tokens/blob.go gives a PDF of n bytes.
func limitsFor(n int) Limits {
	return Limits{MaxDecoded: min(1<<20+8*int64(n), 48<<20), MaxSteps: 500_000 + 4*int64(n), MaxPages: 100}
}

// hostileCorpus is the benchmark's and the bound test's files.
func hostileCorpus() map[string][]byte {
	c := map[string][]byte{
		"objstm-3000-fonts":     testpdf.ObjStmFonts(3000, 1<<20),
		"objstm-3000-fonts-pad": testpdf.ObjStmFonts(3000, 0),
		"6000-pages":            testpdf.ManyPages(6000),
		"inflate-30MiB":         testpdf.Inflating(30 << 20),
		"bomb-1GiB-nested":      bombCases()["nested page content"],
	}
	for name, data := range hostileCases() {
		c[strings.ReplaceAll(name, " ", "-")] = data
	}
	content, _ := attackContent(800 << 10)
	d := newDoc()
	d.textPage(content, true)
	c["attack-800KB-text"] = d.bytes()
	return c
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHostile reads the hostile corpus under the limits the proxy
// gives each file, reporting CPU time (all threads, the collector's
// included) and bytes allocated per MiB of input. Worst figures measured
// (2 shared cores, go1.26, one run each): wide-array (2 MiB) 48.9 ms of CPU
// against a bound of 55 ms, 21.5 MB allocated (10 MB a MiB); deep-dicts
// (0.9 MiB) 25.5 ms against 26.5 ms, 10.7 MB; objstm-3000-fonts-pad 5.9 ms
// against 6.7 ms; 6000-pages 4.8 ms against 7.0 ms, 3.2 MB (38 MB a MiB:
// the fixed 1 MiB of MaxDecoded dominates small files); bombs ~1.6–2.8 ms.
func BenchmarkHostile(b *testing.B) {
	for name, data := range hostileCorpus() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			lim := limitsFor(len(data))
			start := cpuTime()
			for i := 0; i < b.N; i++ {
				Read(data, lim, func([]byte) error { return nil })
			}
			mib := float64(len(data)) / (1 << 20)
			o := readAllText(b, data, lim)
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N)/float64(o.steps), "ns/step")
			b.ReportMetric(5+25*mib, "bound-ms")
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N)/1e6, "cpu-ms/op")
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N)/1e6/mib, "cpu-ms/MiB")
			b.ReportMetric(float64(len(data)), "file-B")
		})
	}
}

// TestHostileCorpus: every hostile file ends in text or ErrBound within
// its limits, with little memory.
func TestHostileCorpus(t *testing.T) {
	for name, data := range hostileCorpus() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		o := readAllText(t, data, limitsFor(len(data)))
		runtime.ReadMemStats(&after)
		if o.err != nil && o.err != ErrBound {
			t.Errorf("%s: err %v", name, o.err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
			t.Errorf("%s: allocated %d MiB", name, alloc>>20)
		}
		if strings.HasPrefix(name, "bomb") || strings.HasPrefix(name, "inflate") {
			if o.err != ErrBound {
				t.Errorf("%s: err %v, want ErrBound", name, o.err)
			}
		}
		t.Logf("%s: %d bytes, err %v, pages %d, steps %d, raw %d, text %d, %v", name, len(data), o.err, o.res.Pages, o.steps, o.raw, len(o.text), o.took)
	}
}
