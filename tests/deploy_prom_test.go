package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// promServer is a prometheus process the test started.
type promServer struct {
	url    string
	client *http.Client
}

// startPrometheus runs prometheus on a free loopback port, scraping
// targets every second as job deployScrapeJob and evaluating the alert
// rules every second; t.Cleanup stops it by its PID.
func startPrometheus(t *testing.T, bin string, targets []string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: %s
    static_configs:
      - targets: [%s]
`, rules, deployScrapeJob, strings.Join(quoted, ", "))
	confPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+confPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = deployProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	s := &promServer{url: "http://" + addr, client: &http.Client{Timeout: 5 * time.Second}}
	if !waitFor(15*time.Second, func() bool {
		r, err := s.client.Get(s.url + "/-/ready")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	}) {
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("prometheus on %s not ready within 15 s\n%s", addr, b)
	}
	return s
}

// promSample is one series of an instant query's answer.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	v, _ := s.Value[1].(string)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0
	}
	return f
}

func (s *promServer) get(t *testing.T, path string, into any) {
	t.Helper()
	r, err := s.client.Get(s.url + path)
	if err != nil {
		t.Fatalf("prometheus %s: %v", path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil || env.Status != "success" {
		t.Fatalf("prometheus %s: %d %s", path, r.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(env.Data, into); err != nil {
		t.Fatalf("prometheus %s: %v\n%s", path, err, env.Data)
	}
}

// query runs an instant query now; a query Prometheus refuses fails the
// test.
func (s *promServer) query(t *testing.T, q string) []promSample {
	t.Helper()
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	s.get(t, "/api/v1/query?query="+url.QueryEscape(q), &data)
	if data.ResultType != "vector" {
		t.Fatalf("%s: result type %q, want a vector", q, data.ResultType)
	}
	var out []promSample
	if err := json.Unmarshal(data.Result, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor waits until q returns a series.
func (s *promServer) waitFor(t *testing.T, d time.Duration, q, what string) {
	t.Helper()
	if !waitFor(d, func() bool { return len(s.query(t, q)) > 0 }) {
		t.Fatalf("%s: %s returned nothing within %v", what, q, d)
	}
}

// promRule is an alerting rule as /api/v1/rules reports it.
type promRule struct {
	Name        string            `json:"name"`
	Query       string            `json:"query"`
	State       string            `json:"state"`
	Health      string            `json:"health"`
	LastError   string            `json:"lastError"`
	Type        string            `json:"type"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func (s *promServer) rules(t *testing.T) []promRule {
	t.Helper()
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	s.get(t, "/api/v1/rules?type=alert", &data)
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}
