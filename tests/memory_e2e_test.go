package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMemory200kCallers sends one request for each of 200,000 distinct API
// keys (CHAT_RPM=5, in-memory state) and bounds the process's resident
// memory after it: the README's memory figure, with room for the machine.
func TestMemory200kCallers(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 200,000 requests")
	}
	const (
		callers = 200_000
		workers = 8
		boundMB = 150 // the target; 139 MB measured
	)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})
	p := startProxy(t, up.URL, map[string]string{"CHAT_RPM": "5"})
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid)); err != nil {
		t.Skip("no /proc: cannot read the process's resident memory")
	}
	body := bodyFor("/v1/chat/completions")
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers},
		Timeout:   15 * time.Second,
	}
	defer client.CloseIdleConnections()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < callers; i += workers {
				req, _ := http.NewRequest(http.MethodPost, p.url("/v1/chat/completions"), bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer key-"+strconv.Itoa(i))
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	rss, hwm := procMemory(t, p.cmd.Process.Pid)
	tracked := metricValue(string(p.do(t, http.MethodGet, p.adminURL("/metrics"), nil).body), "ratelimit_proxy_tracked_keys")
	t.Logf("%d callers in %v: %d admitted, %d failed; %s counters held; VmRSS %d MB, VmHWM %d MB",
		callers, took.Round(time.Second), ok.Load(), failed.Load(), tracked, rss>>10, hwm>>10)
	if ok.Load() < callers*99/100 {
		t.Fatalf("only %d of %d first requests admitted", ok.Load(), callers)
	}
	if rss>>10 > boundMB {
		t.Fatalf("VmRSS %d MB after %d callers, want at most %d MB", rss>>10, callers, boundMB)
	}
}

// procMemory reads VmRSS and VmHWM (kB) of pid.
func procMemory(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch name {
		case "VmRSS":
			rss = kb
		case "VmHWM":
			hwm = kb
		}
	}
	if rss == 0 {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm
}
