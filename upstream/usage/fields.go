package usage

import (
	"math"
	"strconv"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

// Which members of a usage object were present.
const (
	hasPrompt = 1 << iota
	hasCompletion
	hasInput
	hasOutput
	hasCacheRead
	hasCacheWrite
	hasCached
	hasReasoning
	hasPromptEval
	hasEval
	hasInputDetails
)

// maxCount caps every reported figure (2^53 tokens): sums of a few of them
// never overflow, and no real response comes near.
const maxCount = 1 << 53

// fields are the members of a usage object, in any provider's spelling.
type fields struct {
	set        uint16
	prompt     int64 // prompt_tokens
	completion int64 // completion_tokens
	input      int64 // input_tokens
	output     int64 // output_tokens
	cacheRead  int64 // cache_read_input_tokens
	cacheWrite int64 // cache_creation_input_tokens
	cached     int64 // {prompt,input}_tokens_details.cached_tokens
	reasoning  int64 // {completion,output}_tokens_details.reasoning_tokens
	promptEval int64 // Ollama prompt_eval_count
	eval       int64 // Ollama eval_count
}

// parseFields reads the usage object v. Members it does not know, and
// values that are not numbers, are ignored.
func parseFields(v []byte) fields {
	var f fields
	f.read(v, false)
	return f
}

// read adds the members of the object v to f; top reads the top level of a
// whole document, where only Ollama's counts are taken.
func (f *fields) read(v []byte, top bool) {
	o := jsonscan.OpenObject(v, 0)
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		val := v[m.VS:m.VE]
		if top {
			switch string(m.Key) {
			case "prompt_eval_count":
				f.num(val, hasPromptEval, &f.promptEval)
			case "eval_count":
				f.num(val, hasEval, &f.eval)
			}
			continue
		}
		switch string(m.Key) {
		case "prompt_tokens":
			f.num(val, hasPrompt, &f.prompt)
		case "completion_tokens":
			f.num(val, hasCompletion, &f.completion)
		case "input_tokens":
			f.num(val, hasInput, &f.input)
		case "output_tokens":
			f.num(val, hasOutput, &f.output)
		case "cache_read_input_tokens":
			f.num(val, hasCacheRead, &f.cacheRead)
		case "cache_creation_input_tokens":
			f.num(val, hasCacheWrite, &f.cacheWrite)
		case "prompt_tokens_details", "input_tokens_details":
			if string(m.Key) == "input_tokens_details" && len(val) > 0 && val[0] == '{' {
				f.set |= hasInputDetails
			}
			f.num(jsonscan.Lookup(val, "cached_tokens"), hasCached, &f.cached)
		case "completion_tokens_details", "output_tokens_details":
			f.num(jsonscan.Lookup(val, "reasoning_tokens"), hasReasoning, &f.reasoning)
		}
	}
}

// num stores the number v in *dst and marks bit when v is a number.
func (f *fields) num(v []byte, bit uint16, dst *int64) {
	if n, ok := parseCount(v); ok {
		*dst = n
		f.set |= bit
	}
}

// parseCount reads a JSON number as a count: negative is 0, a fraction is
// cut, huge is maxCount. Anything else is not a count.
func parseCount(v []byte) (int64, bool) {
	i, neg := 0, false
	if len(v) > 0 && v[0] == '-' {
		i, neg = 1, true
	}
	start := i
	var n int64
	for ; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		if n < maxCount {
			n = n*10 + int64(v[i]-'0')
		}
	}
	if i == start {
		return 0, false
	}
	if i < len(v) { // a fraction or an exponent
		x, err := strconv.ParseFloat(string(v), 64)
		if err != nil && !math.IsInf(x, 0) {
			return 0, false
		}
		switch {
		case x >= maxCount:
			n = maxCount
		case x > 0:
			n = int64(x)
		default:
			n = 0
		}
	}
	if neg {
		return 0, true
	}
	return min(n, maxCount), true
}

// normalize turns the fields into a Usage for the API and says whether
// they make a complete report: OpenAI's shape needs prompt_tokens, the
// input/output shape (Responses, Anthropic) needs both, Ollama's needs
// eval_count. input_tokens includes cached tokens in Responses and excludes
// them in Anthropic; Generic tells the two apart by Anthropic's cache
// members.
func (f fields) normalize(api API) (Usage, bool) {
	var u Usage
	switch {
	case f.set&(hasPrompt|hasCompletion) != 0:
		u = Usage{Input: f.prompt, CachedInput: f.cached, Output: f.completion, Reasoning: f.reasoning}
		return u, f.set&hasPrompt != 0
	case f.set&(hasInput|hasOutput|hasCacheRead|hasCacheWrite) != 0:
		anthropic := api == Anthropic ||
			api == Generic && f.set&(hasCacheRead|hasCacheWrite) != 0 && f.set&hasInputDetails == 0
		if anthropic {
			u = Usage{
				Input:       f.input + f.cacheRead + f.cacheWrite,
				CachedInput: f.cacheRead,
				CacheWrite:  f.cacheWrite,
			}
		} else {
			u = Usage{Input: f.input, CachedInput: f.cached}
		}
		u.Output, u.Reasoning = f.output, f.reasoning
		return u, f.set&hasInput != 0 && f.set&hasOutput != 0
	case f.set&(hasPromptEval|hasEval) != 0:
		return Usage{Input: f.promptEval, Output: f.eval}, f.set&hasEval != 0
	}
	return u, false
}

// overlay returns f with every member that g has replaced by g's.
func (f fields) overlay(g fields) fields {
	set := func(bit uint16, dst *int64, v int64) {
		if g.set&bit != 0 {
			*dst = v
			f.set |= bit
		}
	}
	set(hasPrompt, &f.prompt, g.prompt)
	set(hasCompletion, &f.completion, g.completion)
	set(hasInput, &f.input, g.input)
	set(hasOutput, &f.output, g.output)
	set(hasCacheRead, &f.cacheRead, g.cacheRead)
	set(hasCacheWrite, &f.cacheWrite, g.cacheWrite)
	set(hasCached, &f.cached, g.cached)
	set(hasReasoning, &f.reasoning, g.reasoning)
	set(hasPromptEval, &f.promptEval, g.promptEval)
	set(hasEval, &f.eval, g.eval)
	f.set |= g.set & hasInputDetails
	return f
}
