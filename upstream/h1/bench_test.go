package h1_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
)

var (
	benchReq  = []byte(`{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"In one sentence, explain why a reverse proxy should rate-limit each caller before it forwards chat requests to an upstream LLM API."}],"temperature":0.2,"max_tokens":64,"stream":false}`)
	benchResp = `{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"To keep it fair."},"finish_reason":"stop"}],"usage":{"prompt_tokens":48,"completion_tokens":6,"total_tokens":54}}`
)

// benchOrigin is a minimal keep-alive HTTP/1.1 origin: it reads a head up
// to its blank line and a Content-Length body, and writes one fixed JSON
// answer. It is as cheap as it can be, so that the clients' costs show.
func benchOrigin(b *testing.B) (string, *int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(benchResp)) + "\r\n\r\n" + benchResp)
	var conns int64
	var mu sync.Mutex
	var open []net.Conn
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns++
			open = append(open, c)
			mu.Unlock()
			go func() {
				defer c.Close()
				br := bufio.NewReaderSize(c, 8<<10)
				for {
					cl := 0
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
						if len(line) > 16 && (line[0] == 'C' || line[0] == 'c') && strings.EqualFold(string(line[:15]), "content-length:") {
							cl, _ = strconv.Atoi(strings.TrimSpace(string(line[15:])))
						}
					}
					if _, err := br.Discard(cl); err != nil {
						return
					}
					if _, err := c.Write(answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), &conns
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runClients runs do from 50 goroutines and reports CPU per request
// (user+sys of the whole process: the clients and the shared origin).
func runClients(b *testing.B, conns *int64, do func() error) {
	b.ReportAllocs()
	b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	cpu := cpuNow()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := do(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuNow()-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(*conns), "conns")
}

// roundTrip sends the proxy's kind of request (an in-memory body as
// OutgoingBody gives it) and reads the answer as ReverseProxy would.
func roundTrip(rt http.RoundTripper, url string) error {
	req, _ := http.NewRequest("POST", url, nil)
	req.Body = io.NopCloser(bytes.NewReader(benchReq))
	req.ContentLength = int64(len(benchReq))
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Authorization"] = []string{"Bearer sk-bench"}
	req.Header["X-Forwarded-For"] = []string{"127.0.0.1"}
	req.Header["User-Agent"] = []string{"wrk"}
	res, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	var buf [1024]byte
	_, err = io.ReadFull(res.Body, buf[:len(benchResp)])
	res.Body.Close()
	return err
}

func BenchmarkClients(b *testing.B) {
	b.Run("h1", func(b *testing.B) {
		addr, conns := benchOrigin(b)
		cl := h1.New(h1.Options{Host: addr})
		defer cl.CloseIdleConnections()
		url := "http://" + addr + "/v1/chat/completions"
		runClients(b, conns, func() error { return roundTrip(cl, url) })
	})
	b.Run("net-http", func(b *testing.B) {
		addr, conns := benchOrigin(b)
		tr := upstream.NewHTTPTransport(0)
		defer tr.CloseIdleConnections()
		url := "http://" + addr + "/v1/chat/completions"
		runClients(b, conns, func() error { return roundTrip(tr, url) })
	})
	b.Run("fasthttp", func(b *testing.B) {
		addr, conns := benchOrigin(b)
		hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1024, MaxIdleConnDuration: 90 * time.Second,
			DisableHeaderNamesNormalizing: true, DisablePathNormalizing: true, NoDefaultUserAgentHeader: true}
		url := "http://" + addr + "/v1/chat/completions"
		runClients(b, conns, func() error { return roundTrip(fastRT{hc}, url) })
	})
}

// fastRT is fasthttp.HostClient behind http.RoundTripper: the cost of
// converting the request and response counts.
type fastRT struct{ hc *fasthttp.HostClient }

func (f fastRT) RoundTrip(r *http.Request) (*http.Response, error) {
	req := fasthttp.AcquireRequest()
	res := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(res)
	req.Header.SetMethod(r.Method)
	req.SetRequestURI(r.URL.String())
	for k, vv := range r.Header {
		for _, v := range vv {
			req.Header.Add(k, v)
		}
	}
	if r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		req.SetBodyRaw(body)
	}
	if err := f.hc.Do(req, res); err != nil {
		return nil, err
	}
	out := &http.Response{StatusCode: res.StatusCode(), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header), Request: r}
	for k, v := range res.Header.All() {
		out.Header.Add(string(k), string(v))
	}
	body := append([]byte(nil), res.Body()...)
	out.ContentLength = int64(len(body))
	out.Body = io.NopCloser(bytes.NewReader(body))
	return out, nil
}

// BenchmarkRoundTripLone is one request at a time: its latency (ns/op)
// and, idle, the process's CPU per request (the origin's included), with
// the processors idle and with each of them busy computing (as when other
// requests' bodies are parsed or tokenized). It measured the cost of the
// yield before sending (RoundTrip) with more than one processor, where
// the client now sends at once.
func BenchmarkRoundTripLone(b *testing.B) {
	for _, busy := range []bool{false, true} {
		name := "idle"
		if busy {
			name = "busy"
		}
		b.Run(name, func(b *testing.B) {
			addr, _ := benchOrigin(b)
			cl := h1.New(h1.Options{Host: addr})
			defer cl.CloseIdleConnections()
			url := "http://" + addr + "/v1/chat/completions"
			var stop atomic.Bool
			var wg sync.WaitGroup
			if busy {
				for range runtime.GOMAXPROCS(0) {
					wg.Go(func() {
						for x := uint64(1); !stop.Load(); x = x*6364136223846793005 + 1 {
						}
					})
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuNow()
			for range b.N {
				if err := roundTrip(cl, url); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if !busy { // the spinners' CPU would swamp it
				b.ReportMetric(float64(cpuNow()-cpu)/float64(b.N), "cpu-ns/op")
			}
			stop.Store(true)
			wg.Wait()
		})
	}
}
