// Package tests holds end-to-end tests: they build the real ratelimit-proxy
// binary once, start it as a child process in front of an httptest upstream
// and talk to it over TCP, as a client in production would.
package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binPath is the binary TestMain builds.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimit-proxy-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "ratelimit-proxy")
	build := exec.Command("go", "build", "-o", binPath, "../cmd/ratelimit-proxy")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the binary:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const startTimeout = 10 * time.Second

// logSink collects the child's stderr line by line; safe for concurrent use.
type logSink struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
	notify  chan struct{} // a new line arrived (capacity 1, never blocks)
}

func newLogSink() *logSink { return &logSink{notify: make(chan struct{}, 1)} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.partial = append(s.partial, p...)
	added := false
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		s.lines = append(s.lines, string(s.partial[:i]))
		s.partial = s.partial[i+1:]
		added = true
	}
	s.mu.Unlock()
	if added {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// Lines returns a copy of the complete lines so far.
func (s *logSink) Lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// Text is everything written so far, partial last line included.
func (s *logSink) Text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n") + "\n" + string(s.partial)
}

// logLine is one JSON log record.
type logLine map[string]any

// JSONLines parses every line that is a JSON object.
func (s *logSink) JSONLines() []logLine {
	var out []logLine
	for _, l := range s.Lines() {
		var m logLine
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// proc is one running ratelimit-proxy.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	logs    *logSink
	done    chan struct{} // closed when the process has exited and been reaped
	waitErr error         // written before done is closed
	public  string        // host:port of the public listener
	admin   string        // host:port of the admin listener
	client  *http.Client
}

// baseEnv is the environment every started proxy gets (SPEC §2 names).
func baseEnv(upstreamURL string) map[string]string {
	env := map[string]string{
		"LISTEN_ADDR": "127.0.0.1:0",
		"ADMIN_ADDR":  "127.0.0.1:0",
		"LOG_FORMAT":  "json",
	}
	if upstreamURL != "" {
		env["UPSTREAM_URL"] = upstreamURL
	}
	return env
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// startProxy starts the binary with exactly baseEnv(upstreamURL) plus extra
// (nothing inherited from the test's environment) and waits until both
// listeners are up. t.Cleanup stops it with SIGTERM.
func startProxy(t *testing.T, upstreamURL string, extra map[string]string, args ...string) *proc {
	t.Helper()
	env := baseEnv(upstreamURL)
	for k, v := range extra {
		env[k] = v
	}
	p, err := launch(t, env, args...)
	if err != nil {
		t.Fatalf("starting ratelimit-proxy %v: %v\nstderr:\n%s", args, err, p.logs.Text())
	}
	return p
}

// launch starts the process and waits for its two "listening" log lines.
// On error the returned proc still carries the logs.
func launch(t *testing.T, env map[string]string, args ...string) (*proc, error) {
	t.Helper()
	p := &proc{t: t, logs: newLogSink(), done: make(chan struct{})}
	p.cmd = exec.Command(binPath, args...)
	p.cmd.Env = envList(env)
	p.cmd.Stdout = io.Discard
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		close(p.done)
		return p, err
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	p.client = &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 16},
		Timeout:   15 * time.Second,
	}
	t.Cleanup(p.stop)

	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	exited := false
	for {
		for _, l := range p.logs.JSONLines() {
			if l["msg"] != "listening" {
				continue
			}
			addr, _ := l["addr"].(string)
			switch l["listener"] {
			case "public":
				p.public = addr
			case "admin":
				p.admin = addr
			}
		}
		if p.public != "" && p.admin != "" {
			return p, nil
		}
		if exited {
			return p, fmt.Errorf("process exited before listening: %v", p.waitErr)
		}
		select {
		case <-p.logs.notify:
		case <-p.done:
			exited = true // parse once more: the last lines came before the exit
		case <-deadline.C:
			return p, fmt.Errorf("no \"listening\" log lines for both listeners within %v", startTimeout)
		}
	}
}

// stop sends SIGTERM to the started process (by its PID only) and waits for
// it; after 10 s it is killed.
func (p *proc) stop() {
	if p.client != nil {
		p.client.CloseIdleConnections()
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited waits up to d for the process to exit and returns its exit code.
func (p *proc) exited(d time.Duration) (int, bool) {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		select {
		case <-p.done:
		default:
			return 0, false
		}
	}
	return p.cmd.ProcessState.ExitCode(), true
}

func (p *proc) url(path string) string      { return "http://" + p.public + path }
func (p *proc) adminURL(path string) string { return "http://" + p.admin + path }

// response is a fully read HTTP response.
type response struct {
	*http.Response
	body []byte
}

// json decodes the body as a JSON object, failing the test otherwise.
func (r *response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("%d response body is not a JSON object: %v\n%s", r.StatusCode, err, r.body)
	}
	return m
}

// do sends one request through p's client and reads the whole answer.
func (p *proc) do(t *testing.T, method, url string, body []byte, hdr ...string) *response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if http.CanonicalHeaderKey(hdr[i]) == "Content-Type" {
			req.Header.Set(hdr[i], hdr[i+1]) // replaces the JSON default
			continue
		}
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: status %d, reading body: %v (%d bytes read)\nproxy stderr:\n%s", method, url, resp.StatusCode, err, len(b), p.logs.Text())
	}
	return &response{Response: resp, body: b}
}

// post sends a protected-route style JSON POST to the public listener.
func (p *proc) post(t *testing.T, path string, hdr ...string) *response {
	t.Helper()
	return p.do(t, http.MethodPost, p.url(path), bodyFor(path), hdr...)
}

// bodyFor is a small, valid request body in the API style of path.
func bodyFor(path string) []byte {
	switch {
	case strings.HasPrefix(path, "/v1/messages"):
		return []byte(`{"model":"claude-3-5-haiku-latest","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	case strings.HasPrefix(path, "/v1/embeddings"):
		return []byte(`{"model":"text-embedding-3-small","input":"hi"}`)
	case strings.HasPrefix(path, "/api/chat"):
		return []byte(`{"message":"hi"}`)
	default:
		return []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`)
	}
}

// recorded is one request the upstream received.
type recorded struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
	ContentLength          int64
}

// recorder is an upstream that records every request and answers 200 JSON
// with "X-Upstream: yes".
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
	srv  *httptest.Server
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, recorded{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
			Header: r.Header.Clone(), Body: body, ContentLength: r.ContentLength})
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "yes")
		fmt.Fprintf(w, `{"upstream":"ok","path":%q}`+"\n", r.URL.Path)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *recorder) URL() string { return r.srv.URL }

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

func (r *recorder) last(t *testing.T) recorded {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		t.Fatal("the upstream received no request")
	}
	return r.reqs[len(r.reqs)-1]
}

// newUpstream starts an httptest upstream with h.
func newUpstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// deadURL is the URL of a loopback port nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// keyHash is the public form of an API key (SPEC §5).
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:])[:16]
}

// wantStatus fails the test unless r has the status.
func wantStatus(t *testing.T, r *response, status int) {
	t.Helper()
	if r.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d\nheaders: %v\nbody: %s",
			r.Request.Method, r.Request.URL, r.StatusCode, status, r.Header, r.body)
	}
}

// wantHeader checks one response header's exact value.
func wantHeader(t *testing.T, r *response, name, want string) {
	t.Helper()
	if got := r.Header.Values(name); len(got) != 1 || got[0] != want {
		t.Errorf("%s %s: header %s = %q, want %q", r.Request.Method, r.Request.URL.Path, name, got, want)
	}
}

// rateLimitHeaders are the headers of SPEC §5 on a rate-limited route.
var rateLimitHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}

// wantNoRateLimitHeaders fails if any rate-limit header is present.
func wantNoRateLimitHeaders(t *testing.T, r *response) {
	t.Helper()
	for _, h := range append(rateLimitHeaders, "Retry-After", "X-RateLimit-Retry-After") {
		if v := r.Header.Values(h); len(v) > 0 {
			t.Errorf("%s %s: unguarded response carries %s: %q", r.Request.Method, r.Request.URL.Path, h, v)
		}
	}
}

// wantRateLimitHeaders fails unless every rate-limit header is present.
func wantRateLimitHeaders(t *testing.T, r *response) {
	t.Helper()
	for _, h := range rateLimitHeaders {
		if r.Header.Get(h) == "" {
			t.Errorf("%s %s (status %d): missing %s", r.Request.Method, r.Request.URL.Path, r.StatusCode, h)
		}
	}
}

// field walks a decoded JSON object by keys.
func field(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[k]
	}
	return v
}

// num returns a JSON number as float64, or -1 if it is not one.
func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case string:
		if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
			return f
		}
	}
	return -1
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// isRefused reports whether err is a refused TCP connection.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
