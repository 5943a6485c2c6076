// Package upstream forwards admitted requests to the protected API:
// httputil.ReverseProxy with Rewrite over NewTransport (upstream/h1's
// pooled HTTP/1.1 client for http://, a tuned http.Transport for https://
// and upgrades), streaming responses flushed as they arrive and
// transport errors classified into 502 and 504.
package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
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
	// ClientIP is the client address the proxy used for r, sent as
	// X-Real-IP; when nil, the socket peer.
	ClientIP func(r *http.Request) netip.Addr
	// NoUpgrade: the requests passed the guard chain, so no protocol
	// upgrade is forwarded (the upstream answers a plain request and
	// nothing unguarded can follow on the connection). Otherwise only
	// WebSocket upgrades are.
	NoUpgrade bool
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
	// ModifyResponse, when set, is ReverseProxy's: it may wrap the body of
	// the upstream's response before it is copied to the client.
	ModifyResponse func(*http.Response) error
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
	clientIP := o.ClientIP
	if clientIP == nil {
		clientIP = peer
	}
	rt := o.Transport
	if rt == nil {
		rt = NewTransport(o.Target, o.ResponseHeaderTimeout)
	}
	claims := newClaimSet()
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			if o.OutgoingBody != nil && pr.Out.Body != nil {
				if b := o.OutgoingBody(pr.In); b != nil {
					pr.Out.Body = b
				}
			}
			pr.SetURL(target)
			stripUpgrade(pr.Out.Header, o.NoUpgrade)
			if trust(pr.In) {
				// A trusted proxy's client-address headers are kept;
				// X-Real-IP is added when it sent none.
				if _, ok := pr.Out.Header["X-Real-Ip"]; !ok {
					setRealIP(pr.Out.Header, clientIP(pr.In))
				}
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
			// An untrusted client's claims about its address never reach
			// the upstream: X-Real-IP is the address the proxy used.
			for k := range pr.Out.Header {
				if claims.has(k) {
					delete(pr.Out.Header, k)
				}
			}
			setRealIP(pr.Out.Header, clientIP(pr.In))
			pr.SetXForwarded() // ReverseProxy has dropped the inbound X-Forwarded-* and Forwarded
		},
		Transport:      rt,
		ModifyResponse: o.ModifyResponse,
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

// clientAddressHeaders are the request headers that claim a client
// address (SPEC §4.5). From an untrusted peer they are removed, as are
// spellings with _ for - (which CGI-style servers read as the same
// header) and of the X-Forwarded-* and Forwarded headers, before the
// proxy sets X-Real-IP and X-Forwarded-* itself.
var clientAddressHeaders = []string{
	"X-Real-IP", "True-Client-IP", "CF-Connecting-IP", "X-Client-IP", "X-Cluster-Client-IP", "Fastly-Client-IP",
	// Others in common use, by ingress-nginx, Envoy, Akamai and mail or
	// web frameworks.
	"X-Original-Forwarded-For", "X-Forwarded", "Forwarded-For", "X-Originating-IP", "X-Remote-IP",
	"X-Remote-Addr", "Client-IP", "X-Envoy-External-Address",
}

// forwardingHeaders are rewritten by SetXForwarded; only their _
// spellings need removing.
var forwardingHeaders = []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"}

// claimSet holds the canonical names of clientAddressHeaders, and of both
// lists in their _ spelling.
type claimSet map[string]bool

func newClaimSet() claimSet {
	s := claimSet{}
	for _, h := range clientAddressHeaders {
		s[textproto.CanonicalMIMEHeaderKey(h)] = true
	}
	for _, h := range append(append([]string(nil), clientAddressHeaders...), forwardingHeaders...) {
		s[textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(h, "-", "_"))] = true
	}
	return s
}

// has reports whether header name k, canonical as the server makes every
// name it parses (X_REAL_IP arrives as X_real_ip), claims a client address.
func (s claimSet) has(k string) bool { return s[k] }

// setRealIP sets X-Real-IP to a, or removes it when a is unknown.
func setRealIP(h http.Header, a netip.Addr) {
	if !a.IsValid() {
		delete(h, "X-Real-Ip")
		return
	}
	h["X-Real-Ip"] = []string{a.String()}
}

// peer is the socket peer of r; invalid when RemoteAddr is not an address.
func peer(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap()
	}
	a, _ := netip.ParseAddr(r.RemoteAddr)
	return a.Unmap()
}

// stripUpgrade removes a protocol upgrade from an outgoing request's
// headers: any upgrade when none may pass, otherwise any but WebSocket.
// ReverseProxy has already reduced the hop-by-hop headers to
// "Connection: Upgrade" and the requested Upgrade, which it then tunnels
// if the upstream answers 101; without them the upstream answers a plain
// request (and a 101 anyway is a 502). An h2c upgrade (RFC 7540 §3.2)
// would hand the client an HTTP/2 connection to the upstream on which no
// request is guarded, so only WebSocket passes on unprotected routes.
// HTTP2-Settings belongs to the connection and never passes.
func stripUpgrade(h http.Header, none bool) {
	delete(h, "Http2-Settings")
	up, ok := h["Upgrade"]
	if !ok {
		return
	}
	if !none && websocketOnly(up) {
		return
	}
	delete(h, "Upgrade")
	delete(h, "Connection")
}

// WebSocketUpgrade reports whether h asks for an upgrade that is tunnelled
// on an unprotected route: WebSocket only.
func WebSocketUpgrade(h http.Header) bool {
	up, ok := h["Upgrade"]
	return ok && websocketOnly(up)
}

// websocketOnly reports whether every protocol an Upgrade header offers is
// WebSocket.
func websocketOnly(values []string) bool {
	seen := false
	for _, v := range values {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" {
				if !strings.EqualFold(tok, "websocket") {
					return false
				}
				seen = true
			}
		}
	}
	return seen
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

// NewTransport returns the transport used towards the upstream target.
// For an http:// upstream it is an h1.Client: one LIFO pool of kept-alive
// connections to the one origin, each request written in one write, the
// response head parsed from the read buffer; the requests it does not
// carry itself (WebSocket upgrades, which need a 101 with a writable
// body, and requests with trailers) go to the tuned http.Transport. For
// an https:// upstream it is the tuned http.Transport alone (TLS, its
// session cache and HTTP/2 stay net/http's). Both bound the dial to 10 s
// and the response-header wait to responseHeader.
func NewTransport(target *url.URL, responseHeader time.Duration) http.RoundTripper {
	tr := NewHTTPTransport(responseHeader)
	if target == nil || target.Scheme != "http" {
		return tr
	}
	return h1.New(h1.Options{
		Host:                  target.Host,
		DialTimeout:           10 * time.Second,
		ResponseHeaderTimeout: responseHeader,
		MaxIdle:               1024,
		IdleTimeout:           90 * time.Second,
		Fallback:              tr,
	})
}

// NewHTTPTransport returns the net/http transport used towards an https
// upstream, and for upgrades to an http one: one host, so the idle pool
// per host is as large as the total; bounded dial and TLS handshakes; the
// response-header wait bounded by responseHeader.
func NewHTTPTransport(responseHeader time.Duration) *http.Transport {
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
