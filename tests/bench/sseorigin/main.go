// Command sseorigin is the streaming upstream of tests/bench/compare.sh's
// MODE=sse: every POST is answered with a chat completion stream of
// -events server-sent events, each written and flushed on its own (so each
// reaches the proxy as a chunk of its own) -gap apart, then
// "data: [DONE]". GET /__stub_status answers in nginx's stub_status form,
// so that compare.sh counts the connections a contender opened to it.
//
//	go run ./tests/bench/sseorigin -listen 127.0.0.1:8082 -events 20 -gap 1ms
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8082", "`address` to listen on")
	events := flag.Int("events", 20, "events per stream")
	gap := flag.Duration("gap", time.Millisecond, "time between events")
	flag.Parse()
	var accepts, requests atomic.Int64
	srv := &http.Server{
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				accepts.Add(1)
			}
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			if r.URL.Path == "/__stub_status" {
				fmt.Fprintf(w, "Active connections: 0\nserver accepts handled requests\n %d %d %d\nReading: 0 Writing: 0 Waiting: 0\n",
					accepts.Load(), accepts.Load(), requests.Load())
				return
			}
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			f := w.(http.Flusher)
			for i := range *events {
				fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\","+
					"\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"finish_reason\":null}]}\n\n", i)
				f.Flush()
				if *gap > 0 {
					time.Sleep(*gap)
				}
			}
			io.WriteString(w, "data: [DONE]\n\n")
		}),
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(ln))
}
