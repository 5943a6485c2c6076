package proxy

import (
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// SPEC §3: a request is protected when its method is POST (or names POST in
// a method-override header) and any spelling of its path that an upstream's
// router could take is a PROTECTED_PATHS entry. What is forwarded is never
// changed here: the path goes upstream as sent.

// methodOverrideHeaders name a request's method for frameworks that honour
// them (Rails, Express's method-override, ASP.NET, Google APIs).
var methodOverrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override",
	// The _ spellings, which CGI and WSGI servers read as the same header.
	"X_http_method_override", "X_http_method", "X_method_override"}

// postLike reports whether r may be a POST to the upstream: its method is
// POST in any case, or an override header names POST. A POST whose
// override names another method is still a POST: the upstream may ignore
// the header.
func postLike(r *http.Request) bool { return methodLike(r, http.MethodPost) }

// methodLike reports whether r may be a request of method m (upper case)
// to the upstream: its method, in any case, or one an override header
// names.
func methodLike(r *http.Request, m string) bool {
	if r.Method == m || strings.EqualFold(r.Method, m) {
		return true
	}
	for _, name := range methodOverrideHeaders {
		for _, v := range r.Header[name] {
			for tok := range strings.SplitSeq(v, ",") {
				if strings.EqualFold(strings.TrimSpace(tok), m) {
					return true
				}
			}
		}
	}
	return false
}

// protectedRoute is one PROTECTED_PATHS entry.
type protectedRoute struct {
	label   string // the entry as configured: the metrics' route label
	format  tokens.Format
	metrics *routeMetrics
	group   *group // in an upstream group's matcher: the group
}

// pattern is an entry with a * segment.
type pattern struct {
	segs   []string // canonical segments; "*" stands for any one segment
	prefix bool     // the entry ended in /*: the bare prefix and every deeper path match
	route  *protectedRoute
}

// routes matches request paths against the PROTECTED_PATHS entries.
type routes struct {
	exact    map[string]*protectedRoute // canonical path → entry without *
	patterns []pattern                  // entries with *, in configuration order
}

// newRoutes compiles validated entries. An entry is brought to the same
// canonical form as request paths, so /V1/Chat/Completions/ as an entry
// means /v1/chat/completions; the first of two entries with one canonical
// form wins.
func newRoutes(entries []string, m *metrics) *routes {
	rs := &routes{exact: map[string]*protectedRoute{}}
	for _, e := range entries {
		c := canonicalPath(e)
		rt := &protectedRoute{label: e, format: tokens.FormatForPath(c)}
		if m != nil {
			rt.metrics = m.route(e)
		}
		segs := splitSegments(c)
		prefix := len(segs) > 0 && segs[len(segs)-1] == "*"
		if prefix {
			segs = segs[:len(segs)-1]
		}
		if !prefix && !strings.Contains(c, "*") {
			if _, dup := rs.exact[c]; !dup {
				rs.exact[c] = rt
			}
			continue
		}
		rs.patterns = append(rs.patterns, pattern{segs: segs, prefix: prefix, route: rt})
	}
	return rs
}

// match returns the entry r's path matches, with the canonical spelling
// that matched it; nil when no spelling matches. A path already in
// canonical form costs one map lookup (and a scan of the * entries);
// only the others are decoded and cleaned.
func (rs *routes) match(r *http.Request) (*protectedRoute, string) {
	p := r.URL.Path
	if rt := rs.exact[p]; rt != nil {
		return rt, p
	}
	if r.URL.RawPath == "" && isCanonical(p) {
		return rs.matchPatterns(p), p
	}
	// Every reading a router could take: decoding everything first
	// (%2F and \ become separators), the servlet reading (; parameters
	// cut from each raw segment, each decoded on its own, an encoded
	// slash kept inside its segment), and the reading of routers that
	// match raw segments ({name} in Go's ServeMux, Express's :param),
	// where an encoded "." or ".." is a name like any other.
	for _, c := range [...]string{decodedReading(p), servletReading(r.URL.EscapedPath()), segmentReading(r.URL.EscapedPath())} {
		if rt := rs.lookup(c); rt != nil {
			return rt, c
		}
	}
	return nil, ""
}

// lookup matches a canonical path.
func (rs *routes) lookup(c string) *protectedRoute {
	if rt := rs.exact[c]; rt != nil {
		return rt
	}
	return rs.matchPatterns(c)
}

// matchPatterns matches a canonical path against the * entries.
func (rs *routes) matchPatterns(c string) *protectedRoute {
	for i := range rs.patterns {
		if rs.patterns[i].match(c) {
			return rs.patterns[i].route
		}
	}
	return nil
}

// match reports whether canonical path c matches the pattern.
func (pt *pattern) match(c string) bool {
	rest := c[1:]
	for _, want := range pt.segs {
		if rest == "" {
			return false
		}
		seg, tail, _ := strings.Cut(rest, "/")
		if want != "*" && want != seg {
			return false
		}
		rest = tail
	}
	return rest == "" || pt.prefix
}

// isCanonical reports whether p is its own canonical form: only bytes
// that no reading changes (no upper case, %, ;, \, control or non-ASCII
// byte), no empty, "." or ".." segment and no trailing slash.
func isCanonical(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch b := p[i]; {
		case b == '/':
			if i+1 == len(p) {
				return i == 0 // "/" alone
			}
			switch p[i+1] {
			case '/':
				return false
			case '.':
				end := strings.IndexByte(p[i+1:], '/')
				if end < 0 {
					end = len(p) - i - 1
				}
				if seg := p[i+1 : i+1+end]; seg == "." || seg == ".." {
					return false
				}
			}
		case b <= ' ' || b >= 0x7f || ('A' <= b && b <= 'Z') || b == '%' || b == ';' || b == '\\':
			return false
		}
	}
	return true
}

// canonicalPath is the reading of a path that decodes everything first.
func canonicalPath(p string) string { return decodedReading(p) }

// decodedReading reads p (already percent-decoded once, as URL.Path is)
// the way a router that decodes before it splits would, and one that
// decodes twice: it decodes until nothing changes, takes \ for /, cuts
// the ; parameters of each segment, and cleans.
func decodedReading(p string) string {
	for range 8 {
		d := unescape(p)
		if d == p {
			break
		}
		p = d
	}
	return clean(strings.Split(strings.ReplaceAll(p, `\`, "/"), "/"))
}

// servletReading reads an escaped path as a servlet container would:
// split on /, cut each segment's ; parameters, then decode each segment
// (until nothing changes) without making new segments: a slash decoded
// inside a segment stays in it (as %2f, so that it cannot split it).
func servletReading(escaped string) string { return clean(decodeSegments(escaped)) }

// segmentReading reads an escaped path as a router matching raw segments
// does: decoded segments as in servletReading, empty ones dropped, but
// "." and ".." not resolved.
func segmentReading(escaped string) string {
	out := []string{}
	for _, s := range decodeSegments(escaped) {
		if s, _, _ = strings.Cut(s, ";"); s != "" {
			out = append(out, fold(s))
		}
	}
	return "/" + strings.Join(out, "/")
}

// decodeSegments splits an escaped path on / and decodes each segment
// until nothing changes, its ; parameters cut first.
func decodeSegments(escaped string) []string {
	segs := strings.Split(escaped, "/")
	for i, s := range segs {
		s, _, _ = strings.Cut(s, ";")
		for range 8 {
			d := unescape(s)
			if d == s {
				break
			}
			s = d
		}
		segs[i] = strings.ReplaceAll(s, "/", "%2f")
	}
	return segs
}

// clean joins segments into a canonical path: ; parameters cut, empty and
// "." segments dropped, ".." resolved (never above the root), each segment
// case-folded.
func clean(segs []string) string {
	out := segs[:0]
	for _, s := range segs {
		s, _, _ = strings.Cut(s, ";")
		switch s {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, fold(s))
		}
	}
	return "/" + strings.Join(out, "/")
}

// splitSegments is the segments of a canonical path.
func splitSegments(c string) []string {
	if c == "/" {
		return nil
	}
	return strings.Split(c[1:], "/")
}

// fold maps s to one spelling per case-insensitive class: ASCII letters
// to lower case, other runes through upper then lower case, so that
// "ſ" (long s), "K" (Kelvin sign) and "S", "k" meet. It matches more than
// Unicode simple folding, never less.
func fold(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToLower(s)
	}
	return strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf {
			return unicode.ToLower(r)
		}
		return unicode.ToLower(unicode.ToUpper(r))
	}, s)
}

// unescape decodes every valid %XX of s and leaves any other % as it is,
// as lenient routers do.
func unescape(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}

// anthropicPath reports whether canonical path c is Anthropic's Messages
// API (/v1/messages…), whose clients authenticate with X-API-Key and
// parse Anthropic's error envelope.
func anthropicPath(c string) bool {
	return c == "/v1/messages" || strings.HasPrefix(c, "/v1/messages/")
}
