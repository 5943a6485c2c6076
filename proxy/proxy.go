// Package proxy is the HTTP surface of ratelimit-proxy: the public handler
// that runs the guard chain of SPEC §4 on protected routes and forwards
// everything it admits, the error bodies of SPEC §5, and the admin handler
// with metrics and health.
package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
)

// Options are what New needs besides the configuration.
type Options struct {
	Config     config.Config // validated
	Store      limits.Store
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the clock; time.Now when nil. Only this package reads it.
	Now func() time.Time
	// Stats reports the store's bookkeeping for the tracked-keys and
	// eviction metrics; nil when the store keeps none.
	Stats func() limits.MemoryStats
	// Transport replaces the tuned upstream transport (tests).
	Transport http.RoundTripper
	// Tokenizer counts input tokens; one is made when nil.
	Tokenizer *tokens.Tokenizer
	// StoreName ("memory", "redis") and StoreUp describe the state store
	// on /readyz; StoreUp nil means always up.
	StoreName string
	StoreUp   func() bool
}

// Proxy is the guarded reverse proxy.
type Proxy struct {
	cfg        config.Config
	store      limits.Store
	log        *slog.Logger
	now        func() time.Time
	ips        clientIPs
	protected  map[string]bool
	chatRule   *ruleHeaders
	flatErrors bool
	metrics    *metrics
	tokens     *tokens.Tokenizer
	storeName  string
	storeUp    func() bool
	forward    http.Handler
	pool       sync.Pool
}

// New validates what it is given and builds the proxy; a bad option fails
// here, never on a request.
func New(o Options) (*Proxy, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if o.Store == nil || o.Logger == nil || o.Registerer == nil {
		return nil, errors.New("proxy: Store, Logger and Registerer are required")
	}
	c := o.Config
	p := &Proxy{
		cfg:        c,
		store:      o.Store,
		log:        o.Logger,
		now:        o.Now,
		protected:  map[string]bool{},
		flatErrors: c.ErrorFormat == "flat",
		ips:        clientIPs{ipv6Prefix: int(c.IPv6Prefix)},
		tokens:     o.Tokenizer,
		storeName:  o.StoreName,
		storeUp:    o.StoreUp,
	}
	if p.storeName == "" {
		p.storeName = "memory"
	}
	if p.storeUp == nil {
		p.storeUp = func() bool { return true }
	}
	if p.tokens == nil {
		p.tokens = tokens.New()
	}
	if p.now == nil {
		p.now = time.Now
	}
	for _, s := range c.TrustedProxies {
		pre, err := config.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("trusted_proxies: %q: %w", s, err)
		}
		p.ips.trusted = append(p.ips.trusted, pre)
	}
	for _, path := range c.ProtectedPaths {
		p.protected[path] = true
	}
	chat := &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: c.ChatRPM, Window: time.Minute}
	if err := chat.Validate(); err != nil {
		return nil, err
	}
	p.chatRule = newRuleHeaders(chat)

	m, err := newMetrics(o.Registerer, c.ProtectedPaths)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	p.metrics = m
	if o.Stats != nil {
		if err := registerStoreStats(o.Registerer, o.Stats); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}

	target, err := url.Parse(c.UpstreamURL)
	if err != nil {
		return nil, fmt.Errorf("upstream_url: %w", err)
	}
	p.forward = upstream.New(upstream.Options{
		Target:                target,
		ResponseHeaderTimeout: c.UpstreamTimeout,
		TrustForwarded:        p.ips.trustedPeer,
		ErrorHandler:          p.upstreamError,
		Transport:             o.Transport,
		OutgoingBody:          outgoingBody,
	})
	p.pool.New = func() any { return new(exchange) }
	return p, nil
}

// Handler is the public listener's handler.
func (p *Proxy) Handler() http.Handler {
	r := chi.NewRouter()
	r.Handle("/*", p)
	r.NotFound(p.ServeHTTP)
	r.MethodNotAllowed(p.ServeHTTP)
	return r
}

// ServeHTTP runs one request: guards on protected routes, then forwarding.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := p.now()
	x := p.pool.Get().(*exchange)
	*x = exchange{ResponseWriter: w, decision: decAllowed, now: p.now}
	defer p.pool.Put(x)

	route, protected := p.route(r)
	x.route, x.routeName = p.metrics.route(route), route
	defer func() {
		if x.body != nil {
			x.body.close()
		}
	}()
	if protected {
		pass := p.guard(x, r, start)
		x.forwardedAt = p.now()
		x.route.guard.Observe(x.forwardedAt.Sub(start).Seconds())
		if !pass {
			x.route.requests[x.decision].Inc()
			return
		}
	} else {
		x.forwardedAt = p.now()
	}
	p.forward.ServeHTTP(x, r)
	x.route.requests[x.decision].Inc()
}

// route reports r's protected path (its route label) and whether the
// guards apply. The path is cleaned first so /v1//chat/completions/ or
// /v1/./chat/completions cannot slip past a guard that the upstream's
// router would not notice; what is forwarded is left untouched.
func (p *Proxy) route(r *http.Request) (string, bool) {
	if r.Method != http.MethodPost {
		return routeUnprotected, false
	}
	pth := r.URL.Path
	if p.protected[pth] {
		return pth, true
	}
	if strings.Contains(pth, "//") || strings.Contains(pth, "/.") || (len(pth) > 1 && strings.HasSuffix(pth, "/")) {
		if c := path.Clean(pth); p.protected[c] {
			return c, true
		}
	}
	return routeUnprotected, false
}

// upstreamError answers a request the upstream did not serve.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, status int) {
	x, _ := w.(*exchange)
	switch status {
	case upstream.StatusClientClosed:
		if x != nil {
			x.decision = decClientClosed
		}
		return // nobody is listening
	case http.StatusGatewayTimeout:
		p.log.Warn("upstream timed out", "path", r.URL.Path, "timeout", p.cfg.UpstreamTimeout)
		p.writeError(w, r, &apiError{status: status, code: codeUpstreamTimeout, message: "The upstream API did not answer in time."})
	default:
		p.log.Warn("upstream unavailable", "path", r.URL.Path)
		p.writeError(w, r, &apiError{status: http.StatusBadGateway, code: codeUpstreamDown, message: "The upstream API could not be reached."})
	}
	if x != nil {
		x.decision = decUpstreamError
	}
}
