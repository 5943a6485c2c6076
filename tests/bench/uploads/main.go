// Command uploads is the helper of tests/bench/uploads.sh: it writes the
// multipart upload bodies and fires a batch of concurrent POSTs at the proxy
// while it samples the proxy's memory and file descriptors from /proc.
//
//	uploads gen  -kind binary|text|small -bytes N -out FILE
//	uploads fire -url URL -body FILE -type CT -n 100 -pid PID [-metrics URL] [-file-bytes N]
//
// gen prints the size of the file part (0 for small) and the Content-Type
// to send (with the boundary), on one line. fire prints a human summary to stderr and one line
// "RESULT key=value ..." to stdout for the script. It exits 1 unless every
// request got 200 (and, with -file-bytes, the upstream saw that many file
// bytes).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: uploads gen|fire [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(os.Args[2:])
	case "fire":
		err = fire(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (gen, fire)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "uploads:", err)
		os.Exit(1)
	}
}

// ------------------------------------------------------------------ gen ---

// words make the text file: ordinary English words, so the token counter
// sees the kind of text it sees in production (about 4 bytes per token).
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all we their has would when if
so no will can more other what time up about into than them only could new some these then two
first may any like now my such make over our even most after also made many before must through
back years where much your way well down should because each just those people how too little
state good very world still own see men work long here get both between life being under never
day same another know while last might us great old year off come since against go came right
used take three proxy request limit upload document summary token model budget caller window`)

type procSample struct {
	rssKB, hwmKB int64
	fds, spool   int
}

// readProc reads VmRSS and VmHWM of pid, its open fd count and how many of
// those are spooled bodies (unlinked ratelimit-proxy-body-* files).
func readProc(pid int) (procSample, error) {
	var s procSample
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "VmRSS":
			s.rssKB = kb(v)
		case "VmHWM":
			s.hwmKB = kb(v)
		}
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return s, err
	}
	s.fds = len(ents)
	for _, e := range ents {
		t, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.Contains(filepath.Base(t), "ratelimit-proxy-body-") {
			s.spool++
		}
	}
	return s, nil
}

// sockets classifies pid's open TCP sockets on loopback: connections
// accepted on port local (clients of the proxy) and connections to port
// remote (the proxy's connections to the upstream).
func sockets(pid, local, remote int) (clients, upstream int) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, _ := os.ReadDir(dir)
	inodes := map[string]bool{}
	for _, e := range ents {
		t, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(t, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(t, "socket:["), "]")] = true
		}
	}
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/" + table)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			f := strings.Fields(line)
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || !inodes[f[9]] || f[3] == "0A" { // 0A: listening
				continue
			}
			switch {
			case hexPort(f[1]) == local:
				clients++
			case hexPort(f[2]) == remote:
				upstream++
			}
		}
	}
	return clients, upstream
}

func hexPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseInt(p, 16, 32)
	return int(n)
}

// cpuSeconds is pid's user + system CPU time (fields 14 and 15 of
// /proc/PID/stat, in clock ticks of 1/100 s on Linux).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	_, rest, ok := strings.Cut(string(b), ") ") // the command may hold spaces
	if !ok {
		return 0
	}
	f := strings.Fields(rest) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100
}

func kb(v string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
	return n
}

// scrape returns the named gauges of a Prometheus text exposition.
func scrape(client *http.Client, url string, names ...string) map[string]float64 {
	out := map[string]float64{}
	resp, err := client.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && slices.Contains(names, name) {
			if f, err := strconv.ParseFloat(val, 64); err == nil {
				out[name] = f
			}
		}
	}
	return out
}

var memGauges = []string{"go_memstats_heap_inuse_bytes", "go_memstats_heap_sys_bytes", "go_memstats_sys_bytes", "go_memstats_heap_released_bytes"}

type result struct {
	status  int
	latency time.Duration
	err     error
	files   []fileInfo
}

// fileInfo is one file as the mock API's /api/chat reports it.
type fileInfo struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

func fire(args []string) error {
	fs := flag.NewFlagSet("fire", flag.ContinueOnError)
	url := fs.String("url", "", "`URL` to POST to")
	bodyPath := fs.String("body", "", "request body `file`")
	ctype := fs.String("type", "", "Content-Type header")
	n := fs.Int("n", 100, "concurrent requests")
	pid := fs.Int("pid", 0, "`PID` of the proxy to sample")
	interval := fs.Duration("interval", 50*time.Millisecond, "/proc sampling interval")
	metrics := fs.String("metrics", "", "admin /metrics `URL` to sample go_memstats_* from (every 250 ms)")
	fileBytes := fs.Int64("file-bytes", 0, "if > 0, the upstream (mock API) must report this many bytes for the file part")
	timeout := fs.Duration("timeout", 5*time.Minute, "overall timeout of the batch")
	settle := fs.Duration("settle", time.Second, "wait after the batch before the 'after' reading")
	upPort := fs.Int("upstream-port", 0, "if > 0, count the proxy's open connections to this port after the batch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *bodyPath == "" || *ctype == "" || *pid <= 0 {
		return errors.New("fire: -url, -body, -type and -pid are required")
	}
	st, err := os.Stat(*bodyPath)
	if err != nil {
		return err
	}
	size := st.Size()

	before, err := readProc(*pid)
	if err != nil {
		return fmt.Errorf("reading /proc/%d: %w", *pid, err)
	}
	mclient := &http.Client{Timeout: 2 * time.Second}
	var memBefore map[string]float64
	if *metrics != "" {
		memBefore = scrape(mclient, *metrics, memGauges...)
	}

	// Samplers: /proc every interval, /metrics every 250 ms.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := before
	samples := 0
	wg.Go(func() {
		t := time.NewTicker(*interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			s, err := readProc(*pid)
			if err != nil {
				continue
			}
			mu.Lock()
			samples++
			peak.rssKB = max(peak.rssKB, s.rssKB)
			peak.hwmKB = max(peak.hwmKB, s.hwmKB)
			peak.fds = max(peak.fds, s.fds)
			peak.spool = max(peak.spool, s.spool)
			mu.Unlock()
		}
	})
	memPeak := maps.Clone(memBefore)
	if memPeak == nil {
		memPeak = map[string]float64{}
	}
	if *metrics != "" {
		wg.Go(func() {
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				for k, v := range scrape(mclient, *metrics, memGauges...) {
					mu.Lock()
					memPeak[k] = max(memPeak[k], v)
					mu.Unlock()
				}
			}
		})
	}

	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: *n,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	results := make([]result, *n)
	release := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := range *n {
		ready.Add(1)
		done.Go(func() {
			r := &results[i]
			f, err := os.Open(*bodyPath)
			if err != nil {
				ready.Done()
				r.err = err
				return
			}
			defer f.Close()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, *url, f)
			if err != nil {
				ready.Done()
				r.err = err
				return
			}
			req.ContentLength = size
			req.Header.Set("Content-Type", *ctype)
			ready.Done()
			<-release
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				r.err = err
				r.latency = time.Since(t0)
				return
			}
			b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			r.latency = time.Since(t0)
			r.status = resp.StatusCode
			if err != nil {
				r.err = err
				return
			}
			if resp.StatusCode == http.StatusOK && *fileBytes > 0 {
				var body struct {
					Files []fileInfo `json:"files"`
				}
				if err := json.Unmarshal(b, &body); err != nil {
					r.err = fmt.Errorf("upstream answer is not the mock's JSON: %w", err)
					return
				}
				r.files = body.Files
			} else if resp.StatusCode != http.StatusOK {
				r.err = fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
			}
		})
	}
	ready.Wait()
	cpu0 := cpuSeconds(*pid)
	start := time.Now()
	close(release)
	done.Wait()
	wall := time.Since(start)
	cpu := cpuSeconds(*pid) - cpu0
	tr.CloseIdleConnections() // so the proxy's client-side fds can go

	time.Sleep(*settle)
	close(stop)
	wg.Wait()
	after, _ := readProc(*pid)
	listenPort := 0
	if u, err := neturl.Parse(*url); err == nil {
		listenPort, _ = strconv.Atoi(u.Port())
	}
	clientConns, upConns := sockets(*pid, listenPort, *upPort)
	var memAfter map[string]float64
	if *metrics != "" {
		memAfter = scrape(mclient, *metrics, memGauges...)
	}

	// Tally.
	statuses := map[int]int{}
	var lat []time.Duration
	var failures []string
	for i, r := range results {
		statuses[r.status]++
		lat = append(lat, r.latency)
		switch {
		case r.err != nil:
			failures = append(failures, fmt.Sprintf("request %d: %v", i, r.err))
		case r.status != http.StatusOK:
			failures = append(failures, fmt.Sprintf("request %d: status %d", i, r.status))
		case *fileBytes > 0 && (len(r.files) != 1 || r.files[0].Bytes != *fileBytes):
			failures = append(failures, fmt.Sprintf("request %d: upstream saw files %+v, want one of %d bytes", i, r.files, *fileBytes))
		}
	}
	slices.Sort(lat)
	ok := statuses[http.StatusOK]
	var codes []string
	for c, k := range statuses {
		codes = append(codes, fmt.Sprintf("%d:%d", c, k))
	}
	slices.Sort(codes)

	mb := func(kb int64) string { return fmt.Sprintf("%.1f", float64(kb)/1024) }
	mib := func(m map[string]float64, k string) string {
		if v, ok := m[k]; ok {
			return fmt.Sprintf("%.1f", v/(1<<20))
		}
		return "-"
	}
	fmt.Fprintf(os.Stderr, "  %d x %d B: %d x 200 (%s) in %.2fs; latency p50 %.2fs max %.2fs; proxy CPU %.2fs\n",
		*n, size, ok, strings.Join(codes, " "), wall.Seconds(), pct(lat, 50).Seconds(), lat[len(lat)-1].Seconds(), cpu)
	fmt.Fprintf(os.Stderr, "  RSS MiB: before %s, sampled peak %s (%d samples), after %s; VmHWM before %s, after %s\n",
		mb(before.rssKB), mb(peak.rssKB), samples, mb(after.rssKB), mb(before.hwmKB), mb(after.hwmKB))
	fmt.Fprintf(os.Stderr, "  fds: before %d, peak %d, after %d (of which client connections %d, idle upstream connections %d); spooled body files open: peak %d, after %d\n",
		before.fds, peak.fds, after.fds, clientConns, upConns, peak.spool, after.spool)
	if *metrics != "" {
		fmt.Fprintf(os.Stderr, "  Go heap_inuse MiB: before %s, peak %s, after %s; heap_sys peak %s; sys peak %s\n",
			mib(memBefore, "go_memstats_heap_inuse_bytes"), mib(memPeak, "go_memstats_heap_inuse_bytes"),
			mib(memAfter, "go_memstats_heap_inuse_bytes"), mib(memPeak, "go_memstats_heap_sys_bytes"),
			mib(memPeak, "go_memstats_sys_bytes"))
	}
	fmt.Printf("RESULT n=%d ok=%d body_bytes=%d wall_s=%.2f cpu_s=%.2f p50_s=%.2f max_s=%.2f rss_before_mib=%s rss_peak_mib=%s rss_after_mib=%s hwm_before_mib=%s hwm_after_mib=%s fds_before=%d fds_peak=%d fds_after=%d client_conns_after=%d upstream_conns_after=%d spool_peak=%d spool_after=%d heap_inuse_peak_mib=%s heap_sys_peak_mib=%s go_sys_peak_mib=%s samples=%d\n",
		*n, ok, size, wall.Seconds(), cpu, pct(lat, 50).Seconds(), lat[len(lat)-1].Seconds(),
		mb(before.rssKB), mb(peak.rssKB), mb(after.rssKB), mb(before.hwmKB), mb(after.hwmKB),
		before.fds, peak.fds, after.fds, clientConns, upConns, peak.spool, after.spool,
		mib(memPeak, "go_memstats_heap_inuse_bytes"), mib(memPeak, "go_memstats_heap_sys_bytes"),
		mib(memPeak, "go_memstats_sys_bytes"), samples)
	if len(failures) > 0 {
		for i, f := range failures {
			if i == 5 {
				fmt.Fprintf(os.Stderr, "  ... and %d more\n", len(failures)-5)
				break
			}
			fmt.Fprintln(os.Stderr, "  FAIL", f)
		}
		return fmt.Errorf("%d of %d requests failed", len(failures), *n)
	}
	if after.spool != 0 {
		return fmt.Errorf("%d spooled body files still open after the batch", after.spool)
	}
	return nil
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}
