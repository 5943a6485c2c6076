// Package proxy is the HTTP surface of ratelimit-proxy: the public handler
// that runs the guard chain of SPEC §4 on protected routes and forwards
// everything it admits, the error bodies of SPEC §5, and the admin handler
// with metrics and health.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// Options are what New needs besides the configuration.
type Options struct {
	Config config.Config // validated
	Store  limits.Store
	// Places holds the places of concurrency rules; one in process
	// (limits.NewMemoryPlaces) when nil.
	Places     limits.Places
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the clock; time.Now when nil. Only this package reads it.
	Now func() time.Time
	// Stats reports the store's bookkeeping for the tracked-keys and
	// eviction metrics; nil when the store keeps none.
	Stats func() limits.MemoryStats
	// Refusals reports the memory of refusals (limits.Remember) for its
	// metrics; nil when it is off.
	Refusals func() limits.RememberStats
	// Transport replaces the tuned upstream transport (tests).
	Transport http.RoundTripper
	// Tokenizer counts input tokens; one is made when nil.
	Tokenizer *tokens.Tokenizer
	// StoreName ("memory", "redis") and StoreUp describe the state store
	// on /readyz; StoreUp nil means always up.
	StoreName string
	StoreUp   func() bool
	// GateRedis, when set, shares the upstream groups' gates (SPEC §9)
	// through Redis; otherwise they are this instance's alone.
	GateRedis *gate.RedisOptions
	// LearnedShare, when set, shares the outputs OUTPUT_TOKEN_RESERVE =
	// "learned" learns from between the instances (NewLearnedShare);
	// LearnedSync is how often (2 s when 0).
	LearnedShare *limits.SharedSamples
	LearnedSync  time.Duration
	// Forget drops the remembered refusals of a rule (every key when key
	// is zero) on this instance and, with Redis, on every other (SPEC
	// §4.2); called on a reset, a live change and a reload. nil: nothing
	// is remembered.
	Forget func(rule string, key limits.Key)
	// ConfigPath is the file a reload reads again ("" none: a reload
	// applies the environment over the defaults).
	ConfigPath string
	// Getenv reads the environment on reload; os.LookupEnv when nil.
	Getenv func(string) (string, bool)
	// LogLevel, when set, is changed by a reload that changes log_level.
	LogLevel *slog.LevelVar
	// JWKSClient fetches a JWT_JWKS URL (tests: a TLS server's client);
	// nil: a client on the system trust store.
	JWKSClient *http.Client
}

// Proxy is the guarded reverse proxy.
type Proxy struct {
	// boot is the configuration the proxy started with: the settings a
	// reload cannot change (listeners, store, upstream URL and timeout,
	// FAIL_OPEN) are read from it; the others from the current policy.
	boot      config.Config
	store     limits.Store
	batch     limits.Store  // store joined to places: what the guard chain decides with
	places    limits.Places // concurrency rules' places, released as ServeHTTP returns
	log       *slog.Logger
	now       func() time.Time
	policy    atomic.Pointer[policy]
	ruleSet   *ruleMetricSet
	learner   *outputLearner // OUTPUT_TOKEN_RESERVE = "learned"
	stopSync  context.CancelFunc
	delayed   atomic.Int64 // requests held by delay rules now
	metrics   *metrics
	tokens    *tokens.Tokenizer
	storeName string
	storeUp   func() bool
	forward   http.Handler // unprotected requests: WebSocket upgrades pass
	guarded   http.Handler // admitted protected requests: no upgrade passes
	pool      sync.Pool
	prepared  *preparedCache // 429s rendered once (refusal.go)
	// What reloads and live changes need.
	reload   sync.Mutex // one reload or live change at a time
	gateMx   *gate.Metrics
	gateOpts *gate.RedisOptions
	forget   func(rule string, key limits.Key)
	cfgPath  string
	getenv   func(string) (string, bool)
	logLevel *slog.LevelVar
	reloads  *reloadMetrics
	jwtMx    *jwtMetrics
	// jwksClient fetches a JWKS URL; nil: jwtauth's own (system trust store).
	jwksClient *http.Client
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
		boot:       c,
		store:      o.Store,
		places:     o.Places,
		log:        o.Logger,
		now:        o.Now,
		tokens:     o.Tokenizer,
		storeName:  o.StoreName,
		storeUp:    o.StoreUp,
		gateOpts:   o.GateRedis,
		forget:     o.Forget,
		cfgPath:    o.ConfigPath,
		getenv:     o.Getenv,
		logLevel:   o.LogLevel,
		jwksClient: o.JWKSClient,
		prepared:   newPreparedCache(),
	}
	if p.forget == nil {
		p.forget = func(string, limits.Key) {}
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
	if p.places == nil {
		p.places = limits.NewMemoryPlaces()
	}
	p.batch = limits.WithPlaces(p.store, p.places)
	if p.now == nil {
		p.now = time.Now
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	p.metrics = m
	if p.ruleSet, err = newRuleMetricSet(o.Registerer); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	p.learner = newOutputLearner(p.ruleSet.budget.outputReserve)
	if held, ok := p.places.(interface{ Held() int }); ok {
		err = o.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_places_in_use",
			Help: "Places of concurrency rules held by this instance's requests in flight (with Redis, the leases this instance renews).",
		}, func() float64 { return float64(held.Held()) }))
		if err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	if err = o.Registerer.Register(newRuleInfo(p)); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	if p.reloads, err = newReloadMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	if p.jwtMx, err = newJWTMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	// Every group's metrics exist from the start, so that a reload that
	// adds the first group registers nothing.
	if p.gateMx, err = gate.NewMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	pol, err := p.compile(&c, nil, nil)
	if err != nil {
		return nil, err
	}
	p.policy.Store(pol)
	if o.Stats != nil {
		if err := registerStoreStats(o.Registerer, o.Stats); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	if o.Refusals != nil {
		if err := registerRefusalStats(o.Registerer, o.Refusals); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}

	target, err := url.Parse(c.UpstreamURL)
	if err != nil {
		return nil, fmt.Errorf("upstream_url: %w", err)
	}
	rt := o.Transport
	if rt == nil {
		rt = upstream.NewTransport(target, c.UpstreamTimeout) // an h1.Client for http://
	}
	// The upstream's 429/503 are handled under the group's ticket; a
	// request outside every group has none and passes as it is.
	rt = &gate.Transport{Base: rt}
	uo := upstream.Options{
		Target:                target,
		ResponseHeaderTimeout: c.UpstreamTimeout,
		TrustForwarded:        func(r *http.Request) bool { return p.policy.Load().ips.trustedPeer(r) },
		ClientIP:              func(r *http.Request) netip.Addr { return p.policy.Load().ips.clientIP(r) },
		ErrorHandler:          p.upstreamError,
		Transport:             rt, // one connection pool for both handlers
		OutgoingBody:          outgoingBody,
		ModifyResponse:        p.modifyResponse,
	}
	p.forward = p.upstreamCredential(upstream.New(uo))
	uo.NoUpgrade = true
	p.guarded = p.upstreamCredential(upstream.New(uo))
	p.pool.New = func() any { return new(exchange) }
	if o.LearnedShare != nil {
		p.learner.share = o.LearnedShare
		ctx, cancel := context.WithCancel(context.Background())
		p.stopSync = cancel
		go p.syncLearned(ctx, cmp.Or(o.LearnedSync, learnedSync))
	}
	return p, nil
}

// syncLearned shares the learned outputs through Redis every period,
// while the policy learns (a reload may turn it on or off).
func (p *Proxy) syncLearned(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if c := p.policy.Load().cfg; c.OutputReserveLearned {
			if err := p.learner.sync(ctx, c.OutputTokenReserveMin); err != nil && ctx.Err() == nil {
				p.log.Debug("learned reserve: sharing through redis failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Handler is the public listener's handler.
func (p *Proxy) Handler() http.Handler {
	// Every path, method and form of request target is the proxy's to
	// judge (routing is PROTECTED_PATHS and the rules' paths, in
	// ServeHTTP), so a router in front would only match "/*": chi did,
	// and cost every request a copy of its http.Request, a context and
	// its path value (4 allocations, 0.4 µs) for nothing. The admin API
	// keeps chi.
	return p
}

// ServeHTTP runs one request: the guard chain on protected routes and
// on the routes a rule applies to, the upstream group, then forwarding.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x := p.pool.Get().(*exchange)
	x.begin(p, w, r)
	defer p.pool.Put(x)
	defer x.release() // also when forwarding panics (http.ErrAbortHandler)
	if r = x.pass(); r != nil {
		x.forwarded = true
		r = withBudget(x, r)
		if x.protected {
			p.guarded.ServeHTTP(x, r)
		} else {
			p.forward.ServeHTTP(x, r) // unprotected, or a rule's own route: upgrades pass, as on any unprotected route
		}
	}
	// No response body to read (the upstream failed, the client left
	// first), or refused after the token rules admitted it: the input
	// estimate alone, or nothing, is charged.
	p.settle(x, usage.Result{})
	x.route.requests[x.decision].Inc()
	if x.pol.cfg.AccessLog {
		x.accessLog()
	}
}

// begin makes x the exchange of r, answered on w, under p's current
// policy: its route, and the rules that apply to it.
func (x *exchange) begin(p *Proxy, w http.ResponseWriter, r *http.Request) {
	start := p.now()
	pol := p.policy.Load()
	*x = exchange{ResponseWriter: w, p: p, r: r, start: start, decision: decAllowed, now: p.now, pol: pol}
	rt, canonical := pol.route(r)
	x.protected = rt != nil
	if x.protected {
		x.route, x.routeName, x.format, x.apiPath = rt.metrics, rt.label, rt.format, canonical
	} else {
		x.route, x.routeName = p.metrics.unprotected, routeUnprotected
	}
	x.cands = x.candBuf[:0]
	if pol.cfg.RateLimitEnabled && (x.protected || pol.ownPaths) {
		x.cands = pol.applying(r, x.protected, pol.routes, x.cands)
	}
	for _, ru := range x.cands {
		x.bodyRules = x.bodyRules || ru.needsBody
	}
}

// pass runs the guard chain, when the request is protected or a rule
// applies to it, then takes its upstream group's slot, when its path has
// one. It returns the request to forward, or nil when a step refused it
// (the denial answered).
func (x *exchange) pass() *http.Request {
	p := x.p
	guarded := x.protected || len(x.cands) > 0
	if guarded {
		d := x.guard()
		if d != nil {
			x.deny(d)
		}
		x.forwardedAt = p.now()
		x.route.guard.Observe(x.forwardedAt.Sub(x.start).Seconds())
		if d != nil {
			return nil
		}
	}
	grp := x.pol.groups.of(x.r, x.protected)
	if grp == nil {
		if !guarded {
			x.forwardedAt = p.now()
		}
		return x.r
	}
	r, t, d := x.enterGroup(grp)
	if d != nil {
		x.deny(d)
		return nil
	}
	x.ticket = t
	x.forwardedAt = p.now()
	return r
}

// release gives back the concurrency rules' places, the upstream group's
// slot and the spooled body.
func (x *exchange) release() {
	if len(x.placed) > 0 {
		x.p.places.Release(x.placed)
		x.placed = nil
	}
	if x.ticket != nil {
		x.ticket.Release()
	}
	if x.body != nil {
		x.body.close()
	}
}

// Close stops the background work of the upstream groups, of the JWT
// key set's refresh and of the learned reserve's sharing.
func (p *Proxy) Close() {
	if p.stopSync != nil {
		p.stopSync()
	}
	pol := p.policy.Load()
	pol.groups.close()
	if pol.jwt != nil {
		pol.jwt.Close()
	}
}

// route returns the PROTECTED_PATHS entry r falls under and the canonical
// spelling of its path that matched; nil when the guards do not apply
// (SPEC §3). Any spelling an upstream's router could take for a protected
// path counts (/V1//Chat/completions;x=1/, /v1/chat%2Fcompletions); what
// is forwarded is left as sent.
func (pol *policy) route(r *http.Request) (*protectedRoute, string) {
	if !postLike(r) {
		return nil, ""
	}
	return pol.routes.match(r)
}

// upstreamError answers a request the upstream did not serve.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, status int) {
	x, ok := w.(*exchange)
	if !ok { // never: both forwarding handlers are given the exchange
		x = &exchange{ResponseWriter: w, p: p, r: r, pol: p.policy.Load(), bodyRead: true}
	}
	var d *denial
	switch status {
	case upstream.StatusClientClosed:
		d = x.gone() // nobody is listening
	case http.StatusGatewayTimeout:
		d = x.refuse(decUpstreamError, status, codeUpstreamTimeout, "The upstream API did not answer in time.")
		d.level, d.msg, d.log = slog.LevelWarn, "upstream timed out", []any{"path", r.URL.Path, "timeout", p.boot.UpstreamTimeout}
	default:
		d = x.refuse(decUpstreamError, http.StatusBadGateway, codeUpstreamDown, "The upstream API could not be reached.")
		d.level, d.msg, d.log = slog.LevelWarn, "upstream unavailable", []any{"path", r.URL.Path}
	}
	x.deny(d)
}
