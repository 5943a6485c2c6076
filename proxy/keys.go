package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// maxPartValue is the longest key part value kept as it is. A longer one
// (a header or body field an attacker controls) is replaced by its hash,
// so that counters' keys, in memory and on Redis, stay small whatever the
// request carries.
const maxPartValue = 256

// keyInput is what a request's key parts are read from (SPEC §7.2).
type keyInput struct {
	r      *http.Request
	p      *Proxy
	pol    *policy
	c      caller
	path   string // the canonical path (so that disguised spellings share a key)
	plan   string // the caller's plan (tier_from), "" when none
	query  url.Values
	parsed bool // query parsed
	model  string
	fields *tokens.Fields // what was asked of the body; values answer it
	values tokens.Values
	// err is set when a key part could be read two ways (a repeated query
	// parameter, a header given twice with different values): the request
	// is refused, since the proxy cannot know which the upstream reads.
	err error
}

// secretHeaders carry credentials: as key parts they are hashed like API
// keys, never kept, shown or logged in clear.
var secretHeaders = map[string]bool{"Authorization": true, "Proxy-Authorization": true, "X-Api-Key": true,
	"Api-Key": true, "Cookie": true}

// header is a header key part's value: the header, or its _ spelling alt
// (which CGI and WSGI servers read as the same header) when it is absent;
// Host from the request line. Two different values (two lines, or both
// spellings) make the part ambiguous.
func (in *keyInput) header(name, alt string) string {
	if name == "Host" {
		return strings.ToLower(in.r.Host)
	}
	vs := in.r.Header[name]
	if alt != "" {
		if alts := in.r.Header[alt]; len(alts) > 0 {
			vs = append(vs[:len(vs):len(vs)], alts...)
		}
	}
	if len(vs) == 0 {
		return ""
	}
	v := strings.TrimSpace(vs[0])
	for _, o := range vs[1:] {
		if strings.TrimSpace(o) != v && in.err == nil {
			in.err = errors.New("header " + strconv.Quote(name) + " given twice with different values")
		}
	}
	if v != "" && secretHeaders[name] {
		return strings.TrimPrefix(hashKey(v), "key:")
	}
	return v
}

// parseQuery reads a raw query as the most lenient common server does:
// pairs split on & and ;, names and values percent-decoded (+ is a
// space), a pair that does not decode kept as sent.
func parseQuery(raw string) map[string][]string {
	q := map[string][]string{}
	for raw != "" {
		var pair string
		if i := strings.IndexAny(raw, "&;"); i >= 0 {
			pair, raw = raw[:i], raw[i+1:]
		} else {
			pair, raw = raw, ""
		}
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if v, err := url.QueryUnescape(value); err == nil {
			value = v
		}
		q[name] = append(q[name], value)
	}
	return q
}

// value is a key part's value and whether the request has it. An empty
// value counts as missing (an empty header names nobody).
func (in *keyInput) value(kp *keyPart) (string, bool) {
	var v string
	switch kp.kind {
	case partGlobal:
		return "global", true
	case partCaller:
		return in.c.value, true
	case partAPIKey:
		if !in.c.hasCred {
			return "", false
		}
		v = in.c.key
	case partIP:
		v = in.pol.ips.ipValue(in.r)
	case partMethod:
		v = in.method()
	case partPath:
		v = in.path
	case partModel:
		v = in.model
	case partTier:
		v = in.plan
	case partHeader:
		v = in.header(kp.name, kp.alt)
	case partQuery:
		if !in.parsed {
			in.query, in.parsed = parseQuery(in.r.URL.RawQuery), true
		}
		vs := in.query[kp.name]
		if len(vs) > 1 && in.err == nil {
			in.err = errors.New("duplicate query parameter " + strconv.Quote(kp.name))
		}
		if len(vs) > 0 {
			v = vs[0]
		}
	case partJWT:
		v, _ = in.c.claims.Value(kp.name)
	case partJSON:
		if in.fields != nil {
			v = found(in.fields.JSON, in.values.JSON, kp.name)
		}
	case partXML:
		if in.fields != nil {
			v = found(in.fields.XML, in.values.XML, kp.name)
		}
	case partForm:
		if in.fields != nil {
			v = found(in.fields.Form, in.values.Form, kp.name)
		}
	}
	if v == "" {
		return "", false
	}
	return boundedValue(v), true
}

// found is the value read for name: names and vals are index for index.
func found(names []string, vals []tokens.Value, name string) string {
	for i, n := range names {
		if n == name && i < len(vals) && vals[i].Found {
			return vals[i].S
		}
	}
	return ""
}

// boundedValue replaces a value longer than maxPartValue by
// "sha256:" and the first 32 hex digits of its SHA-256.
func boundedValue(v string) string {
	if len(v) <= maxPartValue {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// key builds the rule's key for the request; when a part is missing it
// returns that part's label and false.
func (in *keyInput) key(ru *rule) (limits.Key, string, bool) {
	if len(ru.key) == 1 {
		v, ok := in.value(&ru.key[0])
		if !ok {
			return limits.Key{}, ru.key[0].label, false
		}
		return ruleKey([]limits.Part{{Name: ru.key[0].label, Value: v}}), "", true
	}
	var buf [6]limits.Part
	parts := buf[:0]
	for i := range ru.key {
		kp := &ru.key[i]
		v, ok := in.value(kp)
		if !ok {
			return limits.Key{}, kp.label, false
		}
		parts = append(parts, limits.Part{Name: kp.label, Value: v})
	}
	return ruleKey(parts), "", true
}

// conditionsHold reports whether the rule's conditions let it apply:
// every `when` condition holds, and not every `unless` condition does. A
// condition on a missing part does not hold.
func (in *keyInput) conditionsHold(ru *rule) bool {
	for i := range ru.when {
		if !in.holds(&ru.when[i]) {
			return false
		}
	}
	if len(ru.unless) == 0 {
		return true
	}
	for i := range ru.unless {
		if !in.holds(&ru.unless[i]) {
			return true
		}
	}
	return false
}

// holds reports whether the request's value of c's part is one of c's
// values.
func (in *keyInput) holds(c *condition) bool {
	v, ok := in.value(&c.part)
	if !ok {
		return false
	}
	var ip netip.Addr
	for i := range c.values {
		cv := &c.values[i]
		switch {
		case cv.cidr.IsValid():
			if !ip.IsValid() {
				ip = in.pol.ips.clientIP(in.r)
			}
			if ip.IsValid() && cv.cidr.Contains(ip) {
				return true
			}
		case cv.prefix:
			if strings.HasPrefix(v, cv.value) {
				return true
			}
		case v == cv.value:
			return true
		}
	}
	return false
}

// ipValue is the ip key part: the client IP under the trust model, IPv6
// per IPV6_PREFIX.
func (c *clientIPs) ipValue(r *http.Request) string {
	ip := c.clientIP(r)
	if !ip.IsValid() {
		return "unknown"
	}
	if ip.Is6() {
		p, _ := ip.Prefix(c.ipv6Prefix)
		return p.String()
	}
	return ip.String()
}

// method is the method key part: the request's method in upper case. A
// method-override header naming another method makes it ambiguous (the
// upstream may honour the header or not), which refuses the request
// rather than give the caller a second budget.
func (in *keyInput) method() string {
	m := strings.ToUpper(in.r.Method)
	for _, name := range methodOverrideHeaders {
		for _, v := range in.r.Header[name] {
			for tok := range strings.SplitSeq(v, ",") {
				if t := strings.ToUpper(strings.TrimSpace(tok)); t != "" && t != m && in.err == nil {
					in.err = errors.New("the method is " + m + " but " + name + " names " + t)
				}
			}
		}
	}
	return m
}
