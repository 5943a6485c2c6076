// Command plainproxy is the "plain ReverseProxy" reference of the load test
// in tests/bench/compare.sh: httputil.NewSingleHostReverseProxy with the
// default transport and a default http.Server, no guards and no tuning. It
// shows what the Go standard library alone costs per proxied request, so the
// guard chain's share of ratelimit-proxy's cost can be read off.
//
//	go run ./tests/bench/plainproxy -listen 127.0.0.1:8081 -upstream http://127.0.0.1:8082
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "`address` to listen on")
	upstream := flag.String("upstream", "", "upstream base `URL`, e.g. http://127.0.0.1:8082")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil || target.Scheme == "" || target.Host == "" {
		log.Fatalf("plainproxy: -upstream must be an absolute URL, got %q", *upstream)
	}
	log.Fatal(http.ListenAndServe(*listen, httputil.NewSingleHostReverseProxy(target)))
}
