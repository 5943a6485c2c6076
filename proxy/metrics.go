package proxy

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// Decisions: the values of the decision label of SPEC §6.
const (
	decAllowed       = "allowed"
	decRateLimited   = "rate_limited"
	decTooLarge      = "too_large"
	decUnauthorized  = "unauthorized"
	decStoreError    = "store_error"
	decUpstreamError = "upstream_error"
	decClientClosed  = "client_closed"
	decInvalid       = "invalid_request"
	// decUnsupportedEncoding is a compressed protected body (415).
	decUnsupportedEncoding = "unsupported_encoding"
)

var decisions = []string{decAllowed, decRateLimited, decTooLarge, decUnauthorized, decStoreError, decUpstreamError, decClientClosed, decInvalid, decUnsupportedEncoding, decUpstreamBusy}

// routeUnprotected labels every request outside the protected routes.
const routeUnprotected = "unprotected"

// metrics holds the families of SPEC §6. Children for every (route,
// decision) pair are resolved once, at start, so a request pays no label
// lookup.
type metrics struct {
	requests    *prometheus.CounterVec
	guard       *prometheus.HistogramVec
	upstream    *prometheus.HistogramVec
	storeErrors prometheus.Counter
	inputTokens prometheus.Histogram
	// costLimited counts, by reason, the requests whose costing reached
	// the work bound (refused as over the cap); a child per reason exists
	// from the start.
	costLimited   *prometheus.CounterVec
	costLimitedBy map[string]prometheus.Counter
	unprotected   *routeMetrics
	mu            sync.Mutex
	routes        map[string]*routeMetrics // by PROTECTED_PATHS entry, made when a policy names it
}

type routeMetrics struct {
	requests map[string]prometheus.Counter
	guard    prometheus.Observer
	upstream prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_requests_total",
			Help: "Requests by route (a protected path, or \"unprotected\") and decision.",
		}, []string{"route", "decision"}),
		guard: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_guard_duration_seconds",
			Help:    "Time spent in the guard chain (identify, rate limit, caps) before forwarding or refusing.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}, []string{"route"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_upstream_duration_seconds",
			Help:    "Time from forwarding a request to the upstream's response headers (or the forwarding error).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"route"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_proxy_store_errors_total",
			Help: "Rate-limit decisions the state store failed to make.",
		}),
		inputTokens: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_input_tokens",
			Help:    "Estimated input tokens of protected requests (the count reached, for those stopped past the cap).",
			Buckets: []float64{50, 100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000},
		}),
		costLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_cost_limited_total",
			Help: "Requests refused as over the cap because costing their body reached the work bound, by the reader that reached it.",
		}, []string{"reason"}),
		costLimitedBy: map[string]prometheus.Counter{},
		routes:        map[string]*routeMetrics{},
	}
	for _, reason := range tokens.LimitReasons {
		m.costLimitedBy[reason] = m.costLimited.WithLabelValues(reason)
	}
	for _, c := range []prometheus.Collector{m.requests, m.guard, m.upstream, m.storeErrors, m.inputTokens, m.costLimited} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.unprotected = m.route(routeUnprotected)
	return m, nil
}

// route returns the metrics of a route label (a PROTECTED_PATHS entry, or
// routeUnprotected), resolving its children on first use. Policies call
// it when they are compiled, never a request.
func (m *metrics) route(label string) *routeMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rm, ok := m.routes[label]; ok {
		return rm
	}
	rm := &routeMetrics{
		requests: map[string]prometheus.Counter{},
		guard:    m.guard.WithLabelValues(label),
		upstream: m.upstream.WithLabelValues(label),
	}
	for _, d := range decisions {
		rm.requests[d] = m.requests.WithLabelValues(label, d)
	}
	m.routes[label] = rm
	return rm
}

// forgetRoutes stops reporting the routes a reload removed from
// PROTECTED_PATHS (keep lists the entries still in use).
func (m *metrics) forgetRoutes(keep []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for label := range m.routes {
		if label == routeUnprotected || slices.Contains(keep, label) {
			continue
		}
		delete(m.routes, label)
		for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{m.requests, m.guard, m.upstream} {
			v.DeletePartialMatch(prometheus.Labels{"route": label})
		}
	}
}
