package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// compile builds the policy of a validated configuration with the live
// changes applied. prev is the policy it replaces (nil at start): its
// upstream gates are kept for the groups that did not change, so their
// slots, queues and pauses carry over.
func (p *Proxy) compile(c *config.Config, live *liveChanges, prev *policy) (*policy, error) {
	if live == nil {
		live = &liveChanges{}
	}
	pol, err := compilePolicy(c, live, p.ruleSet)
	if err != nil {
		return nil, err
	}
	pol.flatErrors = c.ErrorFormat == "flat"
	pol.ips = clientIPs{ipv6Prefix: int(c.IPv6Prefix)}
	for _, s := range c.TrustedProxies {
		pre, err := config.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("trusted_proxies: %q: %w", s, err)
		}
		pol.ips.trusted = append(pol.ips.trusted, pre)
	}
	pol.routes = newRoutes(c.ProtectedPaths, p.metrics)
	pol.now = p.now
	if v := c.UpstreamAuthorization; v != "" {
		pol.upstreamAuth = []string{v}
		_, isBearer := cutBearer(v)
		pol.upstreamAuthAnthropic = !isBearer
	}
	if c.APIKeysFile != "" {
		// Read at every load: a reload picks up keys added, rotated,
		// expired or revoked.
		if pol.keys, err = config.LoadAPIKeys(c.APIKeysFile); err != nil {
			return nil, fmt.Errorf("api_keys_file: %w", err)
		}
	}
	pol.jwtResults = p.jwtMx
	if c.JWT() {
		if prev != nil && prev.jwt != nil && sameJWT(prev.cfg, c) {
			pol.jwt = prev.jwt
		} else if pol.jwt, err = jwtauth.New(jwtauth.Options{Secret: []byte(c.JWTSecret), JWKS: c.JWTJWKS,
			Refresh: c.JWTJWKSRefresh, Issuer: c.JWTIssuer, Audience: c.JWTAudience, Now: p.now,
			Client: p.jwksClient, Logger: p.log, OnFetch: p.jwtMx.fetched}); err != nil {
			return nil, fmt.Errorf("jwt_jwks: %w", err)
		}
	}
	var old *groups
	if prev != nil {
		old = prev.groups
	}
	if pol.groups, err = newGroups(c, p.now, p.gateMx, p.gateOpts, old); err != nil {
		if pol.jwt != nil && (prev == nil || pol.jwt != prev.jwt) {
			pol.jwt.Close()
		}
		return nil, err
	}
	return pol, nil
}

// sameJWT reports whether two configurations verify tokens alike, so the
// verifier (and its cached key set) can be kept.
func sameJWT(a, b *config.Config) bool {
	return a.JWTSecret == b.JWTSecret && a.JWTJWKS == b.JWTJWKS && a.JWTJWKSRefresh == b.JWTJWKSRefresh &&
		a.JWTIssuer == b.JWTIssuer && a.JWTAudience == b.JWTAudience
}

// jwtMetrics count verifications and key-set fetches (SPEC §7.5).
type jwtMetrics struct {
	verified, refused prometheus.Counter
	fetches           *prometheus.CounterVec
}

func newJWTMetrics(reg prometheus.Registerer) (*jwtMetrics, error) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_proxy_jwt_verifications_total",
		Help: "Bearer tokens shaped like JWTs, by result: verified, or refused (then no credential: the caller is its IP).",
	}, []string{"result"})
	f := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_proxy_jwks_fetches_total",
		Help: "Fetches of the JWT key set (JWT_JWKS: at start, on schedule, on an unknown kid), by result.",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{v, f} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	f.WithLabelValues("ok") // both series exist from the start, so rate() sees the first
	f.WithLabelValues("error")
	return &jwtMetrics{verified: v.WithLabelValues("verified"), refused: v.WithLabelValues("refused"), fetches: f}, nil
}

func (m *jwtMetrics) fetched(ok bool) {
	if ok {
		m.fetches.WithLabelValues("ok").Inc()
	} else {
		m.fetches.WithLabelValues("error").Inc()
	}
}

// restartOnly are the settings a reload cannot change: the listeners, the
// state store and its wiring, the upstream's address and transport, the
// log format, the state file. A reload that changes one keeps the running
// value and says so.
var restartOnly = []string{"listen_addr", "admin_addr", "upstream_url", "upstream_timeout", "redis_url", "redis_prefix",
	"redis_timeout", "redis_instances", "fail_open", "max_tracked_keys", "refusal_cache_size", "log_format",
	"state_file", "state_flush_interval", "shutdown_timeout"}

// ReloadResult says what a reload did.
type ReloadResult struct {
	// Changed lists each change, as "setting: old → new" or "rule NAME: …".
	Changed []string `json:"changed"`
	// RestartRequired names the settings whose new values wait for a
	// restart (the running ones are kept).
	RestartRequired []string `json:"restart_required"`
	// DroppedLive lists the admin API's live changes the reload replaced
	// with the file's values.
	DroppedLive []string `json:"dropped_live_changes"`
}

// InvalidConfigError is a reload refused: the file did not load or did
// not validate; nothing changed.
type InvalidConfigError struct{ Errs []string }

func (e *InvalidConfigError) Error() string {
	return "invalid configuration: " + strings.Join(e.Errs, "; ")
}

// Reload reads the configuration file and the environment again and, when
// the whole of it is valid, swaps it in at once (SPEC §10): requests in
// flight finish under the policy they started with, the counters of
// unchanged rules are kept (counters are named by rule and key, never by
// policy), the remembered refusals of changed and removed rules are
// forgotten on every instance, and the metrics of removed rules and routes
// stop being reported. An invalid configuration changes nothing and comes
// back as *InvalidConfigError with every problem.
func (p *Proxy) Reload(source string) (ReloadResult, error) {
	c, err := config.Load(p.cfgPath, p.getenv)
	c.Demo = p.boot.Demo
	if !errors.Is(err, config.ErrFile) {
		err = errors.Join(err, c.Validate())
	}
	if err != nil {
		p.reloads.result("error")
		p.log.Error("configuration reload refused; nothing changed", "source", source, "err", oneLine(err))
		return ReloadResult{}, &InvalidConfigError{Errs: strings.Split(err.Error(), "\n")}
	}
	p.reload.Lock()
	defer p.reload.Unlock()
	cur := p.policy.Load()
	var res ReloadResult
	res.RestartRequired = keepRestartOnly(&c, cur.cfg)
	pol, err := p.compile(&c, nil, cur)
	if err != nil {
		p.reloads.result("error")
		p.log.Error("configuration reload refused; nothing changed", "source", source, "err", err)
		return ReloadResult{}, &InvalidConfigError{Errs: []string{err.Error()}}
	}
	res.Changed = settingChanges(cur.cfg, &c)
	res.Changed = append(res.Changed, p.swap(cur, pol)...)
	res.DroppedLive = cur.live.describe()
	if p.logLevel != nil {
		var lv slog.Level
		if lv.UnmarshalText([]byte(c.LogLevel)) == nil {
			p.logLevel.Set(lv)
		}
	}
	p.reloads.result("ok")
	p.log.Info("configuration reloaded", "source", source, "changed", res.Changed,
		"restart_required", res.RestartRequired, "dropped_live_changes", res.DroppedLive)
	for _, k := range res.RestartRequired {
		p.log.Warn("setting changed in the file but needs a restart; the running value is kept", "setting", k)
	}
	return res, nil
}

// keepRestartOnly copies the running values of the settings a reload
// cannot change into c and names those that differ.
func keepRestartOnly(c, running *config.Config) []string {
	if c.Demo && c.UpstreamURL == "" {
		c.UpstreamURL = running.UpstreamURL // the built-in mock's address
	}
	var differ []string
	for _, k := range restartOnly {
		if !config.Same(running, c, k) {
			differ = append(differ, k)
		}
	}
	c.ListenAddr, c.AdminAddr = running.ListenAddr, running.AdminAddr
	c.UpstreamURL, c.UpstreamTimeout = running.UpstreamURL, running.UpstreamTimeout
	c.RedisURL, c.RedisPrefix, c.RedisTimeout, c.RedisInstances = running.RedisURL, running.RedisPrefix, running.RedisTimeout, running.RedisInstances
	c.FailOpen, c.MaxTrackedKeys, c.RefusalCacheSize = running.FailOpen, running.MaxTrackedKeys, running.RefusalCacheSize
	c.LogFormat, c.StateFile, c.StateFlushInterval, c.ShutdownTimeout = running.LogFormat, running.StateFile, running.StateFlushInterval, running.ShutdownTimeout
	return differ
}

// settingChanges lists the top-level settings that differ, secrets shown
// redacted.
func settingChanges(old, c *config.Config) []string {
	var out []string
	for _, k := range config.Keys() {
		if config.Same(old, c, k) {
			continue
		}
		a, _ := config.Show(old, k)
		b, _ := config.Show(c, k)
		if reflect.DeepEqual(a, b) { // a secret: say that it changed, never what to
			out = append(out, k+": changed")
		} else {
			out = append(out, fmt.Sprintf("%s: %v → %v", k, a, b))
		}
	}
	return out
}

// swap installs pol in place of cur and does what follows from the
// difference: remembered refusals of changed or removed rules are
// forgotten (here and, through Redis, everywhere), removed rules' and
// routes' metrics dropped, replaced gates retired once their requests
// are done. It returns what changed among the rules and groups. p.reload
// is held.
func (p *Proxy) swap(cur, pol *policy) []string {
	var changed []string
	olds := map[string]*rule{}
	for _, ru := range cur.rules {
		olds[ru.lim.Name] = ru
	}
	var forget []string
	for _, ru := range pol.rules {
		o, ok := olds[ru.lim.Name]
		delete(olds, ru.lim.Name)
		switch {
		case !ok:
			changed = append(changed, "rule "+ru.lim.Name+": added")
		case !reflect.DeepEqual(o.conf, ru.conf):
			changed = append(changed, "rule "+ru.lim.Name+": "+ruleDiff(&o.conf, &ru.conf))
			forget = append(forget, ru.lim.Name)
		}
	}
	p.policy.Store(pol)
	removed := slices.Sorted(maps.Keys(olds))
	for _, name := range removed {
		changed = append(changed, "rule "+name+": removed")
		p.ruleSet.forgetRule(name)
	}
	// After the swap: a refusal remembered under the old rule meanwhile
	// is forgotten too.
	for _, name := range append(forget, removed...) {
		p.forget(name, limits.Key{})
	}
	p.metrics.forgetRoutes(pol.cfg.ProtectedPaths)
	if cur.jwt != nil && cur.jwt != pol.jwt {
		// Requests that started under cur may still verify with it: it
		// keeps working on its cached key set once closed.
		cur.jwt.Close()
	}
	return append(changed, retireGroups(cur.groups, pol.groups)...)
}

// ruleDiff names the fields of a rule that changed.
func ruleDiff(a, b *config.Rule) string {
	var parts []string
	va, vb := reflect.ValueOf(*a), reflect.ValueOf(*b)
	t := va.Type()
	for i := range t.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			parts = append(parts, fieldName(t.Field(i).Name))
		}
	}
	return strings.Join(parts, ", ") + " changed"
}

// fieldName is a Rule field's TOML name.
func fieldName(f string) string {
	switch f {
	case "OnMissingKey":
		return "on_missing_key"
	case "MaxDelay":
		return "max_delay"
	case "BurstSet":
		return "burst"
	}
	return strings.ToLower(f)
}

// reloadMetrics count reloads by result and stamp the last good one.
type reloadMetrics struct {
	total *prometheus.CounterVec
	last  prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) (*reloadMetrics, error) {
	m := &reloadMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_config_reloads_total",
			Help: "Configuration reloads (SIGHUP, POST /admin/reload) by result: ok, or error (the file was refused and nothing changed).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_config_last_reload_success_timestamp_seconds",
			Help: "When the configuration was last loaded successfully (the start, or a reload), as a Unix time.",
		}),
	}
	for _, c := range []prometheus.Collector{m.total, m.last} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.total.WithLabelValues("ok")
	m.total.WithLabelValues("error")
	m.last.SetToCurrentTime()
	return m, nil
}

func (m *reloadMetrics) result(r string) {
	m.total.WithLabelValues(r).Inc()
	if r == "ok" {
		m.last.SetToCurrentTime()
	}
}

// forgetRule stops reporting a removed rule's series.
func (m *ruleMetricSet) forgetRule(name string) {
	l := prometheus.Labels{"rule": name}
	m.decisions.DeletePartialMatch(l)
	m.shadow.DeletePartialMatch(l)
	m.usage.DeletePartialMatch(l)
	m.delayed.DeletePartialMatch(l)
	for _, v := range []*prometheus.CounterVec{m.budget.reserved, m.budget.settled, m.budget.refunded, m.budget.overrun, m.budget.clamped} {
		v.DeletePartialMatch(l)
	}
	m.spend.forgetRule(name)
}

func (m *spendMetrics) forgetRule(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.series {
		if k[0] == name {
			delete(m.series, k)
		}
	}
	m.spend.DeletePartialMatch(prometheus.Labels{"rule": name})
}

// oneLine joins the problems of a joined error with "; ".
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
