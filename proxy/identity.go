package proxy

import (
	"crypto/sha256"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// clientIPs finds the client address of a request under the trust model of
// SPEC §4.5: the socket peer, unless the peer is a trusted proxy, in which
// case X-Forwarded-For (else Forwarded) is walked right to left past
// trusted hops.
type clientIPs struct {
	trusted    []netip.Prefix
	ipv6Prefix int
}

// trustedPeer reports whether the socket peer of r is a trusted proxy.
func (c *clientIPs) trustedPeer(r *http.Request) bool {
	if len(c.trusted) == 0 {
		return false
	}
	return c.isTrusted(peerAddr(r))
}

func (c *clientIPs) isTrusted(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is the socket peer of r; invalid when RemoteAddr is not an
// IP:port (a unix socket, a test double).
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		a, err := netip.ParseAddr(r.RemoteAddr)
		if err != nil {
			return netip.Addr{}
		}
		return a.Unmap()
	}
	return ap.Addr().Unmap()
}

// clientIP returns the client address of r.
func (c *clientIPs) clientIP(r *http.Request) netip.Addr {
	peer := peerAddr(r)
	if !c.isTrusted(peer) {
		return peer
	}
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		return c.walk(peer, xff, parseXFFHop)
	}
	if fwd := r.Header.Values("Forwarded"); len(fwd) > 0 {
		return c.walk(peer, fwd, parseForwardedHop)
	}
	return peer
}

// walk goes through the comma-separated hops of the header lines, right to
// left, and returns the first address that is not a trusted proxy. An
// unparsable hop ends the walk at the last trusted hop seen: what lies
// beyond it was written by the client and proves nothing.
func (c *clientIPs) walk(peer netip.Addr, lines []string, parse func(string) (netip.Addr, bool)) netip.Addr {
	last := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var hop string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				hop, line = line[j+1:], line[:j]
			} else {
				hop, line = line, ""
			}
			hop = strings.TrimSpace(hop)
			if hop == "" {
				continue
			}
			a, ok := parse(hop)
			if !ok {
				return last
			}
			if !c.isTrusted(a) {
				return a
			}
			last = a
		}
	}
	return last // every hop is trusted: the leftmost is the client
}

func parseXFFHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	// Some proxies write ip:port or [v6]:port.
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// parseForwardedHop reads the for= parameter of one RFC 7239 element.
func parseForwardedHop(elem string) (netip.Addr, bool) {
	for _, pair := range strings.Split(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(k, "for") {
			continue
		}
		v = strings.Trim(v, `"`)
		if strings.HasPrefix(v, "[") { // "[2001:db8::1]:4711" or "[2001:db8::1]"
			if end := strings.IndexByte(v, ']'); end > 0 {
				v = v[1:end]
			}
		} else if h, _, found := strings.Cut(v, ":"); found && strings.Count(v, ":") == 1 {
			v = h
		}
		return parseXFFHop(v)
	}
	return netip.Addr{}, false
}

// caller is who a request is counted as.
type caller struct {
	value   string     // the caller key part's value: "jwt:<subject>", "user:<name>", "key:<16 hex>" or "ip:<addr or v6 prefix>"
	plan    string     // a known key's tier (API_KEYS_FILE), "" when it has none
	ip      netip.Addr // the client address, when value is an IP
	hasCred bool       // an API key (or a verified JWT) was presented
	key     string     // the credential's hash (16 hex digits): the api_key part
	claims  jwtauth.Claims
	// refused says why a JWT-shaped bearer did not verify (it is then no
	// credential); "" otherwise.
	refused string
}

// logged is the caller in its log form: the API key hash, or the IP
// truncated to /24 (IPv4) or /48 (IPv6). Built only when a line is logged.
func (c caller) logged() string {
	if !c.ip.IsValid() {
		return c.value
	}
	bits := 24
	if c.ip.Is6() {
		bits = 48
	}
	p, _ := c.ip.Prefix(bits)
	return "ip:" + p.String()
}

// identify builds the caller of r (SPEC §4.1): the API key, else the client
// IP. anthropic says the path is Anthropic's (/v1/messages…), whose API
// reads X-API-Key first. The raw key never leaves this function; only its
// hash does.
func (c *clientIPs) identify(r *http.Request, anthropic bool) caller {
	if tok := apiKey(r, anthropic); tok != "" {
		h := hashKey(tok)
		return caller{value: h, hasCred: true, key: h[len("key:"):]}
	}
	return c.ipCaller(r)
}

// ipCaller is the caller counted by its client IP.
func (c *clientIPs) ipCaller(r *http.Request) caller {
	ip := c.clientIP(r)
	if !ip.IsValid() {
		return caller{value: "ip:unknown"}
	}
	return caller{value: ipValue(ip, c.ipv6Prefix), ip: ip}
}

// The credential headers, in the order the path's API reads them:
// Anthropic's X-API-Key then the bearer token, elsewhere the bearer token,
// then X-API-Key, then Azure OpenAI's api-key. Anthropic's API reads no
// api-key: it is looked at last there, for a JWT only.
var (
	keyHeaders          = []string{"Authorization", "X-Api-Key", "Api-Key"}
	anthropicKeyHeaders = []string{"X-Api-Key", "Authorization", "Api-Key"}
)

// apiKey returns the API key from the header the path's API authenticates
// with first, so that a real key in that header and a made-up one in
// another cannot be told apart by rotating the made-up one. An empty token
// is no credential. "" when no header has one.
func apiKey(r *http.Request, anthropic bool) string {
	if anthropic {
		if tok := headerKey(r, "X-Api-Key"); tok != "" {
			return tok
		}
		return bearer(r)
	}
	if tok := bearer(r); tok != "" {
		return tok
	}
	if tok := headerKey(r, "X-Api-Key"); tok != "" {
		return tok
	}
	return headerKey(r, "Api-Key")
}

// bearer is the token of an Authorization: Bearer header, "" if none. The
// scheme is matched in any case, followed by spaces or tabs, as servers
// read it.
func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if tok, ok := cutBearer(v); ok {
		return tok
	}
	return ""
}

// cutBearer strips surrounding whitespace and a leading "Bearer" scheme
// (any case, then one or more spaces or tabs) from v; ok says the scheme
// was there.
func cutBearer(v string) (string, bool) {
	v = strings.TrimSpace(v)
	if len(v) > 6 && strings.EqualFold(v[:6], "bearer") && (v[6] == ' ' || v[6] == '\t') {
		return strings.TrimSpace(v[7:]), true
	}
	if strings.EqualFold(v, "bearer") {
		return "", true
	}
	return v, false
}

// headerKey is the first value of a key header (canonical name), trimmed
// and without a Bearer prefix: an upstream that strips one reads the same
// key.
func headerKey(r *http.Request, name string) string {
	if v := r.Header[name]; len(v) > 0 {
		tok, _ := cutBearer(v[0])
		return tok
	}
	return ""
}

// maxJWTs bounds the distinct JWT-shaped credentials one request may
// carry: each costs a signature check.
const maxJWTs = 8

// errTooManyJWTs is why a request with more than maxJWTs tokens carries no
// credential.
var errTooManyJWTs = errors.New("too many tokens")

// jwtToken is the token a credential header line may carry: the value
// trimmed, without a leading scheme word (Bearer, or any other: a word
// without a dot before whitespace).
func jwtToken(v string) string {
	v = strings.TrimSpace(v)
	if i := strings.IndexAny(v, " \t"); i > 0 && !strings.Contains(v[:i], ".") {
		return strings.TrimSpace(v[i+1:])
	}
	return v
}

// identify builds the caller of r under the policy (SPEC §4.1, §7.5). With
// JWT verification configured, every line of every credential header is
// looked at, in the order the path's API reads them: the first token that
// verifies makes its subject the caller (without one, the hash of its
// signed part), whatever stands beside it. Of two verified subjects the
// one the path's API reads first is the caller. When none verifies, the
// API key of the path's first header is the caller unless it is shaped
// like a JWT: it is then no credential and the caller is the client IP. A
// request with more than maxJWTs different JWT-shaped credentials is no
// credential either.
func (pol *policy) identify(r *http.Request, anthropic bool) caller {
	if pol.jwt == nil {
		return pol.keyCaller(r, anthropic)
	}
	headers := keyHeaders
	if anthropic {
		headers = anthropicKeyHeaders
	}
	type tried struct {
		tok string
		err error
	}
	var buf [maxJWTs]tried
	seen := buf[:0]
	check := func(tok string) (jwtauth.Claims, error) {
		for _, t := range seen {
			if t.tok == tok {
				return nil, t.err
			}
		}
		if len(seen) == maxJWTs {
			return nil, errTooManyJWTs
		}
		claims, err := pol.jwt.Verify(r.Context(), tok)
		if err != nil {
			seen = append(seen, tried{tok, err})
		}
		return claims, err
	}
	var refused error
lines:
	for _, name := range headers {
		for _, v := range r.Header[name] {
			tok := jwtToken(v)
			if !jwtauth.Shaped(tok) {
				continue
			}
			claims, err := check(tok)
			if err == nil {
				pol.jwtResults.verified.Inc()
				h := hashKey(jwtauth.SignedPart(tok))
				c := caller{value: h, hasCred: true, key: h[len("key:"):], claims: claims}
				if sub, ok := claims.Subject(pol.cfg.JWTSubjectClaim); ok {
					c.value = "jwt:" + boundedValue(sub)
				}
				return c
			}
			if err == errTooManyJWTs {
				refused = err
				break lines
			}
		}
	}
	if tok := apiKey(r, anthropic); refused == nil && tok != "" && jwtauth.Shaped(tok) {
		_, refused = check(tok)
	}
	if refused != nil {
		pol.jwtResults.refused.Inc()
		c := pol.ips.ipCaller(r)
		c.refused = refused.Error()
		return c
	}
	return pol.keyCaller(r, anthropic)
}

// keyCaller is the caller an API key makes, else the client IP. With
// API_KEYS_FILE only a listed, unexpired key is one: its caller is
// user:<name> (every key of one person shares their budgets) and its tier
// is the plan; any other key is no credential.
func (pol *policy) keyCaller(r *http.Request, anthropic bool) caller {
	if pol.keys == nil {
		return pol.ips.identify(r, anthropic)
	}
	tok := apiKey(r, anthropic)
	if tok == "" {
		return pol.ips.ipCaller(r)
	}
	k, ok := pol.keys[sha256.Sum256([]byte(tok))]
	if !ok || !k.Expires.IsZero() && !pol.now().Before(k.Expires) {
		return pol.ips.ipCaller(r)
	}
	h := hashKey(tok)
	return caller{value: "user:" + k.Caller, hasCred: true, key: h[len("key:"):], plan: k.Tier}
}

// planOf is the caller's plan (SPEC §7.4): the tier_from header's value,
// or the verified JWT's claim; "" when there is none.
func (pol *policy) planOf(r *http.Request, c *caller) string {
	switch {
	case c.plan != "":
		return c.plan
	case pol.tierFrom != "":
		if v := r.Header[pol.tierFrom]; len(v) > 0 {
			return strings.TrimSpace(v[0])
		}
	case pol.tierClaim != "":
		if v, ok := c.claims.Value(pol.tierClaim); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
