package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
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
	routes      map[string]*routeMetrics
}

type routeMetrics struct {
	requests map[string]prometheus.Counter
	guard    prometheus.Observer
	upstream prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, routes []string) (*metrics, error) {
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
		routes: map[string]*routeMetrics{},
	}
	for _, c := range []prometheus.Collector{m.requests, m.guard, m.upstream, m.storeErrors, m.inputTokens} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, route := range append(append([]string(nil), routes...), routeUnprotected) {
		rm := &routeMetrics{
			requests: map[string]prometheus.Counter{},
			guard:    m.guard.WithLabelValues(route),
			upstream: m.upstream.WithLabelValues(route),
		}
		for _, d := range decisions {
			rm.requests[d] = m.requests.WithLabelValues(route, d)
		}
		m.routes[route] = rm
	}
	return m, nil
}

// route returns the metrics of a protected path, or of the unprotected
// routes.
func (m *metrics) route(path string) *routeMetrics {
	if rm, ok := m.routes[path]; ok {
		return rm
	}
	return m.routes[routeUnprotected]
}
