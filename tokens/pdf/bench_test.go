package pdf

import (
	"fmt"
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
// (2 shared cores, go1.26): see the report in TestWorkIsBounded's comment.
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

func TestReportCorpus(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	for name, data := range hostileCorpus() {
		o := readAllText(t, data, limitsFor(len(data)))
		t.Logf("%s: %d bytes, err %v, pages %d, steps %d, raw %d, text %d, %v", name, len(data), o.err, o.res.Pages, o.steps, o.raw, len(o.text), o.took)
	}
	_ = fmt.Sprint
}
