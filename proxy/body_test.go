package proxy_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// recorder is an upstream that keeps what it received.
type recorder struct {
	mu      sync.Mutex
	bodies  [][]byte
	lengths []int64
	te      [][]string
}

func (u *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.bodies, u.lengths, u.te = append(u.bodies, b), append(u.lengths, r.ContentLength), append(u.te, r.TransferEncoding)
	u.mu.Unlock()
	w.Write([]byte(`{}`))
}

func (u *recorder) count() int { u.mu.Lock(); defer u.mu.Unlock(); return len(u.bodies) }

// capsServer is the proxy with the given caps in front of a recorder,
// served over a real listener.
func capsServer(t *testing.T, set func(*config.Config)) (*httptest.Server, *recorder) {
	t.Helper()
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	cfg := config.Default()
	cfg.UpstreamURL = up.URL
	cfg.ChatRPM = 1 << 30
	set(&cfg)
	p, err := proxy.New(proxy.Options{Config: cfg, Store: limits.NewMemory(limits.MemoryOptions{}),
		Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return srv, rec
}

func post(t *testing.T, url, contentType string, body io.Reader, chunked bool) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, body)
	req.Header.Set("Content-Type", contentType)
	if chunked {
		req.ContentLength = -1
		req.Body = io.NopCloser(body) // hide the length: the client sends chunks
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestBodyCapIsExact(t *testing.T) {
	const cap = 300 << 10 // above the in-memory threshold: spooled to disk
	srv, rec := capsServer(t, func(c *config.Config) { c.MaxBodyBytes = cap; c.MaxInputTokens = 1 << 30 })
	payload := make([]byte, cap+1)
	rand.Read(payload)
	for _, chunked := range []bool{false, true} {
		before := rec.count()
		code, _ := post(t, srv.URL+"/v1/embeddings", "application/octet-stream", bytes.NewReader(payload[:cap]), chunked)
		if code != 200 || rec.count() != before+1 {
			t.Fatalf("chunked=%v: cap bytes: %d", chunked, code)
		}
		rec.mu.Lock()
		got, length, te := rec.bodies[len(rec.bodies)-1], rec.lengths[len(rec.lengths)-1], rec.te[len(rec.te)-1]
		rec.mu.Unlock()
		if !bytes.Equal(got, payload[:cap]) || length != cap || len(te) != 0 {
			t.Fatalf("chunked=%v: upstream got %d bytes (Content-Length %d, TE %v), not the body sent", chunked, len(got), length, te)
		}
		code, body := post(t, srv.URL+"/v1/embeddings", "application/octet-stream", bytes.NewReader(payload), chunked)
		if code != 413 || !strings.Contains(body, `"code":"body_too_large"`) || !strings.Contains(body, fmt.Sprintf(`"max_body_bytes":%d`, cap)) {
			t.Fatalf("chunked=%v: cap+1 bytes: %d %s", chunked, code, body)
		}
		if rec.count() != before+1 {
			t.Fatalf("chunked=%v: a refused body reached the upstream", chunked)
		}
	}
}

func multipartFile(t *testing.T, size int) (io.Reader, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.WriteField("message", "summarise")
	f, _ := w.CreateFormFile("file", "doc.pdf")
	f.Write(bytes.Repeat([]byte{0}, size))
	w.Close()
	return &b, w.FormDataContentType()
}

func TestFileCapIsExact(t *testing.T) {
	srv, rec := capsServer(t, func(c *config.Config) { c.MaxFileBytes = 1000; c.MaxInputTokens = 1 << 30 })
	body, ct := multipartFile(t, 1000)
	if code, resp := post(t, srv.URL+"/api/chat", ct, body, false); code != 200 {
		t.Fatalf("cap bytes: %d %s", code, resp)
	}
	body, ct = multipartFile(t, 1001)
	code, resp := post(t, srv.URL+"/api/chat", ct, body, false)
	if code != 413 || resp != `{"error":"file_too_large","message":"An uploaded file exceeds 1000 bytes.","max_file_bytes":1000}`+"\n" {
		t.Fatalf("cap+1 bytes: %d %s", code, resp)
	}
	if rec.count() != 1 {
		t.Fatalf("upstream saw %d requests", rec.count())
	}
}

func TestTokenCapIsExact(t *testing.T) {
	tk := tokens.New()
	msg := `{"model":"gpt-4o","messages":[{"role":"user","content":"The quick brown fox jumps over the lazy dog"}]}`
	est, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(msg)}, -1)
	if err != nil {
		t.Fatal(err)
	}
	at, _ := capsServer(t, func(c *config.Config) { c.MaxInputTokens = int64(est.Tokens) })
	if code, body := post(t, at.URL+"/v1/chat/completions", "application/json", strings.NewReader(msg), false); code != 200 {
		t.Fatalf("at the cap: %d %s", code, body)
	}
	below, rec := capsServer(t, func(c *config.Config) { c.MaxInputTokens = int64(est.Tokens - 1) })
	code, body := post(t, below.URL+"/v1/chat/completions", "application/json", strings.NewReader(msg), false)
	want := fmt.Sprintf(`{"error":{"message":"The input is estimated at more than %d tokens.","type":"request_too_large","code":"input_too_large","param":null},"max_input_tokens":%d,"estimated_tokens":%d}`, est.Tokens-1, est.Tokens-1, est.Tokens)
	if code != 413 || strings.TrimSpace(body) != want {
		t.Fatalf("over the cap: %d %s\nwant %s", code, body, want)
	}
	if rec.count() != 0 {
		t.Fatal("a refused request reached the upstream")
	}
}

// TestTokenCapOfSpooledBody: a JSON body above the in-memory threshold is
// spooled to a file and counted in place from its mapping, exactly as one
// held in memory; the one at the cap reaches the upstream byte for byte.
func TestTokenCapOfSpooledBody(t *testing.T) {
	var prose strings.Builder
	for i := 0; prose.Len() < 300<<10; i++ {
		fmt.Fprintf(&prose, "Sentence %d tells the model about caché number %d. ", i, i*7)
	}
	msg := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + prose.String() + `\u00e9"}]}`
	est, err := tokens.New().Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(msg)}, -1)
	if err != nil {
		t.Fatal(err)
	}
	at, rec := capsServer(t, func(c *config.Config) { c.MaxInputTokens = int64(est.Tokens) })
	if code, body := post(t, at.URL+"/v1/chat/completions", "application/json", strings.NewReader(msg), true); code != 200 {
		t.Fatalf("at the cap: %d %s", code, body)
	}
	rec.mu.Lock()
	got := rec.bodies[len(rec.bodies)-1]
	rec.mu.Unlock()
	if string(got) != msg {
		t.Fatalf("the upstream got %d bytes, not the %d sent", len(got), len(msg))
	}
	below, rec := capsServer(t, func(c *config.Config) { c.MaxInputTokens = int64(est.Tokens - 1) })
	if code, body := post(t, below.URL+"/v1/chat/completions", "application/json", strings.NewReader(msg), true); code != 413 ||
		!strings.Contains(body, fmt.Sprintf(`"estimated_tokens":%d`, est.Tokens)) {
		t.Fatalf("over the cap: %d %s", code, body)
	}
	if rec.count() != 0 {
		t.Fatal("a refused request reached the upstream")
	}
}

func TestMalformedBodiesAre400(t *testing.T) {
	srv, rec := capsServer(t, func(c *config.Config) {})
	for _, tc := range []struct{ path, ct, body string }{
		{"/v1/chat/completions", "application/json", `{"messages":[`},
		{"/api/chat", "application/json", `{"message": secret}`},
		{"/api/chat", "multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\nsecret"},
		{"/api/chat", "multipart/form-data", "secret"},
	} {
		code, body := post(t, srv.URL+tc.path, tc.ct, strings.NewReader(tc.body), false)
		if code != 400 || !strings.Contains(body, "invalid_request") || strings.Contains(body, "secret") {
			t.Errorf("%s %q: %d %s", tc.path, tc.body, code, body)
		}
	}
	if rec.count() != 0 {
		t.Fatal("a malformed body reached the upstream")
	}
}
