package tests

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
)

// Costing is bounded work: a body whose costing would run past the bound
// is refused as over the cap (413 input_too_large), counted by reason in
// ratelimit_proxy_cost_limited_total, and never forwarded; the same
// dress on a small body is forwarded byte for byte.
func TestCostBoundEndToEnd(t *testing.T) {
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"MAX_INPUT_TOKENS": "100000"})

	// A multipart form of 20,000 tiny fields (2.6 MB of body, far more
	// parts than the budget of a MiB pays for).
	many, ct := formOf(20000)
	r := p.do(t, http.MethodPost, p.url("/api/chat"), many, "Content-Type", ct)
	wantStatus(t, r, http.StatusRequestEntityTooLarge)
	if !bytes.Contains(r.body, []byte("input_too_large")) {
		t.Fatalf("many parts: %s", r.body)
	}
	few, ct := formOf(3)
	before := rec.count()
	wantStatus(t, p.do(t, http.MethodPost, p.url("/api/chat"), few, "Content-Type", ct), 200)
	if rec.count() != before+1 || !bytes.Equal(rec.last(t).Body, few) {
		t.Fatalf("a small form was not forwarded as sent")
	}

	// A PDF with a stream inflating to 64 MiB, 64 KB sent.
	bomb := chatPDF(testpdf.Inflating(64 << 20))
	r = p.do(t, http.MethodPost, p.url("/v1/chat/completions"), bomb)
	wantStatus(t, r, http.StatusRequestEntityTooLarge)
	if rec.count() != before+1 {
		t.Fatalf("a refused body reached the upstream")
	}

	metrics := string(p.do(t, "GET", p.adminURL("/metrics"), nil).body)
	for _, want := range []string{
		`ratelimit_proxy_cost_limited_total{reason="multipart_parts"} 1`,
		`ratelimit_proxy_cost_limited_total{reason="pdf"} 1`,
		`ratelimit_proxy_cost_limited_total{reason="audio"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func formOf(fields int) ([]byte, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.WriteField("message", "hello")
	for i := 1; i < fields; i++ {
		w.WriteField(fmt.Sprintf("f%d", i), "x")
	}
	w.Close()
	return b.Bytes(), w.FormDataContentType()
}

func chatPDF(pdf []byte) []byte {
	return []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` +
		base64.StdEncoding.EncodeToString(pdf) + `"}}]}]}`)
}
