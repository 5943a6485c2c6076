package proxy

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A replay of a synthetic day: what OUTPUT_TOKEN_RESERVE = "learned"
// changes against a fixed 1024. The workload (seeded: every run is the
// same): 200 callers, each with a total_tokens budget of 100,000 a day,
// each sending 150 requests that name no output cap, four at a time (four
// admitted or refused, then the admitted ones settled), 70 % to a chat
// model and 30 % to a reasoning model. Inputs are log-normal (median 400
// tokens, σ 1); outputs log-normal and skewed — chat median 180 (σ 0.9,
// p95 ≈ 790), reasoning median 1500 (σ 0.7, p95 ≈ 4,700) — cut at 16,000.
// A request is admitted when its input plus reserve fits what remains of
// its caller's budget, and settles to its input plus its actual output,
// as the store does (a settlement past the limit is charged: overshoot).
type replayStats struct {
	admitted, refused int
	wrongful          int // refusals of callers whose whole day fitted their budget
}

type replayResult struct {
	models    map[string]*replayStats
	overshoot int64 // tokens settled beyond the limit, over all callers
	over      int   // callers whose day ended past their limit
	fitted    int   // callers whose whole day (inputs + actual outputs) fitted their budget
}

func replay(learned bool, reasoningShare float64) replayResult {
	r := rand.New(rand.NewPCG(2026, 11))
	l := newOutputLearner(nil)
	const (
		callers  = 200
		perDay   = 150
		limit    = 100_000
		parallel = 4
		fixed    = 1024
		floor    = 256
	)
	logNormal := func(median, sigma float64) int64 {
		return int64(math.Min(math.Round(median*math.Exp(sigma*r.NormFloat64())), 16_000))
	}
	res := replayResult{models: map[string]*replayStats{"chat": {}, "reasoning": {}}}
	type flight struct {
		model                  string
		input, reserve, output int64
	}
	for range callers {
		// The caller's day, drawn first: its size spreads around the
		// budget (20 to 150 requests), so that some callers fit and some
		// do not.
		n := 20 + r.IntN(perDay-20+1)
		day := make([]flight, n)
		demand := int64(0)
		for i := range day {
			model, output := "chat", logNormal(180, 0.9)
			if r.Float64() < reasoningShare {
				model, output = "reasoning", logNormal(1500, 0.7)
			}
			day[i] = flight{model: model, input: logNormal(400, 1.0), output: output}
			demand += day[i].input + day[i].output
		}
		fits := demand <= limit
		if fits {
			res.fitted++
		}
		used := int64(0)
		for sent := 0; sent < n; sent += parallel {
			var in []flight
			for _, f := range day[sent:min(sent+parallel, n)] {
				model, input, output := f.model, f.input, f.output
				reserve := int64(fixed)
				if learned {
					reserve = l.reserve(model, floor)
				}
				st := res.models[model]
				if used+input+reserve > limit {
					st.refused++
					if fits {
						st.wrongful++
					}
					continue
				}
				st.admitted++
				used += input + reserve
				in = append(in, flight{model, input, reserve, output})
			}
			for _, f := range in {
				used += f.output - f.reserve
				if learned {
					l.learn(f.model, f.output, floor)
				}
			}
		}
		if used > limit {
			res.overshoot += used - limit
			res.over++
		}
	}
	return res
}

// The replay's table (go test -v -run TestLearnedReserveReplay ./proxy/).
// A fixed reserve is wrong both ways: above a model's usual output it
// refuses callers who would have fitted, below it a budget is overshot.
// The learned reserve follows each model: with chat only, it refuses
// fewer of the callers who fitted (admitting more); with the reasoning
// model, whose outputs pass 1024, it overshoots far less; in the mix,
// far less overshoot.
func TestLearnedReserveReplay(t *testing.T) {
	t.Logf("| workload | reserve | admitted | refused | refusals of callers whose day fitted | callers past their limit | tokens settled past the limits |")
	t.Logf("|---|---|---:|---:|---:|---:|---:|")
	type row struct{ admitted, refused, wrongful int }
	sum := func(r replayResult) (out row) {
		for _, s := range r.models {
			out.admitted += s.admitted
			out.refused += s.refused
			out.wrongful += s.wrongful
		}
		return out
	}
	for _, w := range []struct {
		name  string
		share float64
	}{{"chat only", 0}, {"reasoning only", 1}, {"70 % chat, 30 % reasoning", 0.3}} {
		fixed, learned := replay(false, w.share), replay(true, w.share)
		f, l := sum(fixed), sum(learned)
		t.Logf("| %s (%d of 200 callers fit) | fixed 1024 | %d | %d | %d | %d | %d |", w.name, fixed.fitted, f.admitted, f.refused, f.wrongful, fixed.over, fixed.overshoot)
		t.Logf("| | learned | %d | %d | %d | %d | %d |", l.admitted, l.refused, l.wrongful, learned.over, learned.overshoot)
		switch w.share {
		case 0:
			if l.wrongful > f.wrongful || l.admitted <= f.admitted {
				t.Errorf("%s: learned refused %d of the callers who fitted and admitted %d; fixed %d and %d", w.name, l.wrongful, l.admitted, f.wrongful, f.admitted)
			}
		default:
			if learned.overshoot*4 > fixed.overshoot {
				t.Errorf("%s: learned overshot by %d tokens, fixed by %d", w.name, learned.overshoot, fixed.overshoot)
			}
		}
	}
}
