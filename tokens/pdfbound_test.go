package tokens_test

import (
	"encoding/base64"
	"runtime"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// Costing a PDF is bounded work: at most 5 ms of CPU plus 25 ms per MiB
// of body and 64 MiB of memory beyond the body, whatever the PDF does (an
// object stream every font of a page lives in, thousands of pages, a
// stream that inflates a thousandfold). The time bound is checked at
// four times the contract (a shared, race-instrumented machine); the
// memory bound as allocated bytes.
func TestPDFCostingIsBounded(t *testing.T) {
	estimate(t, tokens.FormatChat, "application/json", `{"model":"gpt-4o","messages":[]}`, -1) // loads the encoding
	for name, data := range map[string][]byte{
		"object stream of 3000 fonts": testpdf.ObjStmFonts(3000, 1<<20),
		"6000 pages":                  testpdf.ManyPages(6000),
		"30 MiB inflation":            testpdf.Inflating(30 << 20),
	} {
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` +
			base64.StdEncoding.EncodeToString(data) + `"}}]}]}`
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		est := estimate(t, tokens.FormatChat, "application/json", body, 1<<30)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		for i := 0; i < 2 && took > 5*time.Millisecond; i++ { // the best of three: the CPU is shared
			start = time.Now()
			estimate(t, tokens.FormatChat, "application/json", body, 1<<30)
			took = min(took, time.Since(start))
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		bound := 4 * (5*time.Millisecond + time.Duration(float64(25*time.Millisecond)*float64(len(body))/(1<<20)))
		t.Logf("%s: %d-byte body, %d tokens in %v, %d KiB allocated", name, len(body), est.Tokens, took, alloc>>10)
		if took > bound && !raceOn {
			t.Errorf("%s: %v, over %v", name, took, bound)
		}
		if alloc > 64<<20 {
			t.Errorf("%s: allocated %d MiB", name, alloc>>20)
		}
	}
}
