package proxy

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// OUTPUT_TOKEN_RESERVE = "learned": the output reserved for a request that
// names no cap is the nearest-rank 95th percentile of the output tokens of
// the last learnedWindow responses settled for its model on this
// instance, never below OUTPUT_TOKEN_RESERVE_MIN, which is also the
// reserve until learnedWarm have settled.
//
// Each model keeps its last learnedWindow outputs exactly, in a ring, and
// the same values sorted: a settlement takes the oldest value out of the
// sorted copy and puts the new one in (two binary searches and two moves
// of at most 4 KB), and the percentile is then one index, published for
// readers in an atomic. An exact window rather than a quantile sketch:
// 1000 int32s are 8 KB a model with both copies, the answer is the exact
// nearest rank the contract names (a sketch would be within its error of
// it), and the cost per settlement is a microsecond at most, off the
// request's path (settlement runs when the response has ended).
//
// With Redis the samples are shared (limits.SharedSamples): every
// learnedSync an instance sends the outputs it settled and takes each
// model's last learnedWindow outputs of every instance as its sample, so
// the instances reserve alike and a new one starts from what the others
// learned. Between syncs an instance adds its own outputs as they come.
const (
	learnedWindow = 1000
	learnedWarm   = 100
	// learnedModels bounds the models learned separately: the body names
	// the model, so anything can come. Beyond it, models share "other".
	learnedModels = maxModelLabels
)

// outputSample is one model's last outputs.
type outputSample struct {
	name   string // the model's label
	mu     sync.Mutex
	ring   [learnedWindow]int32
	next   int     // where the next output goes in ring
	sorted []int32 // ring's values in order, len = how many have settled (≤ learnedWindow)
	p95    atomic.Int64
	gauge  prometheus.Gauge
}

// add records one settled output and publishes the new percentile.
func (s *outputSample) add(out int64, floor int64) {
	v := int32(min(max(out, 0), math.MaxInt32))
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sorted) == learnedWindow {
		old := s.ring[s.next]
		i, _ := slices.BinarySearch(s.sorted, old)
		s.sorted = slices.Delete(s.sorted, i, i+1)
	}
	s.ring[s.next] = v
	s.next = (s.next + 1) % learnedWindow
	i, _ := slices.BinarySearch(s.sorted, v)
	s.sorted = slices.Insert(s.sorted, i, v)
	s.publish(floor)
}

// replace makes the sample the last learnedWindow of values (oldest
// first): what every instance sharing a Redis learned.
func (s *outputSample) replace(values []int64, floor int64) {
	values = values[max(len(values)-learnedWindow, 0):]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sorted = s.sorted[:0]
	for i, out := range values {
		v := int32(min(max(out, 0), math.MaxInt32))
		s.ring[i] = v
		s.sorted = append(s.sorted, v)
	}
	s.next = len(values) % learnedWindow
	slices.Sort(s.sorted)
	s.publish(floor)
}

// publish computes the percentile of sorted for readers; under s.mu.
func (s *outputSample) publish(floor int64) {
	p := floor
	if n := len(s.sorted); n >= learnedWarm {
		rank := (95*n + 99) / 100 // ⌈0.95 n⌉, the nearest rank
		p = max(int64(s.sorted[rank-1]), floor)
	}
	s.p95.Store(p)
	if s.gauge != nil {
		s.gauge.Set(float64(p))
	}
}

// outputLearner holds the samples of every model seen, published as a
// map that is copied when a model is added (rare) and read without a lock.
type outputLearner struct {
	gauge  *prometheus.GaugeVec
	share  *limits.SharedSamples // with Redis: every instance's outputs; nil: this one's
	mu     sync.Mutex            // serialises additions of models
	models atomic.Pointer[map[string]*outputSample]
}

func newOutputLearner(gauge *prometheus.GaugeVec) *outputLearner {
	l := &outputLearner{gauge: gauge}
	l.models.Store(&map[string]*outputSample{})
	return l
}

// reserve is the output to reserve for a request of model that names no
// cap: the model's learned percentile, never below floor, which is also
// the reserve while the model is learning.
func (l *outputLearner) reserve(model string, floor int64) int64 {
	s := l.sample(model, false)
	if s == nil {
		return floor
	}
	return max(s.p95.Load(), floor)
}

// learn records an output settled for model.
func (l *outputLearner) learn(model string, output, floor int64) {
	s := l.sample(model, true)
	s.add(output, floor)
	if l.share != nil {
		l.share.Add(s.name, output)
	}
}

// learnedSync is how often an instance sends its outputs to Redis and
// reads back every instance's.
const learnedSync = 2 * time.Second

// sync sends this instance's outputs since the last sync and makes each
// model's sample what every instance learned.
func (l *outputLearner) sync(ctx context.Context, floor int64) error {
	shared, err := l.share.Sync(ctx)
	if err != nil {
		return err
	}
	for name, values := range shared {
		l.sample(name, true).replace(values, floor)
	}
	return nil
}

// sample finds model's sample ("other" once learnedModels are known), and
// makes it when create is set.
func (l *outputLearner) sample(model string, create bool) *outputSample {
	model = modelLabel(model)
	m := *l.models.Load()
	if s, ok := m[model]; ok {
		return s
	}
	if len(m) >= learnedModels {
		model = "other"
		if s, ok := m[model]; ok || !create {
			return s
		}
	}
	if !create {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m = *l.models.Load()
	if s, ok := m[model]; ok {
		return s
	}
	if len(m) >= learnedModels && model != "other" {
		model = "other" // the bound was reached meanwhile
		if s, ok := m[model]; ok {
			return s
		}
	}
	s := &outputSample{name: model, sorted: make([]int32, 0, learnedWindow)}
	if l.gauge != nil {
		s.gauge = l.gauge.WithLabelValues(model)
	}
	next := make(map[string]*outputSample, len(m)+1)
	for k, v := range m {
		next[k] = v
	}
	next[model] = s
	l.models.Store(&next)
	return s
}

// NewLearnedShare is the sharing of learned outputs between the instances
// of one Redis (Options.LearnedShare): each model's last outputs, under
// prefix.
func NewLearnedShare(client redis.UniversalClient, prefix string, timeout time.Duration) *limits.SharedSamples {
	return limits.NewSharedSamples(limits.SharedSamplesOptions{Client: client, Prefix: prefix, Name: "learned",
		Window: learnedWindow, Names: learnedModels + 1, Timeout: max(timeout, time.Second)})
}
