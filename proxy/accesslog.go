package proxy

import (
	"context"
	"log/slog"
)

// accessLog writes ACCESS_LOG's line for a request the proxy answered or
// forwarded: method, path (never the query, which may carry keys),
// status, the caller in its log form (API keys hashed, IPs truncated), the
// deciding rule (the refusing one, else the applying rule with the fewest
// remaining), the estimated input tokens when they were counted, the
// upstream's time and the bytes sent back. Never a body or a credential.
func (x *exchange) accessLog() {
	c := x.keys.c
	if c.value == "" { // no guard ran: identify for the line alone
		c = x.pol.identify(x.r, anthropicPath(canonicalPath(x.r.URL.Path)))
	}
	status := x.status
	if status == 0 {
		status = 499 // the client left before any answer
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs,
		slog.String("method", x.r.Method),
		slog.String("path", x.r.URL.Path),
		slog.Int("status", status),
		slog.String("caller", c.logged()),
		slog.String("decision", x.decision))
	switch {
	case x.refused && x.den.first < len(x.rules): // the first refusing rule
		attrs = append(attrs, slog.String("rule", x.rules[x.den.first].conf.Name))
	case x.limited: // the applying rule with the fewest remaining
		attrs = append(attrs, slog.String("rule", x.rules[x.show].conf.Name))
	}
	if x.est.Encoding != "" {
		attrs = append(attrs, slog.Int("tokens", x.est.Tokens))
	}
	if x.forwarded {
		attrs = append(attrs, slog.Float64("upstream_seconds", x.now().Sub(x.forwardedAt).Seconds()))
	}
	attrs = append(attrs, slog.Int64("bytes", x.written))
	x.p.log.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}
