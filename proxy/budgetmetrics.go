package proxy

import (
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// tokenMetrics are one token rule's counters (SPEC §8).
type tokenMetrics struct {
	reserved, settled, refunded, overrun prometheus.Counter
	clamped                              prometheus.Counter // clamping rules only
}

// budgetMetrics are the token-budget families: per-rule counters, and how
// far the input estimate was from the usage reported, per model.
type budgetMetrics struct {
	reserved, settled, refunded, overrun *prometheus.CounterVec
	estimate                             *prometheus.HistogramVec
	outputReserve                        *prometheus.GaugeVec   // OUTPUT_TOKEN_RESERVE = "learned"
	clamped                              *prometheus.CounterVec // output = "clamp": caps lowered or added, by deciding rule
	mu                                   sync.Mutex
	models                               map[string]prometheus.Observer
}

// maxModelLabels bounds the model label: request bodies name the model, so
// an attacker could otherwise mint series without end.
const maxModelLabels = 64

func newBudgetMetrics(reg prometheus.Registerer) (*budgetMetrics, error) {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"rule"})
	}
	m := &budgetMetrics{
		reserved: counter("ratelimit_proxy_tokens_reserved_total",
			"Tokens charged at admission by token rules: the input estimate (input_tokens), plus the requested output (total_tokens)."),
		settled: counter("ratelimit_proxy_tokens_settled_total",
			"Tokens total_tokens rules settled to when responses ended: the usage reported, else the input estimate plus the output that passed."),
		refunded: counter("ratelimit_proxy_tokens_refunded_total",
			"Tokens given back by settlement: reserved but not used."),
		overrun: counter("ratelimit_proxy_tokens_overrun_total",
			"Tokens charged by settlement beyond the reservation (output past what was reserved)."),
		estimate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_input_estimate_error_tokens",
			Help:    "Input tokens the upstream reported minus the proxy's estimate, per model (at most 64 model labels, then \"other\").",
			Buckets: []float64{-1000, -300, -100, -30, -10, -3, -1, 0, 1, 3, 10, 30, 100, 300, 1000},
		}, []string{"model"}),
		outputReserve: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_output_reserve_tokens",
			Help: "With OUTPUT_TOKEN_RESERVE = \"learned\": the output tokens reserved for a request of this model that names no cap (the 95th percentile of its last 1000 settled outputs on this instance, never below OUTPUT_TOKEN_RESERVE_MIN; at most 64 model labels, then \"other\").",
		}, []string{"model"}),
		clamped: counter("ratelimit_proxy_output_clamped_total",
			"Requests whose output cap was lowered or added (output = \"clamp\"), by the rule whose remaining budget set it."),
		models: map[string]prometheus.Observer{},
	}
	for _, c := range []prometheus.Collector{m.reserved, m.settled, m.refunded, m.overrun, m.estimate, m.outputReserve, m.clamped} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *budgetMetrics) rule(name string) tokenMetrics {
	return tokenMetrics{reserved: m.reserved.WithLabelValues(name), settled: m.settled.WithLabelValues(name),
		refunded: m.refunded.WithLabelValues(name), overrun: m.overrun.WithLabelValues(name)}
}

// estimateError observes reported − estimated input tokens for model.
func (m *budgetMetrics) estimateError(model string, diff int64) {
	model = modelLabel(model)
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.models[model]
	if !ok {
		if len(m.models) >= maxModelLabels {
			model = "other"
		}
		if o, ok = m.models[model]; !ok {
			var err error
			if o, err = m.estimate.GetMetricWithLabelValues(model); err != nil {
				return
			}
			m.models[model] = o
		}
	}
	o.Observe(float64(diff))
}

// modelLabel is a request's model as a label value: valid UTF-8, at most
// 64 bytes, "unknown" when empty (the body names it: anything can come).
func modelLabel(model string) string {
	model = strings.ToValidUTF8(model, "\uFFFD")
	if len(model) > 64 {
		cut := 64
		for cut > 0 && !utf8.RuneStart(model[cut]) {
			cut--
		}
		model = model[:cut]
	}
	if model == "" {
		return "unknown"
	}
	return model
}
