package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// StoreMetrics observes the shared state store: call latency, errors by
// kind, whether it is up, and decisions made by the local fallback. Its
// methods are the callbacks of limits.RedisOptions and limits.Fallback;
// it logs each up/down transition once.
type StoreMetrics struct {
	mu          sync.Mutex
	down        map[string]bool // shards whose breaker is open
	log         *slog.Logger
	latency     prometheus.Histogram
	errors      *prometheus.CounterVec
	up          prometheus.Gauge
	transitions *prometheus.CounterVec
	fallbacks   prometheus.Counter
}

// NewStoreMetrics registers the store families on reg.
func NewStoreMetrics(reg prometheus.Registerer, log *slog.Logger) (*StoreMetrics, error) {
	m := &StoreMetrics{
		down: map[string]bool{},
		log:  log,
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_store_call_duration_seconds",
			Help:    "Duration of calls to the shared state store (one per decision).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_store_call_errors_total",
			Help: "Failed calls to the shared state store by kind (timeout, connection, redis).",
		}, []string{"kind"}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_store_up",
			Help: "1 while the shared state store is reachable (every shard's circuit breaker closed), 0 while any shard is skipped.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_store_transitions_total",
			Help: "Times the shared state store went down (breaker opened) or came back (breaker closed).",
		}, []string{"to"}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_proxy_store_fallback_decisions_total",
			Help: "Decisions made by the local in-memory limiter while the shared store was down (fail_open = \"local\").",
		}),
	}
	for _, c := range []prometheus.Collector{m.latency, m.errors, m.up, m.transitions, m.fallbacks} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, k := range []string{"timeout", "connection", "redis"} {
		m.errors.WithLabelValues(k)
	}
	m.transitions.WithLabelValues("down")
	m.transitions.WithLabelValues("up")
	m.up.Set(1)
	return m, nil
}

// Call records one store call.
func (m *StoreMetrics) Call(d time.Duration, err error) {
	m.latency.Observe(d.Seconds())
	if err != nil {
		m.errors.WithLabelValues(errorKind(err)).Inc()
	}
}

// StateChange records (and logs, once per transition) a shard of the
// store going down or coming back; shard is a cluster master's address,
// "" for a single server or a Sentinel-managed master.
func (m *StoreMetrics) StateChange(shard string, up bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	attrs := []any{}
	if shard != "" {
		attrs = append(attrs, "shard", shard)
	}
	if up {
		delete(m.down, shard)
		m.transitions.WithLabelValues("up").Inc()
		if len(m.down) == 0 {
			m.up.Set(1)
		}
		m.log.Info("state store reachable again: shared rate limiting resumed", attrs...)
		return
	}
	m.down[shard] = true
	m.transitions.WithLabelValues("down").Inc()
	m.up.Set(0)
	m.log.Error("state store unreachable: skipping it until a probe succeeds", append(attrs, "err", err, "kind", errorKind(err))...)
}

// Fallback counts a decision made locally.
func (m *StoreMetrics) Fallback() { m.fallbacks.Inc() }

func errorKind(err error) string {
	var ne net.Error
	var re redis.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &re):
		return "redis"
	default:
		return "connection"
	}
}
