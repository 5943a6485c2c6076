package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// streamChunks is the length of the benchmark's SSE stream.
const streamChunks = 200

// sseUpstream streams streamChunks OpenAI chat chunks, one flushed write
// each, with OpenAI's usage members when the request asks for usage.
func sseUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &req)
		null := ""
		if req.StreamOptions.IncludeUsage {
			null = `,"usage":null`
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range streamChunks {
			io.WriteString(w, `data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":" word`+strconv.Itoa(i)+`"},"logprobs":null,"finish_reason":null}]`+null+"}\n\n")
			f.Flush()
		}
		if req.StreamOptions.IncludeUsage {
			io.WriteString(w, `data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":400,"total_tokens":440}}`+"\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStream is a 200-chunk SSE stream through the proxy over
// loopback (client, proxy and upstream in this process): requests-rule
// counts requests only (chat_rpm); total-tokens adds a total_tokens rule
// whose client did not ask for usage (the proxy asks, reads it and takes
// it out), total-tokens-asked one whose client did. ns/chunk is the whole
// stream's time per chunk, cpu-ns/chunk the CPU the process (client,
// proxy and upstream together) spent per chunk, ttfb-µs the time to the
// first event.
func BenchmarkStream(b *testing.B) {
	up := httptest.NewServer(sseUpstream())
	defer up.Close()
	plain := `{"model":"gpt-4o","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"Count to two hundred, one word per line."}]}`
	asked := `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"max_tokens":1000,"messages":[{"role":"user","content":"Count to two hundred, one word per line."}]}`
	for _, tc := range []struct {
		name   string
		tokens bool
		body   string
	}{
		{"requests-rule", false, plain},
		{"total-tokens", true, plain},
		{"total-tokens-asked", true, asked},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := config.Default()
			cfg.UpstreamURL = up.URL
			cfg.ChatRPM = 1 << 40
			if tc.tokens {
				cfg.Rules = []config.Rule{{Name: "tpm", Methods: []string{"POST"}, Key: []string{"caller"}, OnMissingKey: "skip",
					Algorithm: config.AlgSlidingWindow, Limit: 1 << 50, Window: time.Minute, Cost: config.CostTotalTokens, Action: "reject"}}
			}
			srv := httptest.NewServer(benchProxy(b, cfg, nil))
			defer srv.Close()
			client := srv.Client()
			buf := make([]byte, 32<<10)
			var ttfb time.Duration
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				res, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(tc.body)))
				if err != nil {
					b.Fatal(err)
				}
				n, err := res.Body.Read(buf)
				ttfb += time.Since(start)
				for err == nil {
					_, err = res.Body.Read(buf)
				}
				res.Body.Close()
				if err != io.EOF || n == 0 || res.StatusCode != 200 {
					b.Fatalf("status %d, %v", res.StatusCode, err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N)/streamChunks, "cpu-ns/chunk")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/streamChunks, "ns/chunk")
			b.ReportMetric(float64(ttfb.Microseconds())/float64(b.N), "ttfb-µs")
		})
	}
}
