package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SPEC §7.6: the in-memory counters survive restarts through STATE_FILE.

// admissions posts as the caller with key until a 429 (at most max
// requests) and returns how many were admitted and the refusal.
func admissions(t *testing.T, p *proc, key string, max int) (int, *response) {
	t.Helper()
	for n := 0; n < max; n++ {
		r := p.post(t, "/api/chat", "Authorization", "Bearer "+key)
		if r.StatusCode == http.StatusTooManyRequests {
			return n, r
		}
		wantStatus(t, r, http.StatusOK)
	}
	t.Fatalf("caller %s: %d requests admitted, no 429", key, max)
	return 0, nil
}

// lastSave is ratelimit_proxy_state_last_save_timestamp_seconds, 0 when
// there is none yet.
func lastSave(t *testing.T, p *proc) float64 {
	t.Helper()
	r := p.do(t, http.MethodGet, p.adminURL("/metrics"), nil)
	v, err := strconv.ParseFloat(metricValue(string(r.body), "ratelimit_proxy_state_last_save_timestamp_seconds"), 64)
	if err != nil {
		return 0
	}
	return v
}

// killHard sends SIGKILL to p (its PID only) and waits for it to die.
func killHard(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// kill -9 between flushes loses at most one STATE_FLUSH_INTERVAL: what
// was flushed is kept, what came after the last flush may be lost, and
// the caller is never admitted more than the limit across the restart.
func TestStateSurvivesKill(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	path := filepath.Join(t.TempDir(), "state")
	env := map[string]string{"CHAT_RPM": "5", "STATE_FILE": path, "STATE_FLUSH_INTERVAL": "200ms"}
	p := startProxy(t, up.URL(), env)

	for _, key := range []string{"sk-flushed", "sk-late"} {
		for range 3 {
			wantStatus(t, p.post(t, "/api/chat", "Authorization", "Bearer "+key), http.StatusOK)
		}
	}
	answered := float64(time.Now().UnixNano()) / 1e9
	if !waitFor(5*time.Second, func() bool { return lastSave(t, p) > answered }) {
		t.Fatalf("no save of the state file after the requests within 5 s\n%s", p.logs.Text())
	}
	// One more after the flush, then the kill: it may or may not be saved.
	wantStatus(t, p.post(t, "/api/chat", "Authorization", "Bearer sk-late"), http.StatusOK)
	killHard(t, p)

	q := startProxy(t, up.URL(), env)
	if n, _ := admissions(t, q, "sk-flushed", 6); n != 2 {
		t.Errorf("flushed caller: %d admitted after the restart, want exactly 2 (5 - 3 saved)", n)
	}
	if n, _ := admissions(t, q, "sk-late", 6); n != 1 && n != 2 {
		t.Errorf("caller with a request after the last flush: %d admitted after the restart, want 1 (it was saved) or 2 (lost)", n)
	}
	if !hasLog(q, "counters restored from the state file") {
		t.Errorf("no log line of the restored counters\n%s", q.logs.Text())
	}
}

// A daily quota is not reset by a deploy: SIGTERM saves the counters.
func TestStateKeepsDailyQuotaAcrossShutdown(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	cfg := writeRules(t, `
[[rule]]
name   = "daily"
limit  = 3
window = "24h"
`)
	path := filepath.Join(t.TempDir(), "state")
	// No periodic save within the test: only the one at shutdown.
	env := map[string]string{"STATE_FILE": path, "STATE_FLUSH_INTERVAL": "1h"}
	p := startProxy(t, up.URL(), env, "-config", cfg)
	for range 2 {
		wantStatus(t, p.post(t, "/api/chat", "Authorization", "Bearer sk-daily"), http.StatusOK)
	}
	p.stop()
	if code, ok := p.exited(0); !ok || code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0\n%s", code, p.logs.Text())
	}
	if !hasLog(p, "state file saved") {
		t.Fatalf("no save at shutdown\n%s", p.logs.Text())
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v, %v; want mode 0600", fi, err)
	}

	q := startProxy(t, up.URL(), env, "-config", cfg)
	n, r := admissions(t, q, "sk-daily", 4)
	if n != 1 {
		t.Fatalf("%d admitted after the restart, want 1 (3 a day, 2 used)", n)
	}
	b := r.json(t)
	if secs := num(b["retry_after_seconds"]); secs < 23*3600 {
		t.Errorf("retry_after_seconds = %v, want about a day (body %s)", b["retry_after_seconds"], r.body)
	}
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 23*3600 {
		t.Errorf("Retry-After = %q, want about a day", r.Header.Get("Retry-After"))
	}
	if b["denied_by"] != "daily" {
		t.Errorf("denied_by = %v, want daily", b["denied_by"])
	}
}

// A damaged state file is logged and set aside; the proxy starts and serves.
func TestStateDamagedFileSetAside(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	if err := os.WriteFile(path, []byte("\x00garbage, not a state file\xff\xfe"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "5", "STATE_FILE": path, "STATE_FLUSH_INTERVAL": "200ms"})
	wantStatus(t, p.post(t, "/api/chat"), http.StatusOK)

	var line logLine
	for _, l := range p.logs.JSONLines() {
		if strings.HasPrefix(l["msg"].(string), "state file damaged") {
			line = l
		}
	}
	if line == nil || line["level"] != "ERROR" || !strings.Contains(line["err"].(string), "not a state file") {
		t.Fatalf("damaged file: log line %v, want an ERROR naming the reason\n%s", line, p.logs.Text())
	}
	aside, _ := line["moved_to"].(string)
	if ok, _ := regexp.MatchString(`^`+regexp.QuoteMeta(path)+`\.damaged-\d+$`, aside); !ok {
		t.Fatalf("moved_to = %q, want %s.damaged-<unix seconds>", aside, path)
	}
	if b, err := os.ReadFile(aside); err != nil || !strings.Contains(string(b), "garbage") {
		t.Errorf("the damaged file is not kept at %s: %v", aside, err)
	}
	// Saving goes on into a fresh file.
	if !waitFor(5*time.Second, func() bool { return lastSave(t, p) > 0 }) {
		t.Fatalf("no save after the damaged file was set aside\n%s", p.logs.Text())
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("no new state file: %v", err)
	}
}

// With Redis the file is ignored, with one warning.
func TestStateFileIgnoredWithRedis(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	path := filepath.Join(t.TempDir(), "state")
	p := startProxy(t, up.URL(), map[string]string{"STATE_FILE": path, "STATE_FLUSH_INTERVAL": "100ms",
		"REDIS_URL": "redis://" + strings.TrimPrefix(deadURL(t), "http://")})
	p.stop()
	if !hasLog(p, "STATE_FILE ignored: Redis keeps its own state") {
		t.Errorf("no warning that STATE_FILE is ignored\n%s", p.logs.Text())
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("state file written with Redis: %v", err)
	}
}

func hasLog(p *proc, msg string) bool {
	for _, l := range p.logs.JSONLines() {
		if l["msg"] == msg {
			return true
		}
	}
	return false
}
