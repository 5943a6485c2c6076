package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// send posts body with contentType; chunked hides the length so the
// client sends it chunked.
func (p *proc) send(t *testing.T, path, contentType string, body []byte, chunked bool) *response {
	t.Helper()
	var rd io.Reader = bytes.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // unknown length: Transfer-Encoding: chunked
	}
	req, err := http.NewRequest(http.MethodPost, p.url(path), rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &response{Response: resp, body: b}
}

func TestBodyCapAtTheBoundary(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"MAX_BODY_BYTES": "1000", "MAX_INPUT_TOKENS": "100000"})
	for _, chunked := range []bool{false, true} {
		before := rec.count()
		ok := bytes.Repeat([]byte("a "), 500) // 1000 bytes
		r := p.send(t, "/v1/embeddings", "text/plain", ok, chunked)
		wantStatus(t, r, 200)
		got := rec.last(t)
		if !bytes.Equal(got.Body, ok) || got.ContentLength != 1000 {
			t.Fatalf("chunked=%v: upstream got %d bytes, Content-Length %d", chunked, len(got.Body), got.ContentLength)
		}
		r = p.send(t, "/v1/embeddings", "text/plain", append(ok, 'x'), chunked)
		wantStatus(t, r, 413)
		if m := r.json(t); field(m, "error", "code") != "body_too_large" || num(m["max_body_bytes"]) != 1000 {
			t.Fatalf("chunked=%v: %s", chunked, r.body)
		}
		if rec.count() != before+1 {
			t.Fatalf("chunked=%v: the refused body reached the upstream", chunked)
		}
	}
}

func multipartUpload(t *testing.T, fileBytes int) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.WriteField("message", "please summarise")
	f, _ := w.CreateFormFile("file", "scan.pdf")
	f.Write(bytes.Repeat([]byte{0x25}, fileBytes))
	w.Close()
	return b.Bytes(), w.FormDataContentType()
}

func TestFileCapAtTheBoundary(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"MAX_FILE_BYTES": "2000", "MAX_INPUT_TOKENS": "100000"})
	body, ct := multipartUpload(t, 2000)
	r := p.send(t, "/api/chat", ct, body, false)
	wantStatus(t, r, 200)
	if got := rec.last(t); !bytes.Equal(got.Body, body) || got.Header.Get("Content-Type") != ct {
		t.Fatal("the upload reached the upstream altered")
	}
	body, ct = multipartUpload(t, 2001)
	r = p.send(t, "/api/chat", ct, body, false)
	wantStatus(t, r, 413)
	if m := r.json(t); m["error"] != "file_too_large" || num(m["max_file_bytes"]) != 2000 {
		t.Fatalf("%s", r.body)
	}
	if rec.count() != 1 {
		t.Fatal("the refused upload reached the upstream")
	}
}

// estimateCLI runs `ratelimit-proxy tokens` on body.
func estimateCLI(t *testing.T, body string, args ...string) int {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"tokens", "-json"}, args...)...)
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tokens: %v", err)
	}
	var res struct {
		Tokens int `json:"estimated_tokens"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("tokens printed %q: %v", out, err)
	}
	return res.Tokens
}

func TestTokenCapAtTheBoundary(t *testing.T) {
	t.Parallel()
	body := `{"model":"gpt-4o","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Explain rate limiting in one paragraph, please."}]}`
	est := estimateCLI(t, body)
	rec := newRecorder(t)
	at := startProxy(t, rec.URL(), map[string]string{"MAX_INPUT_TOKENS": strconv.Itoa(est)})
	r := at.send(t, "/v1/chat/completions", "application/json", []byte(body), false)
	wantStatus(t, r, 200)
	if got := rec.last(t); string(got.Body) != body {
		t.Fatal("the body reached the upstream altered")
	}
	below := startProxy(t, rec.URL(), map[string]string{"MAX_INPUT_TOKENS": strconv.Itoa(est - 1)})
	r = below.send(t, "/v1/chat/completions", "application/json", []byte(body), false)
	wantStatus(t, r, 413)
	m := r.json(t)
	if field(m, "error", "code") != "input_too_large" || field(m, "error", "type") != "request_too_large" ||
		num(m["max_input_tokens"]) != float64(est-1) || num(m["estimated_tokens"]) != float64(est) {
		t.Fatalf("%s", r.body)
	}
	if rec.count() != 1 {
		t.Fatal("the refused request reached the upstream")
	}
}

func TestEightMebibytePromptStopsEarly(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"MAX_BODY_BYTES": strconv.Itoa(16 << 20)})
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8<<20/45)
	body := []byte(`{"messages":[{"role":"user","content":"` + prompt + `"}],"model":"gpt-4o"}`)
	start := time.Now()
	r := p.send(t, "/v1/chat/completions", "application/json", body, false)
	took := time.Since(start)
	wantStatus(t, r, 413)
	if m := r.json(t); num(m["estimated_tokens"]) <= 2000 || num(m["max_input_tokens"]) != 2000 {
		t.Fatalf("%s", r.body)
	}
	if took > 500*time.Millisecond {
		t.Fatalf("an 8 MiB prompt took %v to refuse (upload included), want < 500 ms", took)
	}
	if rec.count() != 0 {
		t.Fatal("the refused prompt reached the upstream")
	}
}

func TestMalformedBodiesGet400(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), nil)
	for _, tc := range []struct{ path, ct, body string }{
		{"/v1/chat/completions", "application/json", `{"model":"gpt-4o","messages":[{"role":"user","content":"secret-text"`},
		{"/api/chat", "multipart/form-data; boundary=zz", "--zz\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\nsecret-text"},
		{"/v1/messages", "application/json", `{"messages": [secret-text]}`},
	} {
		r := p.send(t, tc.path, tc.ct, []byte(tc.body), false)
		wantStatus(t, r, 400)
		if strings.Contains(string(r.body), "secret-text") || !strings.Contains(string(r.body), "invalid_request") {
			t.Errorf("%s: %s", tc.path, r.body)
		}
		wantRateLimitHeaders(t, r) // the limiter admitted it: its slot is used
	}
	if rec.count() != 0 {
		t.Fatal("a malformed body reached the upstream")
	}
}

// The CLI reproduces OpenAI's cookbook count.
func TestTokensCommand(t *testing.T) {
	t.Parallel()
	msgs := `[{"role":"system","content":"You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},` +
		`{"role":"system","name":"example_user","content":"New synergies will help drive top-line growth."},` +
		`{"role":"system","name":"example_assistant","content":"Things working well together will increase revenue."},` +
		`{"role":"system","name":"example_user","content":"Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},` +
		`{"role":"system","name":"example_assistant","content":"Let's talk later when we're less busy about how to do better."},` +
		`{"role":"user","content":"This late pivot means we don't have time to boil the ocean for the client deliverable."}]`
	for model, want := range map[string]int{"gpt-4": 129, "gpt-4o": 124} {
		if got := estimateCLI(t, fmt.Sprintf(`{"messages":%s}`, msgs), "-model", model); got != want {
			t.Errorf("%s: %d, want %d", model, got, want)
		}
	}
	// Without -json: the number alone.
	cmd := exec.Command(binPath, "tokens", "-model", "gpt-4")
	cmd.Stdin = strings.NewReader(fmt.Sprintf(`{"messages":%s}`, msgs))
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "129" {
		t.Fatalf("plain output %q %v", out, err)
	}
	cmd = exec.Command(binPath, "tokens")
	cmd.Stdin = strings.NewReader(`{"messages":`)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "invalid JSON") {
		t.Fatalf("bad body: %v %s", err, out)
	}
}
