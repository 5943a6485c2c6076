package tests

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
)

// End-to-end checks of SPEC §4.6 through the real binary: a prompt far
// over MAX_INPUT_TOKENS never reaches the upstream however it is dressed,
// and the same dress on a small prompt reaches it byte for byte.

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestTokenCapSeesThroughDisguises(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"MAX_INPUT_TOKENS": "2000", "CHAT_RPM": "1000"})
	big := strings.Repeat("Ignore the cap and read all of this carefully. ", 1500)
	var lines strings.Builder
	for i := 0; lines.Len() < 80<<10; i++ {
		fmt.Fprintf(&lines, "clause %d binds party %d to deliver item %d\n", i, i%7, i*31%1000)
	}
	pdf64 := func(text string) string { return base64.StdEncoding.EncodeToString(testpdf.OnePage(text)) }
	dresses := []struct {
		name, path string
		body       func(small bool) string
	}{
		{"anthropic document, text source", "/v1/messages", func(small bool) string {
			return `{"model":"claude-sonnet-4","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","title":"t","source":{"type":"text","media_type":"text/plain","data":` + jsonString(pick(small, "a note", big)) + `}}]}]}`
		}},
		{"anthropic PDF, 2 KB compressed", "/v1/messages", func(small bool) string {
			return `{"model":"claude-sonnet-4","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf64(pick(small, "Invoice 42", lines.String())) + `"}}]}]}`
		}},
		{"openai file part, PDF", "/v1/chat/completions", func(small bool) string {
			return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + pdf64(pick(small, "Invoice 42", lines.String())) + `"}}]}]}`
		}},
		{"response_format schema", "/v1/chat/completions", func(small bool) string {
			return `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":{"description":` + jsonString(pick(small, "a reply", big)) + `}}}}`
		}},
		{"member name folded", "/v1/chat/completions", func(small bool) string {
			return `{"model":"gpt-4o","meſſages":[{"role":"user","content":` + jsonString(pick(small, "hi", big)) + `}]}`
		}},
		{"responses reasoning summary", "/v1/responses", func(small bool) string {
			return `{"model":"gpt-4.1","input":[{"type":"reasoning","summary":[{"type":"summary_text","text":` + jsonString(pick(small, "hi", big)) + `}]}]}`
		}},
		{"legacy suffix", "/v1/completions", func(small bool) string {
			return `{"model":"gpt-3.5-turbo-instruct","prompt":"a","suffix":` + jsonString(pick(small, "b", big)) + `}`
		}},
		{"/api/chat history", "/api/chat", func(small bool) string {
			return `{"message":"hi","history":[{"role":"user","content":` + jsonString(pick(small, "earlier", big)) + `}]}`
		}},
		{"emoji for another provider's model", "/v1/chat/completions", func(small bool) string {
			return `{"model":"llama-3.1-8b","messages":[{"role":"user","content":` + jsonString(pick(small, "😀", strings.Repeat("😀", 6900))) + `}]}`
		}},
	}
	for _, d := range dresses {
		before := rec.count()
		r := p.do(t, "POST", p.url(d.path), []byte(d.body(false)))
		if r.StatusCode != 413 || r.json(t)["max_input_tokens"] == nil {
			t.Errorf("%s, over the cap: %d %s", d.name, r.StatusCode, r.body)
		}
		if rec.count() != before {
			t.Errorf("%s: the over-cap request reached the upstream", d.name)
		}
		small := []byte(d.body(true))
		r = p.do(t, "POST", p.url(d.path), small)
		if r.StatusCode != 200 {
			t.Errorf("%s, small: %d %s", d.name, r.StatusCode, r.body)
			continue
		}
		if got := rec.last(t); !bytes.Equal(got.Body, small) {
			t.Errorf("%s: the small request was altered on its way upstream", d.name)
		}
	}
}

func TestDuplicateModelIsRefused(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), nil)
	r := p.do(t, "POST", p.url("/v1/chat/completions"), []byte(`{"model":"llama-3","messages":[{"role":"user","content":"hi"}],"Model":"gpt-4"}`))
	wantStatus(t, r, 400)
	if m := r.json(t); field(m, "error", "code") != "invalid_request" || !strings.Contains(fmt.Sprint(field(m, "error", "message")), `duplicate member "model"`) {
		t.Fatalf("%s", r.body)
	}
	if rec.count() != 0 {
		t.Fatal("the ambiguous request reached the upstream")
	}
}

func pick(small bool, a, b string) string {
	if small {
		return a
	}
	return b
}
