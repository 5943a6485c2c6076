package proxy

import (
	"net/http"
	"net/textproto"
	"strings"
)

// credentialHeaders are the canonical names a caller's credential may
// travel in, with their _ spellings (which CGI-style servers read as the
// same header): with UPSTREAM_AUTHORIZATION none of them reaches the
// upstream.
var credentialHeaders = func() []string {
	var out []string
	for _, h := range []string{"Authorization", "X-Api-Key", "Api-Key"} {
		out = append(out, h, textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(h, "-", "_")))
	}
	return out
}()

// upstreamCredential wraps a forwarding handler: with
// UPSTREAM_AUTHORIZATION set, every request it forwards (protected or not,
// identified by then) loses the caller's credential headers and carries
// the proxy's own credential instead — as Authorization, or on Anthropic's
// paths as X-API-Key unless it is a Bearer token. The provider's key is
// never handed to callers.
func (p *Proxy) upstreamCredential(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pol := p.policy.Load()
		if pol.upstreamAuth == nil {
			next.ServeHTTP(w, r)
			return
		}
		for _, h := range credentialHeaders {
			delete(r.Header, h)
		}
		name := "Authorization"
		if pol.upstreamAuthAnthropic && anthropicPath(canonicalPath(r.URL.Path)) {
			name = "X-Api-Key"
		}
		r.Header[name] = pol.upstreamAuth
		next.ServeHTTP(w, r)
	})
}
