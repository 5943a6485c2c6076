package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runOnce runs the binary to completion with exactly env and returns its
// exit code, stdout and stderr.
func runOnce(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = envList(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("running %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// 10. -check validates, prints the effective settings with secrets
// redacted, and reports a bad configuration on one line naming every bad
// key and value.
func TestCheck(t *testing.T) {
	t.Parallel()
	t.Run("good env", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "CHAT_RPM": "7"}, "-check")
		if code != 0 {
			t.Fatalf("exit %d, want 0\nstderr: %s", code, errOut)
		}
		if !strings.Contains(out, "chat_rpm = 7") {
			t.Errorf("stdout lacks \"chat_rpm = 7\":\n%s", out)
		}
		if !strings.Contains(out, "upstream_url = ") || !strings.Contains(out, "upstream_timeout = ") {
			t.Errorf("stdout lacks the effective settings:\n%s", out)
		}
	})
	t.Run("password redacted", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://u:hunter2@h:1"}, "-check")
		if code != 0 {
			t.Fatalf("exit %d, want 0\nstderr: %s", code, errOut)
		}
		if strings.Contains(out+errOut, "hunter2") {
			t.Errorf("-check printed the upstream password:\n%s%s", out, errOut)
		}
		if !strings.Contains(out, "chat_rpm = ") {
			t.Errorf("stdout lacks chat_rpm:\n%s", out)
		}
	})
	t.Run("bad env", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "CHAT_RPM": "-1", "UPSTREAM_TIMEOUT": "10"}, "-check")
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if out != "" {
			t.Errorf("stdout on a bad configuration: %q", out)
		}
		lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
		if len(lines) != 1 {
			t.Errorf("stderr has %d lines, want one:\n%s", len(lines), errOut)
		}
		for _, want := range []string{"CHAT_RPM", "-1", "UPSTREAM_TIMEOUT", "10"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("the error must name every bad key and value (SPEC §1, CONVENTIONS: Validate reports every problem at once); %q is missing from:\n%s", want, errOut)
			}
		}
	})
	t.Run("unknown key in the file", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(path, []byte("upstream_url = \"http://127.0.0.1:1\"\nchat_rpmm = 5\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := runOnce(t, nil, "-check", "-config", path)
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if !strings.Contains(errOut, "chat_rpmm") || strings.Count(strings.TrimRight(errOut, "\n"), "\n") != 0 {
			t.Errorf("stderr must be one line naming chat_rpmm:\n%s", errOut)
		}
	})
}

// LISTEN_ADDR=127.0.0.1:0 with ADMIN_ADDR=127.0.0.1:0 is the standard way
// to run two listeners on free ports, and each gets its own port (a
// regression test: config/validate.go once compared the strings and
// refused the start).
func TestBothListenersOnEphemeralPorts(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p, err := launch(t, baseEnv(up.URL()))
	if err != nil {
		t.Fatalf("LISTEN_ADDR=127.0.0.1:0 ADMIN_ADDR=127.0.0.1:0 must start two listeners on distinct free ports "+
			"(port 0 never names one socket): %v\nstderr:\n%s", err, p.logs.Text())
	}
	if p.public == p.admin {
		t.Fatalf("both listeners on %s", p.public)
	}
	wantStatus(t, p.post(t, "/api/chat"), http.StatusOK)
	r := p.do(t, http.MethodGet, p.adminURL("/healthz"), nil)
	wantStatus(t, r, http.StatusOK)
}

// 11. -demo serves a built-in OpenAI-compatible mock, plain and streamed.
func TestDemo(t *testing.T) {
	t.Parallel()
	p := startProxy(t, "", nil, "-demo")

	body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello demo"}]}`)
	r := p.do(t, http.MethodPost, p.url("/v1/chat/completions"), body)
	wantStatus(t, r, http.StatusOK)
	wantRateLimitHeaders(t, r)
	b := r.json(t)
	if b["object"] != "chat.completion" {
		t.Errorf("object = %#v, want chat.completion (body %s)", b["object"], r.body)
	}
	if c, _ := field(b, "choices").([]any); len(c) == 0 {
		t.Errorf("no choices: %s", r.body)
	} else if msg, _ := field(c[0].(map[string]any), "message", "content").(string); msg == "" {
		t.Errorf("empty reply: %s", r.body)
	}

	stream := []byte(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hello demo"}]}`)
	r = p.do(t, http.MethodPost, p.url("/v1/chat/completions"), stream)
	wantStatus(t, r, http.StatusOK)
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("stream Content-Type = %q", ct)
	}
	var events []string
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			if !strings.HasPrefix(line, "data: ") {
				t.Errorf("non-data line in the stream: %q", line)
			}
			events = append(events, line)
		}
	}
	if len(events) < 2 || events[len(events)-1] != "data: [DONE]" {
		t.Errorf("stream does not end in data: [DONE]: %q", events)
	}
}

// 12. SIGTERM: the listener closes at once, the in-flight request finishes
// with its complete body, and the process exits 0 within SHUTDOWN_TIMEOUT.
func TestSIGTERMDrainsInFlight(t *testing.T) {
	t.Parallel()
	want := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	received := make(chan struct{})
	var once sync.Once
	gate := newReleaser(t)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		once.Do(func() { close(received) })
		time.Sleep(time.Second)
		select { // held until the test has seen the listener close
		case <-gate.ch:
		case <-r.Context().Done():
			return
		}
		w.Write(want)
	})
	const shutdown = 5 * time.Second
	p := startProxy(t, up.URL, map[string]string{"SHUTDOWN_TIMEOUT": shutdown.String()})

	type result struct {
		status int
		body   []byte
		err    error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := p.client.Post(p.url("/v1/chat/completions"), "application/json", bytes.NewReader(bodyFor("/v1/chat/completions")))
		if err != nil {
			res <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		res <- result{status: resp.StatusCode, body: b, err: err}
	}()
	select {
	case <-received:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never received the request")
	}
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	refused := waitFor(3*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", p.public, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return false
		}
		return isRefused(err)
	})
	if !refused {
		t.Error("new connections are still accepted 3 s after SIGTERM")
	}
	select {
	case r := <-res:
		t.Fatalf("the in-flight request ended before the upstream answered: %+v", r)
	default:
	}
	gate.release()
	select {
	case r := <-res:
		if r.err != nil || r.status != http.StatusOK || !bytes.Equal(r.body, want) {
			t.Errorf("in-flight request: status %d, %d bytes (want %d), err %v", r.status, len(r.body), len(want), r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the in-flight request never completed")
	}
	code, ok := p.exited(shutdown + time.Second - time.Since(sent))
	if !ok {
		t.Fatalf("still running %v after SIGTERM (SHUTDOWN_TIMEOUT %v)", time.Since(sent), shutdown)
	}
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0\nstderr:\n%s", code, p.logs.Text())
	}
}

// SHUTDOWN_TIMEOUT bounds the drain: a request that never ends does not
// keep the process alive, and the exit is still 0 (SPEC §1).
func TestSIGTERMDrainIsBounded(t *testing.T) {
	t.Parallel()
	received := make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		once.Do(func() { close(received) })
		<-r.Context().Done() // never answers
	})
	p := startProxy(t, up.URL, map[string]string{"SHUTDOWN_TIMEOUT": "1s"})
	go func() {
		resp, err := p.client.Post(p.url("/api/chat"), "application/json", bytes.NewReader(bodyFor("/api/chat")))
		if err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-received:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never received the request")
	}
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, ok := p.exited(4 * time.Second)
	if !ok {
		t.Fatalf("still running 4 s after SIGTERM with SHUTDOWN_TIMEOUT=1s and a hung request")
	}
	if took := time.Since(sent); took < 900*time.Millisecond {
		t.Errorf("exited after %v, before the 1 s drain ended", took)
	}
	if code != 0 {
		t.Errorf("exit code %d, want 0\nstderr:\n%s", code, p.logs.Text())
	}
}

// `ratelimit-proxy key` prints the caller the proxy makes of a key (the
// denied_key of its 429) and the key's SHA-256; a key given as an argument
// is refused, so it never lands in a shell's history.
func TestKeyCommand(t *testing.T) {
	t.Parallel()
	const key = "sk-proj-Zm9vYmFyYmF6"
	cmd := exec.Command(binPath, "key", "-json")
	cmd.Stdin = strings.NewReader("Bearer " + key + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("key -json: %v", err)
	}
	var forms struct {
		Caller, Public, SHA256 string
		APIKey                 string `json:"api_key"`
	}
	if err := json.Unmarshal(out, &forms); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	sum := sha256.Sum256([]byte(key))
	if forms.SHA256 != hex.EncodeToString(sum[:]) || forms.Public != "caller="+forms.Caller || forms.APIKey != "api_key="+forms.SHA256[:16] {
		t.Fatalf("forms %+v", forms)
	}
	p := startProxy(t, "http://127.0.0.1:1", map[string]string{"CHAT_RPM": "0"})
	r := p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+key)
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.json(t)["denied_key"]; got != forms.Public {
		t.Fatalf("denied_key %v, key prints %s", got, forms.Public)
	}
	// A rule keyed by api_key writes the key's api_key form.
	cfgPath := filepath.Join(t.TempDir(), "k.toml")
	if err := os.WriteFile(cfgPath, []byte("[[rule]]\nname = \"by-key\"\nkey = [\"api_key\"]\nlimit = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p = startProxy(t, "http://127.0.0.1:1", nil, "-config", cfgPath)
	r = p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+key)
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.json(t)["denied_key"]; got != forms.APIKey {
		t.Fatalf("denied_key %v on an api_key rule, key prints %s", got, forms.APIKey)
	}
	cmd = exec.Command(binPath, "key")
	cmd.Stdin = strings.NewReader(key)
	if out, err := cmd.Output(); err != nil || string(out) != forms.Public+"\n"+forms.APIKey+"\nsha256 = \""+forms.SHA256+"\"\n" {
		t.Fatalf("plain output %q %v", out, err)
	}
	if err := exec.Command(binPath, "key", key).Run(); err == nil {
		t.Fatal("a key on the command line was accepted")
	}
}

// -demo listens on loopback unless LISTEN_ADDR says otherwise.
func TestDemoListensOnLoopback(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binPath, "-demo", "-check")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "listen_addr = \"127.0.0.1:8080\"\n") {
		t.Fatalf("-demo -check: %v\n%s", err, out)
	}
	cmd = exec.Command(binPath, "-demo", "-check")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LISTEN_ADDR=:9999"}
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "listen_addr = \":9999\" # from LISTEN_ADDR") {
		t.Fatalf("-demo -check with LISTEN_ADDR: %v\n%s", err, out)
	}
}
