// Package upstream forwards admitted requests to the protected API:
// httputil.ReverseProxy with Rewrite, a transport tuned for many concurrent
// long-lived requests, streaming responses flushed as they arrive and
// transport errors classified into 502 and 504.
package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"
)

// Options configures New.
type Options struct {
	Target *url.URL // scheme, host and base path of the protected API
	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers (504 past it). A response body, once started, is never cut.
	ResponseHeaderTimeout time.Duration
	// TrustForwarded reports whether r came from a trusted proxy, whose
	// X-Forwarded-* headers are kept (and the peer appended to
	// X-Forwarded-For); from anyone else they are replaced.
	TrustForwarded func(r *http.Request) bool
	// ErrorHandler answers a request the upstream could not serve; status
	// is 502, 504, or 499 when the client went away first.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, status int)
	// Transport replaces the default tuned transport (tests).
	Transport http.RoundTripper
	// OutgoingBody, when set and returning non-nil, is the body sent
	// upstream instead of ReverseProxy's wrapper of the inbound one. A
	// NopCloser around a bytes.Reader lets the transport write the headers
	// and body in one syscall, which ReverseProxy's wrapper prevents.
	OutgoingBody func(in *http.Request) io.ReadCloser
}

// StatusClientClosed is the status ErrorHandler gets when the client
// cancelled the request (nginx's 499); nothing can be sent then.
const StatusClientClosed = 499

// New returns the forwarding handler.
func New(o Options) *httputil.ReverseProxy {
	target := o.Target
	trust := o.TrustForwarded
	if trust == nil {
		trust = func(*http.Request) bool { return false }
	}
	rt := o.Transport
	if rt == nil {
		rt = NewTransport(o.ResponseHeaderTimeout)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			if o.OutgoingBody != nil && pr.Out.Body != nil {
				if b := o.OutgoingBody(pr.In); b != nil {
					pr.Out.Body = b
				}
			}
			pr.SetURL(target)
			if trust(pr.In) {
				// Keep the chain a trusted proxy built; SetXForwarded
				// appends the peer to it.
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
				if fwd := pr.In.Header["Forwarded"]; len(fwd) > 0 {
					pr.Out.Header["Forwarded"] = fwd
				}
				proto, host := pr.In.Header["X-Forwarded-Proto"], pr.In.Header["X-Forwarded-Host"]
				pr.SetXForwarded()
				if len(proto) > 0 {
					pr.Out.Header["X-Forwarded-Proto"] = proto
				}
				if len(host) > 0 {
					pr.Out.Header["X-Forwarded-Host"] = host
				}
				return
			}
			pr.SetXForwarded() // ReverseProxy has dropped the inbound X-Forwarded-* and Forwarded
		},
		Transport: rt,
		// FlushInterval 0: ReverseProxy already flushes every write of a
		// text/event-stream or unknown-length (chunked) response, and
		// batches writes of a sized body, which saves a syscall per 32 KiB.
		BufferPool: &bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if o.ErrorHandler != nil {
				o.ErrorHandler(w, r, Status(r.Context(), err))
			}
		},
	}
}

// Status maps a forwarding error to the status the client gets: 499 when
// the client is gone, 504 on a timeout, 502 otherwise. The error's text is
// never shown to the client.
func Status(ctx context.Context, err error) int {
	if errors.Is(ctx.Err(), context.Canceled) {
		return StatusClientClosed
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// NewTransport returns the transport used towards the upstream: one host,
// so the idle pool per host is as large as the total; bounded dial and TLS
// handshakes; the response-header wait bounded by responseHeader.
func NewTransport(responseHeader time.Duration) *http.Transport {
	return &http.Transport{
		Proxy: nil, // never route the protected API through an environment proxy
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024, // the default of 2 makes every burst re-dial
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		ResponseHeaderTimeout: responseHeader,
		DisableCompression:    true, // pass Accept-Encoding and bodies through untouched
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
}
