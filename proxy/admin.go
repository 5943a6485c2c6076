package proxy

import (
	"encoding/json"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// AdminHandler serves the admin listener: /metrics from g, /healthz,
// /readyz (open to the scraper and the orchestrator), the admin API of
// SPEC §10 under /admin/ and /debug/pprof/ (behind ADMIN_TOKEN when set).
// It must never be mounted on the public listener.
func (p *Proxy) AdminHandler(g prometheus.Gatherer) http.Handler {
	r := chi.NewRouter()
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: false,
	}))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	r.Get("/readyz", p.readyz)
	// Go's profiler, for operators chasing CPU or memory, behind the same
	// token as the admin API.
	r.Mount("/debug", p.adminAuth(middleware.Profiler()))
	r.Route("/admin", p.adminRoutes)
	return r
}

// readyz is 200 while the proxy serves as configured, with the state
// store's state in the body; 503 when it cannot: the store is down and
// FAIL_OPEN=false refuses every protected request.
func (p *Proxy) readyz(w http.ResponseWriter, _ *http.Request) {
	up := p.storeUp()
	state := "up"
	if !up {
		state = "down"
	}
	enabled := p.policy.Load().cfg.RateLimitEnabled
	ready := up || p.boot.FailOpen != config.FailOpenFalse || !enabled
	body := map[string]any{
		"status":             "ready",
		"store":              p.storeName,
		"store_state":        state,
		"fail_open":          p.boot.FailOpen,
		"rate_limit_enabled": enabled,
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ready {
		body["status"] = "unavailable"
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	json.NewEncoder(w).Encode(body)
}

// registerStoreStats exports the store's bookkeeping: tracked keys and
// evictions by reason.
func registerStoreStats(reg prometheus.Registerer, stats func() limits.MemoryStats) error {
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_tracked_keys",
			Help: "Rate-limit counters (rule and key) held in memory.",
		}, func() float64 { return float64(stats().Keys) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ratelimit_proxy_evictions_total",
			Help:        "Counters dropped from memory: expired (idle) or capacity (max_tracked_keys reached, least recently used).",
			ConstLabels: prometheus.Labels{"reason": "expired"},
		}, func() float64 { return float64(stats().ExpiredEvictions) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ratelimit_proxy_evictions_total",
			Help:        "Counters dropped from memory: expired (idle) or capacity (max_tracked_keys reached, least recently used).",
			ConstLabels: prometheus.Labels{"reason": "capacity"},
		}, func() float64 { return float64(stats().CapacityEvicted) }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// registerRefusalStats exports the memory of refusals: requests refused
// from it, entries held, and entries dropped for room.
func registerRefusalStats(reg prometheus.Registerer, stats func() limits.RememberStats) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimit_proxy_refusal_cache_hits_total",
			Help: "Requests refused from this instance's memory of refusals, without asking the store.",
		}, func() float64 { return float64(stats().Hits) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_refusal_cache_entries",
			Help: "Refusals remembered (a refused rule and key, until its wait ends).",
		}, func() float64 { return float64(stats().Entries) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimit_proxy_refusal_cache_evictions_total",
			Help: "Remembered refusals dropped for room (refusal_cache_size reached).",
		}, func() float64 { return float64(stats().Evictions) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
