package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
)

// forwarder is the handler New returns. It does what httputil.ReverseProxy
// with our Rewrite did, without its per-request overhead (a deep
// Request.Clone, header Del/Set after the copy, an httptrace context, a
// mime.ParseMediaType per response), and it flushes a streamed response
// only when the upstream has nothing more buffered, so SSE events that
// arrive together leave in one write. Protocol upgrades still go to
// upgrades, which tunnels a 101.
type forwarder struct {
	o        Options
	target   *url.URL
	rt       http.RoundTripper
	trust    func(*http.Request) bool
	clientIP func(*http.Request) netip.Addr
	claims   claimSet
	upgrades *httputil.ReverseProxy
	buffers  bufferPool
}

// outgoing is everything one forwarded request needs besides its header
// map, in one allocation.
type outgoing struct {
	req   http.Request
	url   url.URL
	ctx   traceCtx
	trace httptrace.ClientTrace
	body  noCloseBody
	vals  [6]string // the values of the headers the proxy sets
	nvals int

	w    http.ResponseWriter
	mu   sync.Mutex // against a 1xx reported after RoundTrip returned
	done bool
}

// value returns a one-element header value backed by o.vals.
func (o *outgoing) value(v string) []string {
	if o.nvals == len(o.vals) {
		return []string{v}
	}
	i := o.nvals
	o.nvals++
	o.vals[i] = v
	return o.vals[i : i+1 : i+1]
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, in *http.Request) {
	if upgradeType(in.Header) != "" {
		f.upgrades.ServeHTTP(w, in)
		return
	}
	o := &outgoing{w: w}
	out := f.outgoing(o, in)
	if out.Body == &o.body {
		defer o.body.closed.Store(true)
	}

	res, err := f.rt.RoundTrip(out)
	o.mu.Lock()
	o.done = true
	o.mu.Unlock()
	if err != nil {
		f.fail(w, out, err)
		return
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		// No upgrade was asked for (those go to f.upgrades): the upstream
		// may not switch this connection.
		if !f.modifyResponse(w, res, out) {
			return
		}
		res.Body.Close()
		f.fail(w, out, errUnrequestedSwitch)
		return
	}
	removeHopByHop(res.Header)
	if !f.modifyResponse(w, res, out) {
		return
	}
	dst := w.Header()
	for k, vv := range res.Header {
		if prior, ok := dst[k]; ok {
			dst[k] = append(prior, vv...)
		} else {
			dst[k] = vv // the response is ours alone: its values can be shared
		}
	}
	announced := len(res.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range res.Trailer {
			keys = append(keys, k)
		}
		dst.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(res.StatusCode)

	if err := f.copyBody(w, res); err != nil {
		defer res.Body.Close()
		// The head is sent: all that can be done is cutting the response,
		// so that the client sees it incomplete (net/http's server recovers
		// http.ErrAbortHandler and closes the connection).
		if in.Context().Value(http.ServerContextKey) != nil {
			panic(http.ErrAbortHandler)
		}
		return
	}
	res.Body.Close() // now: it fills res.Trailer

	if len(res.Trailer) > 0 {
		// Chunked, so that the trailers can follow the body.
		http.NewResponseController(w).Flush()
	}
	if len(res.Trailer) == announced {
		for k, vv := range res.Trailer {
			dst[k] = append(dst[k], vv...)
		}
		return
	}
	for k, vv := range res.Trailer {
		k = http.TrailerPrefix + k
		dst[k] = append(dst[k], vv...)
	}
}

var errUnrequestedSwitch = errors.New("upstream: switched protocols unasked") // a 502

// fail answers a request the upstream did not serve.
func (f *forwarder) fail(w http.ResponseWriter, out *http.Request, err error) {
	status := Status(out.Context(), err)
	if f.o.ErrorHandler != nil {
		f.o.ErrorHandler(w, out, status)
		return
	}
	if status != StatusClientClosed {
		w.WriteHeader(status)
	}
}

// modifyResponse calls Options.ModifyResponse; false when it failed and
// the client has had its 502.
func (f *forwarder) modifyResponse(w http.ResponseWriter, res *http.Response, out *http.Request) bool {
	if f.o.ModifyResponse == nil {
		return true
	}
	if err := f.o.ModifyResponse(res); err != nil {
		res.Body.Close()
		f.fail(w, out, err)
		return false
	}
	return true
}

// outgoing builds the request sent upstream in o: a shallow copy of in
// with the target's URL, a header map filled in one pass over in's
// headers (without the hop-by-hop ones and, from an untrusted peer, the
// client-address claims), and the headers the proxy sets.
func (f *forwarder) outgoing(o *outgoing, in *http.Request) *http.Request {
	ctx := in.Context()
	if traceKey != nil && httptrace.ContextClientTrace(ctx) == nil {
		o.trace.Got1xxResponse = o.got1xx
		o.ctx = traceCtx{Context: ctx, trace: &o.trace}
		ctx = &o.ctx
	} else {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: o.got1xx})
	}
	o.req = *in.WithContext(ctx)
	out := &o.req

	o.url = *in.URL
	out.URL = &o.url
	out.URL.RawQuery = cleanQueryParams(out.URL.RawQuery)
	rewriteRequestURL(out, f.target)
	out.Host = ""
	out.Close = false

	if in.ContentLength == 0 {
		out.Body = nil // so that net/http's transport may retry it
	}
	if out.Body != nil {
		var b io.ReadCloser
		if f.o.OutgoingBody != nil {
			b = f.o.OutgoingBody(in)
		}
		if b == nil {
			// The transport closes the body it sent; the inbound body is
			// the server's to close (closing it early can hang on a
			// 100-continue request).
			o.body.rc = out.Body
			b = &o.body
		}
		out.Body = b
	}
	out.Header = f.header(o, in)
	return out
}

// header returns the outgoing request's header map.
func (f *forwarder) header(o *outgoing, in *http.Request) http.Header {
	ih := in.Header
	trusted := f.trust(in)
	h := make(http.Header, len(ih)+4)
	var listed []string
	if conn := ih["Connection"]; len(conn) > 0 {
		var buf [8]string
		listed = connectionListed(buf[:0], conn)
	}
	for k, vv := range ih {
		if hopByHop(k) || !trusted && f.claims.has(k) {
			continue
		}
		if len(listed) > 0 && contains(listed, k) {
			continue
		}
		h[k] = vv // the inbound values are read-only here: share them
	}
	if hasToken(ih["Te"], "trailers") {
		h["Te"] = o.value("trailers")
	}
	if _, ok := h["X-Real-Ip"]; !trusted || !ok {
		if a := f.clientIP(in); a.IsValid() {
			h["X-Real-Ip"] = o.value(a.String())
		} else {
			delete(h, "X-Real-Ip")
		}
	}
	// X-Forwarded-* as httputil's SetXForwarded sets them; a trusted
	// proxy's chain is kept and the peer appended, its host and proto kept.
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := ih["X-Forwarded-For"]; trusted && len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h["X-Forwarded-For"] = o.value(ip)
	}
	if v := ih["X-Forwarded-Host"]; trusted && len(v) > 0 {
		h["X-Forwarded-Host"] = v
	} else {
		h["X-Forwarded-Host"] = o.value(in.Host)
	}
	if v := ih["X-Forwarded-Proto"]; trusted && len(v) > 0 {
		h["X-Forwarded-Proto"] = v
	} else if in.TLS == nil {
		h["X-Forwarded-Proto"] = protoHTTP
	} else {
		h["X-Forwarded-Proto"] = protoHTTPS
	}
	if v := ih["Forwarded"]; trusted && len(v) > 0 {
		h["Forwarded"] = v
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = o.value("") // none: not the transport's default
	}
	return h
}

// Shared values of headers set on every request; cap 1, so an append
// copies.
var (
	protoHTTP  = []string{"http"}[:1:1]
	protoHTTPS = []string{"https"}[:1:1]
)

// hopByHop reports whether canonical request header k never passes: the
// hop-by-hop headers, HTTP2-Settings (it belongs to a connection), and the
// inbound forwarding headers, which the proxy sets itself.
func hopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Http2-Settings",
		"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// hopHeaders are the hop-by-hop response headers.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopByHop removes the hop-by-hop headers from h: those Connection
// names, and the fixed list.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				delete(h, textproto.CanonicalMIMEHeaderKey(sf))
			}
		}
	}
	for _, k := range hopHeaders {
		delete(h, k)
	}
}

// connectionListed appends the canonical names a Connection header lists.
func connectionListed(dst []string, conn []string) []string {
	for _, f := range conn {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				dst = append(dst, textproto.CanonicalMIMEHeaderKey(sf))
			}
		}
	}
	return dst
}

func contains(list []string, k string) bool {
	for _, s := range list {
		if s == k {
			return true
		}
	}
	return false
}

// hasToken reports whether a comma-separated header lists token
// (case-insensitively).
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// upgradeType is the protocol a request asks to switch to, as
// httputil.ReverseProxy reads it: Upgrade, when Connection lists upgrade.
func upgradeType(h http.Header) string {
	if !hasToken(h["Connection"], "upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// rewriteRequestURL is httputil.ProxyRequest.SetURL's rewrite: target's
// scheme and host, its path joined with the request's, its query before
// the request's.
func rewriteRequestURL(req *http.Request, target *url.URL) {
	targetQuery := target.RawQuery
	req.URL.Scheme = target.Scheme
	req.URL.Host = target.Host
	req.URL.Path, req.URL.RawPath = joinURLPath(target, req.URL)
	if targetQuery == "" || req.URL.RawQuery == "" {
		req.URL.RawQuery = targetQuery + req.URL.RawQuery
	} else {
		req.URL.RawQuery = targetQuery + "&" + req.URL.RawQuery
	}
}

func singleJoiningSlash(a, b string) string {
	aslash := strings.HasSuffix(a, "/")
	bslash := strings.HasPrefix(b, "/")
	switch {
	case aslash && bslash:
		return a + b[1:]
	case !aslash && !bslash:
		return a + "/" + b
	}
	return a + b
}

func joinURLPath(a, b *url.URL) (path, rawpath string) {
	if a.RawPath == "" && b.RawPath == "" {
		return singleJoiningSlash(a.Path, b.Path), ""
	}
	apath := a.EscapedPath()
	bpath := b.EscapedPath()
	aslash := strings.HasSuffix(apath, "/")
	bslash := strings.HasPrefix(bpath, "/")
	switch {
	case aslash && bslash:
		return a.Path + b.Path[1:], apath + bpath[1:]
	case !aslash && !bslash:
		return a.Path + "/" + b.Path, apath + "/" + bpath
	}
	return a.Path + b.Path, apath + bpath
}

// maxQueryParams is net/url's default bound on query parameters.
const maxQueryParams = 10000

// reencodeQuery: GODEBUG=urlmaxqueryparams set, under which
// httputil.ReverseProxy always re-encodes the query.
var reencodeQuery = strings.Contains(os.Getenv("GODEBUG"), "urlmaxqueryparams=")

// cleanQueryParams removes what url.ParseQuery cannot parse from a query,
// as httputil.ReverseProxy does: a query with a ';', a bad %-escape or too
// many parameters is parsed and re-encoded; any other passes as it is.
func cleanQueryParams(s string) string {
	reencode := func(s string) string {
		v, _ := url.ParseQuery(s)
		return v.Encode()
	}
	if reencodeQuery || strings.Count(s, "&")+1 > maxQueryParams {
		return reencode(s)
	}
	for i := 0; i < len(s); {
		switch s[i] {
		case ';':
			return reencode(s)
		case '%':
			if i+2 >= len(s) || !ishex(s[i+1]) || !ishex(s[i+2]) {
				return reencode(s)
			}
			i += 3
		default:
			i++
		}
	}
	return s
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// got1xx passes an informational response to the client, as
// httputil.ReverseProxy does.
func (o *outgoing) got1xx(code int, header textproto.MIMEHeader) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return nil // the response writer is the handler's again
	}
	h := o.w.Header()
	for k, vv := range header {
		h[k] = append(h[k], vv...)
	}
	o.w.WriteHeader(code)
	clear(h) // WriteHeader keeps a 1xx's headers in the map
	return nil
}

// noCloseBody is the inbound body sent upstream: Close only stops
// reading, the server closes the body itself.
type noCloseBody struct {
	rc     io.ReadCloser
	closed atomic.Bool
}

func (b *noCloseBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, io.EOF
	}
	return b.rc.Read(p)
}

func (b *noCloseBody) Close() error {
	b.closed.Store(true)
	return nil
}

// traceCtx is a context carrying an httptrace.ClientTrace without the
// allocations of httptrace.WithClientTrace: it answers httptrace's key
// itself. traceKey is that key, learnt at start-up (nil if it cannot be,
// and then WithClientTrace is used).
type traceCtx struct {
	context.Context
	trace *httptrace.ClientTrace
}

func (c *traceCtx) Value(k any) any {
	if k == traceKey {
		return c.trace
	}
	return c.Context.Value(k)
}

var traceKey any

func init() {
	p := &keyProbe{Context: context.Background()}
	httptrace.ContextClientTrace(p)
	if p.key == nil || !reflect.TypeOf(p.key).Comparable() {
		return
	}
	traceKey = p.key
	t := &httptrace.ClientTrace{}
	if httptrace.ContextClientTrace(&traceCtx{Context: context.Background(), trace: t}) != t {
		traceKey = nil
	}
}

// keyProbe records the key its Value is asked for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(k any) any {
	p.key = k
	return nil
}

// buffered is a body that can tell how many bytes it has at hand: *h1.Body,
// and the usage reader wrapping one.
type buffered interface{ Buffered() int }

// copyBody copies the response body to the client with a pooled buffer.
// A stream (text/event-stream, or of unknown length) is flushed after a
// write when the body has nothing more buffered, so that what the upstream
// sent together (SSE events of one burst) leaves together, and what it
// sent apart leaves at once; a body that cannot tell is flushed after every
// write. A body of known length is never flushed midway: the server's
// buffer sends it in as few writes as it can. A stream whose body can push
// itself (an h1 connection's, on Linux) does so: it reads no more often
// than bytes come (upstream/h1/push_linux.go says why).
func (f *forwarder) copyBody(w http.ResponseWriter, res *http.Response) error {
	body := res.Body
	var flush func() error
	var bb buffered
	if isStream(res) {
		flush = http.NewResponseController(w).Flush
		bb, _ = body.(buffered)
		if bb == nil || bb.Buffered() == 0 {
			flush() // the head at once: the first event may take a while
		}
	}
	bp := f.buffers.get()
	defer f.buffers.put(bp)
	buf := *bp
	if p, ok := body.(pusher); ok && flush != nil {
		if pushed, err := p.Push(w, flush, buf); pushed {
			return err
		}
	}
	for {
		nr, rerr := body.Read(buf)
		if nr > 0 {
			nw, werr := w.Write(buf[:nr])
			if werr != nil {
				return werr
			}
			if nw != nr {
				return io.ErrShortWrite
			}
			if flush != nil && rerr == nil && (bb == nil || bb.Buffered() == 0) {
				flush() // a writer that cannot flush sends when its buffer fills
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return nil // the server flushes the end
			}
			return rerr
		}
	}
}

// pusher is a body that copies itself to a writer as it comes, flushing
// when its source has nothing more to give (h1.Body on Linux, and the
// usage reader in front of one): a stream then costs no read that finds
// nothing. pushed is false when it cannot, and nothing was read.
type pusher interface {
	Push(w io.Writer, flush func() error, buf []byte) (pushed bool, err error)
}

// isStream reports whether a response is a stream: an event stream, or a
// body of unknown length.
func isStream(res *http.Response) bool {
	if res.ContentLength == -1 {
		return true
	}
	ct := res.Header["Content-Type"]
	if len(ct) == 0 {
		return false
	}
	mt, _, _ := strings.Cut(ct[0], ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}
