package gate

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the families of SPEC §9, per group: in flight, queue depth
// by priority, queue wait, upstream 429s (and 503s), retries, refusals,
// the adaptive factor and the pause remaining. The gauges are read from
// the groups when scraped, so a request pays no gauge update.
type Metrics struct {
	wait      *prometheus.HistogramVec
	busyN     *prometheus.CounterVec
	throttleN *prometheus.CounterVec
	retriesN  *prometheus.CounterVec
	goneN     *prometheus.CounterVec

	inFlight, depth, fairKeys, factor, pause *prometheus.Desc

	mu     sync.Mutex
	groups map[*Group]struct{}
}

// NewMetrics registers the families on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_upstream_queue_wait_seconds",
			Help:    "Time requests admitted towards the upstream waited in the group's queue (0 when a slot was free).",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"group", "priority"}),
		busyN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_upstream_busy_total",
			Help: "Requests refused with 503 upstream_busy, by reason (queue_full, max_wait, paused).",
		}, []string{"group", "reason"}),
		throttleN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_upstream_throttled_total",
			Help: "Upstream answers 429 or 503 that paused the group, by status.",
		}, []string{"group", "status"}),
		retriesN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_upstream_retries_total",
			Help: "Requests sent again after an upstream 429 or 503.",
		}, []string{"group"}),
		goneN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_upstream_queue_abandoned_total",
			Help: "Requests whose client left while they waited in the queue.",
		}, []string{"group"}),
		inFlight: prometheus.NewDesc("ratelimit_proxy_upstream_in_flight",
			"Requests of the group at the upstream now, from this instance.", []string{"group"}, nil),
		depth: prometheus.NewDesc("ratelimit_proxy_upstream_queue_depth",
			"Requests of the group waiting in the queue on this instance, by priority.", []string{"group", "priority"}, nil),
		fairKeys: prometheus.NewDesc("ratelimit_proxy_upstream_queue_fair_keys",
			"Callers (values of the group's fair_by) with requests waiting on this instance, by priority: the callers taking turns.", []string{"group", "priority"}, nil),
		factor: prometheus.NewDesc("ratelimit_proxy_upstream_adaptive_factor",
			"The adaptive factor of the group's rate (1 without adaptive).", []string{"group"}, nil),
		pause: prometheus.NewDesc("ratelimit_proxy_upstream_pause_remaining_seconds",
			"Time until the group's pause after an upstream 429/503 ends (0: not paused).", []string{"group"}, nil),
		groups: map[*Group]struct{}{},
	}
	for _, c := range []prometheus.Collector{m.wait, m.busyN, m.throttleN, m.retriesN, m.goneN, m} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.inFlight
	ch <- m.depth
	ch <- m.fairKeys
	ch <- m.factor
	ch <- m.pause
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	gs := make([]*Group, 0, len(m.groups))
	for g := range m.groups {
		gs = append(gs, g)
	}
	m.mu.Unlock()
	for _, g := range gs {
		name := g.o.Name
		ch <- prometheus.MustNewConstMetric(m.inFlight, prometheus.GaugeValue, float64(g.InFlight()), name)
		for i, p := range g.o.Priorities {
			ch <- prometheus.MustNewConstMetric(m.depth, prometheus.GaugeValue, float64(g.Waiting(i)), name, p)
			if g.opts().Fair {
				ch <- prometheus.MustNewConstMetric(m.fairKeys, prometheus.GaugeValue, float64(g.FairKeys(i)), name, p)
			}
		}
		s := g.Snapshot()
		ch <- prometheus.MustNewConstMetric(m.factor, prometheus.GaugeValue, s.Factor, name)
		ch <- prometheus.MustNewConstMetric(m.pause, prometheus.GaugeValue, s.Pause.Seconds(), name)
	}
}

// groupMetrics are one group's children, resolved once.
type groupMetrics struct {
	wait    []prometheus.Observer // by priority
	reasons map[string]prometheus.Counter
	status  map[int]prometheus.Counter
	retries prometheus.Counter
	gone    prometheus.Counter
}

func (m *Metrics) group(g *Group) *groupMetrics {
	name := g.o.Name
	gm := &groupMetrics{reasons: map[string]prometheus.Counter{}, status: map[int]prometheus.Counter{},
		retries: m.retriesN.WithLabelValues(name), gone: m.goneN.WithLabelValues(name)}
	for _, p := range g.o.Priorities {
		gm.wait = append(gm.wait, m.wait.WithLabelValues(name, p))
	}
	for _, r := range []string{ReasonQueueFull, ReasonMaxWait, ReasonPaused} {
		gm.reasons[r] = m.busyN.WithLabelValues(name, r)
	}
	for _, s := range []int{429, 503} {
		gm.status[s] = m.throttleN.WithLabelValues(name, strconv.Itoa(s))
	}
	m.mu.Lock()
	m.groups[g] = struct{}{}
	m.mu.Unlock()
	return gm
}

// drop stops reporting a closed group's gauges (its counters stay).
func (m *Metrics) drop(g *Group) {
	m.mu.Lock()
	delete(m.groups, g)
	m.mu.Unlock()
}

// forget deletes a removed group's counter and histogram series.
func (m *Metrics) forget(name string) {
	l := prometheus.Labels{"group": name}
	m.wait.DeletePartialMatch(l)
	m.busyN.DeletePartialMatch(l)
	m.throttleN.DeletePartialMatch(l)
	m.retriesN.DeletePartialMatch(l)
	m.goneN.DeletePartialMatch(l)
}

func (gm *groupMetrics) waited(prio int, d time.Duration) { gm.wait[prio].Observe(d.Seconds()) }
func (gm *groupMetrics) busy(reason string)               { gm.reasons[reason].Inc() }
func (gm *groupMetrics) throttled(status int)             { gm.status[status].Inc() }
