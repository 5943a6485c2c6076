package proxy

import (
	"encoding/json"
	"math"
	"math/bits"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// Money budgets (SPEC §8.1): a usd rule charges what a request costs at
// the configured prices, in integers of 10⁻⁶ USD, reserved at admission
// and settled like total_tokens. Prices are integers of 10⁻⁶ USD per
// million tokens, so tokens × price is in 10⁻¹² USD; each charge is that
// sum rounded up once to whole micro-dollars, so nothing drifts.

const codeInsufficientQuota = "insufficient_quota"
const codeUnpricedModel = "unpriced_model"

// picoUSD sums tokens × price products exactly (128 bits) and returns the
// sum in micro-dollars rounded up, saturated at maxReserve.
type picoUSD struct{ hi, lo uint64 }

func (s *picoUSD) add(tokens, price int64) {
	if tokens <= 0 || price <= 0 {
		return
	}
	hi, lo := bits.Mul64(uint64(tokens), uint64(price))
	var carry uint64
	s.lo, carry = bits.Add64(s.lo, lo, 0)
	s.hi += hi + carry
}

func (s *picoUSD) micro() int64 {
	const scale = config.PriceScale // 10⁻¹² USD → 10⁻⁶ USD
	if s.hi >= scale {
		return maxReserve
	}
	q, r := bits.Div64(s.hi, s.lo, scale)
	if r > 0 {
		q++
	}
	return int64(min(q, maxReserve))
}

// rates are the input and output prices for an input of n tokens: the
// long-context ones past the price's threshold.
func rates(p *config.Price, n int64) (in, out int64) {
	if p.LongAbove > 0 && n > p.LongAbove {
		return p.LongInput, p.LongOutput
	}
	return p.Input, p.Output
}

// reserveUSD is a usd rule's reservation: the input estimate at the input
// price plus the requested output at the output price, both long-context
// when the estimate passes the threshold.
func reserveUSD(p *config.Price, input, output int64) int64 {
	in, out := rates(p, input)
	var s picoUSD
	s.add(input, in)
	s.add(output, out)
	return s.micro()
}

// settleUSD is what a response cost: the reported usage at every price
// that applies (fresh and cached input, cache writes, output with its
// reasoning; long-context prices when the reported input, cache included,
// passes the threshold), else the input estimate and the output that
// passed.
func settleUSD(p *config.Price, estimate int64, res usage.Result) int64 {
	var s picoUSD
	if !res.Reported {
		in, out := rates(p, estimate)
		s.add(estimate, in)
		s.add(res.Output, out)
		return s.micro()
	}
	u := res.Usage
	in, out := rates(p, u.Input)
	fresh := max(u.Input-u.CachedInput-u.CacheWrite, 0)
	s.add(fresh, in)
	s.add(u.CachedInput, p.CachedInput)
	s.add(u.CacheWrite, p.CacheWrite)
	s.add(u.Output, out)
	return s.micro()
}

// usdCost is a usd rule's cost for the request (priced). For a model no
// price matches an enforcing rule's denial is 400 unpriced_model: an
// unknown price never lets spend through; a shadow rule never refuses, so
// it logs and counts a would-be refusal and is left out (priced false).
func (x *exchange) usdCost(ru *rule) (cost int64, priced bool, d *denial) {
	in := &x.keys
	model := in.model
	if x.est.Batch > 0 {
		// A batch has no top-level model: its members name it, and
		// must agree (else 400, as a key part).
		model = in.bodyField("model")
	}
	price, found := x.pol.prices.Match(model)
	if !found && ru.action == actShadow {
		x.shadowWouldRefuse(ru, codeUnpricedModel)
		return 0, false, nil
	}
	if !found {
		return 0, false, x.refuse(decInvalid, http.StatusBadRequest, codeUnpricedModel,
			"No price is configured for this model, so rule "+ru.lim.Name+" cannot charge it.").
			with(field{"model", model}, field{"denied_by", ru.lim.Name}).
			counted(ru.metrics.refused).
			logged("rule", ru.lim.Name, "reason", codeUnpricedModel, "path", x.r.URL.Path)
	}
	x.budget.price, x.budget.model = price, model
	if ru.clamp && x.clampable() {
		return 0, true, nil // clampUSD sets the hit's cost
	}
	out := requestedOutput(in, x.outputReserve(), int64(x.est.Batch))
	return reserveUSD(price, int64(x.est.Tokens), out), true, nil
}

// clampUSD makes a clamping usd hit (SPEC §8.2): the input's price
// (rounded up to the micro-dollar) plus an output the store may lower to
// what remains, at the output price per token of every choice. Its full
// cost is never below the exact reservation of the output asked.
func (x *exchange) clampUSD(ru *rule, h *limits.Hit) {
	p, input := x.budget.price, int64(x.est.Tokens)
	_, outPrice := rates(p, input)
	base := reserveUSD(p, input, 0)
	out, choices := outputAsked(&x.keys, x.outputReserve(), int64(x.est.Batch))
	per := float64(outPrice) * float64(choices) / 1e6 // µUSD per output token, all choices
	if per <= 0 {
		h.Cost = base // free output: nothing to clamp
		return
	}
	out = max(min(out, int64(float64(maxReserve-base)/per)), 0)
	h.Clamp = limits.Clamp{Base: base, Per: per, Max: out, Min: ru.minOutput}
	h.Cost = base + int64(math.Ceil(float64(out)*per))
	if exact := reserveUSD(p, input, out*choices); exact > h.Cost {
		h.Cost = exact // float rounding: the store then charges the exact amount
	}
}

// usdFits is the output the charge of usd hit i covers exactly, at most
// o: the store lowers in float arithmetic, so a product rounded below
// its exact value costs an output token.
func (x *exchange) usdFits(i int, o int64) int64 {
	p, input := x.budget.price, int64(x.est.Tokens)
	_, choices := outputAsked(&x.keys, x.outputReserve(), int64(x.est.Batch))
	for o > 1 && reserveUSD(p, input, o*choices) > x.hits[i].Cost {
		o--
	}
	return o
}

// dollars is an amount of micro-dollars as a JSON number of dollars.
func dollars(micro int64) json.Number { return json.Number(config.Dollars(micro)) }

// spendMetrics are the money families: settled spend per rule and model,
// and settled minus reserved per model (what was held for nothing).
type spendMetrics struct {
	spend  *prometheus.CounterVec
	excess *prometheus.HistogramVec
	mu     sync.Mutex
	models map[string]bool // model labels in use (bounded)
	// series caches the children of (rule, model) pairs seen.
	series map[[2]string]spendSeries
}

type spendSeries struct {
	spend  prometheus.Counter
	excess prometheus.Observer
}

func newSpendMetrics(reg prometheus.Registerer) (*spendMetrics, error) {
	m := &spendMetrics{
		spend: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_proxy_spend_usd_total",
			Help: "Spend usd rules settled to, in USD, per rule and model (at most 64 model labels, then \"other\").",
		}, []string{"rule", "model"}),
		excess: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_proxy_spend_settle_delta_usd",
			Help:    "Settled minus reserved USD of usd-rule requests, per model: negative is what the reservation held for nothing.",
			Buckets: []float64{-10, -1, -0.1, -0.01, -0.001, -0.0001, 0, 0.0001, 0.001, 0.01, 0.1, 1},
		}, []string{"model"}),
		models: map[string]bool{},
		series: map[[2]string]spendSeries{},
	}
	for _, c := range []prometheus.Collector{m.spend, m.excess} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeSpend records a request's usd charges: each usd rule's in
// ratelimit_proxy_spend_usd_total, and settled minus reserved once for the
// request. spent < 0: each reservation stands as its charge.
func (p *Proxy) observeSpend(x *exchange, spent int64) {
	if x.budget.price == nil {
		return
	}
	first := true
	for i, ru := range x.rules {
		h := &x.hits[i]
		if ru.cost != costUSD || x.out[i].Ticket.IsZero() {
			continue
		}
		charge := spent
		if spent < 0 {
			charge = h.Cost
		}
		p.ruleSet.spend.observe(ru.lim.Name, x.budget.model, h.Cost, charge, first)
		first = false
	}
}

// observe records one usd charge of rule for model, and, with delta,
// settled minus reserved for the request.
func (m *spendMetrics) observe(rule, model string, reserved, settled int64, delta bool) {
	m.mu.Lock()
	s, ok := m.series[[2]string{rule, model}]
	if !ok {
		s, ok = m.resolve(rule, model)
	}
	m.mu.Unlock()
	if ok {
		s.spend.Add(float64(settled) / 1e6)
		if delta {
			s.excess.Observe(float64(settled-reserved) / 1e6)
		}
	}
}

// resolve finds the children for (rule, model), the model label made
// valid and bounded; m.mu is held.
func (m *spendMetrics) resolve(rule, model string) (spendSeries, bool) {
	label := modelLabel(model)
	if !m.models[label] {
		if len(m.models) >= maxModelLabels {
			label = "other"
		}
		m.models[label] = true
	}
	c, err1 := m.spend.GetMetricWithLabelValues(rule, label)
	o, err2 := m.excess.GetMetricWithLabelValues(label)
	if err1 != nil || err2 != nil {
		return spendSeries{}, false
	}
	s := spendSeries{spend: c, excess: o}
	if len(m.series) < 4*maxModelLabels*maxModelLabels {
		m.series[[2]string{rule, model}] = s // keyed by the raw model: bounded above
	}
	return s, true
}
