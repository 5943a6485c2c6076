package proxy

import (
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// output = "clamp" (budgets that are never overshot): which bodies can
// carry a cap, the hit the store may lower, and the cap written.

// clampable reports whether the request's body can have its output cap
// written (SPEC §8.2): one JSON object, of an API that produces output
// (an embedding has none to cap). A body that cannot is reserved for as
// output = "reserve" does.
func (x *exchange) clampable() bool {
	b := &x.budget
	if b.clampable == 0 {
		b.clampable = -1
		if x.body != nil && x.format != tokens.FormatEmbeddings && tokens.Editable(x.body.bytes()) {
			b.clampable = 1
		}
	}
	return b.clampable > 0
}

// outputAsked is the output cap a request names (the largest of its cap
// members, when one is a positive number), else reserve; and the choices
// each produce it (n, times a batch's members).
func outputAsked(in *keyInput, reserve, batch int64) (out, choices int64) {
	for _, name := range outputJSON[:3] {
		if n, ok := tokenNumber(in.bodyField(name)); ok {
			out = max(out, n)
		}
	}
	if out <= 0 {
		out = reserve
	}
	choices = 1
	if n, ok := tokenNumber(in.bodyField("n")); ok && n > 1 {
		choices = min(n, 1<<10)
	}
	if batch > 1 {
		choices *= min(batch, 1<<10)
	}
	return out, choices
}

// clampTokens makes a clamping total_tokens hit: the input estimate plus
// an output the store may lower to what remains (SPEC §8.2), each token of
// output once per choice.
func (x *exchange) clampTokens(ru *rule, h *limits.Hit) {
	base := int64(x.est.Tokens)
	out, choices := outputAsked(&x.keys, x.outputReserve(), int64(x.est.Batch))
	out = max(min(out, (maxReserve-base)/choices), 0)
	h.Clamp = limits.Clamp{Base: base, Per: float64(choices), Max: out, Min: ru.minOutput}
	h.Cost = base + out*choices
}

// capMember is the output cap member a request that names none gets: the
// one its API reads (SPEC §8.2).
func capMember(f tokens.Format, model string) string {
	switch f {
	case tokens.FormatResponses:
		return "max_output_tokens"
	case tokens.FormatChat:
		if reasoningModel(model) {
			return "max_completion_tokens" // OpenAI's reasoning models refuse max_tokens
		}
	}
	return "max_tokens"
}

// reasoningModel reports whether model is one of OpenAI's reasoning
// models (o1, o3, o4-mini, gpt-5 and their dated variants).
func reasoningModel(model string) bool {
	m := strings.ToLower(model)
	for _, p := range [...]string{"o1", "o3", "o4", "gpt-5"} {
		if m == p || strings.HasPrefix(m, p+"-") || strings.HasPrefix(m, p+".") {
			return true
		}
	}
	return false
}

// capOutput writes the output cap the clamping rules decided into the
// body that leaves for the upstream, when it lowers or adds one: its
// bytes, for the include_usage edit after it, and the cap written (0 when
// the body is unchanged).
func (x *exchange) capOutput(sent []byte) ([]byte, int64, error) {
	o, by := int64(-1), -1
	for i, ru := range x.rules {
		if ru.clamp && x.hits[i].Clamp.Per > 0 && x.out[i].Allowed && !x.out[i].Ticket.IsZero() {
			fit := x.out[i].Output
			if ru.cost == costUSD {
				fit = x.usdFits(i, fit)
			}
			if o < 0 || fit < o {
				o, by = fit, i
			}
		}
	}
	if o < 0 {
		return sent, 0, nil
	}
	capped, changed, err := tokens.CapOutput(sent, capMember(x.format, x.keys.model), max(o, 1))
	if err != nil || !changed {
		return sent, 0, err
	}
	x.rules[by].metrics.tokens.clamped.Inc()
	return capped, o, nil
}
