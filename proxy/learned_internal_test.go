package proxy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// nearestRank95 is the definition: the ⌈0.95 n⌉-th smallest of the last
// learnedWindow values, floor while fewer than learnedWarm.
func nearestRank95(vals []int64, floor int64) int64 {
	if len(vals) > learnedWindow {
		vals = vals[len(vals)-learnedWindow:]
	}
	if len(vals) < learnedWarm {
		return floor
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	rank := (95*len(s) + 99) / 100
	return max(s[rank-1], floor)
}

// The sample's percentile is the nearest rank over exactly the last 1000
// outputs, at every step, whatever their order or repeats.
func TestLearnedReserveIsTheNearestRank(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, gen := range []struct {
		name string
		next func(i int) int64
	}{
		{"lognormal", func(int) int64 { return int64(200 * expish(r)) }},
		{"few values", func(int) int64 { return int64(r.IntN(4)) * 100 }},
		{"rising", func(i int) int64 { return int64(i) }},
		{"falling", func(i int) int64 { return int64(5000 - i) }},
		{"huge", func(int) int64 { return 1 << 40 }},
	} {
		t.Run(gen.name, func(t *testing.T) {
			l := newOutputLearner(nil)
			const floor = 7
			var vals []int64
			for i := range 2600 {
				v := gen.next(i)
				l.learn("m", v, floor)
				vals = append(vals, min(max(v, 0), 1<<31-1))
				if got, want := l.reserve("m", floor), nearestRank95(vals, floor); got != want {
					t.Fatalf("after %d outputs: %d, want %d", i+1, got, want)
				}
			}
		})
	}
}

func expish(r *rand.Rand) float64 { return r.ExpFloat64() * r.ExpFloat64() }

// The floor holds while learning and under the learned value; an unseen
// model gets the floor; a raised floor applies at once.
func TestLearnedReserveFloor(t *testing.T) {
	l := newOutputLearner(nil)
	if got := l.reserve("never", 256); got != 256 {
		t.Fatalf("unseen model: %d", got)
	}
	for range learnedWarm - 1 {
		l.learn("m", 5000, 256)
	}
	if got := l.reserve("m", 256); got != 256 {
		t.Fatalf("99 settled: %d, want the floor", got)
	}
	l.learn("m", 5000, 256)
	if got := l.reserve("m", 256); got != 5000 {
		t.Fatalf("100 settled: %d", got)
	}
	if got := l.reserve("m", 8000); got != 8000 {
		t.Fatalf("a floor above what was learned: %d", got)
	}
}

// Models are learned apart, at most learnedModels of them, then in
// "other"; the gauge follows each.
func TestLearnedReserveModelsBounded(t *testing.T) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g"}, []string{"model"})
	l := newOutputLearner(g)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				for range learnedWarm {
					l.learn(fmt.Sprintf("model-%d", (i*4+w)%200), int64(i+1), 1)
				}
			}
		}()
	}
	wg.Wait()
	m := *l.models.Load()
	if len(m) != learnedModels+1 || m["other"] == nil {
		t.Fatalf("%d samples, other %v", len(m), m["other"] != nil)
	}
	if n := testutil.CollectAndCount(g); n != learnedModels+1 {
		t.Fatalf("%d gauge series", n)
	}
	for name, s := range m {
		if v := testutil.ToFloat64(g.WithLabelValues(name)); v != float64(s.p95.Load()) {
			t.Fatalf("%s: gauge %v, reserve %d", name, v, s.p95.Load())
		}
	}
	if unseen := l.reserve("a-new-model", 1); unseen != m["other"].p95.Load() {
		t.Fatalf("a new model past the bound reserves %d, other has %d", unseen, m["other"].p95.Load())
	}
}

// BenchmarkLearnedReserve: a settlement's update (a full window) and a
// reservation's read.
func BenchmarkLearnedReserve(b *testing.B) {
	l := newOutputLearner(nil)
	r := rand.New(rand.NewPCG(1, 2))
	for range learnedWindow {
		l.learn("gpt-4o", int64(200*expish(r)), 256)
	}
	b.Run("learn", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.learn("gpt-4o", int64(200*expish(r)), 256)
		}
	})
	b.Run("reserve", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.reserve("gpt-4o", 256)
		}
	})
}
