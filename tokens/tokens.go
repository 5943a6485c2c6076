// Package tokens estimates the input tokens of chat/LLM API requests: every
// text the model will read, counted with the tiktoken encoding of the
// request's model, plus each format's published overhead. Counting stops
// as soon as a cap is passed, so its cost is bounded by the cap, not by the
// input. It knows nothing of HTTP.
package tokens

import (
	"errors"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Tokenizer holds the encodings, each loaded once on first use. It is safe
// for concurrent use; make one per process.
type Tokenizer struct {
	o200k, cl100k *Encoding
}

// New returns a Tokenizer. Nothing is loaded until the first count; call
// Preload to pay the loading (~0.1 s per encoding) at start instead.
func New() *Tokenizer {
	return &Tokenizer{o200k: newEncoding(O200KBase), cl100k: newEncoding(CL100KBase)}
}

// Preload loads both encodings now.
func (t *Tokenizer) Preload() error {
	return errors.Join(t.o200k.load(), t.cl100k.load())
}

// Heuristic names the estimate used for models of other providers.
const Heuristic = "chars/3.5"

// counter counts one text value with early stop (see Encoding.Count).
type counter interface {
	countBytes(text []byte, limit int) int
	Name() string
}

// cl100kPrefixes are the model families on cl100k_base; every other
// OpenAI model, and any unknown model, is counted with o200k_base.
var cl100kPrefixes = []string{"gpt-4-", "gpt-3.5", "gpt-35", "text-embedding-", "ft:gpt-4-", "ft:gpt-3.5"}

// otherProviders are model prefixes of non-OpenAI families, whose
// tokenizers are not public: they get the character heuristic.
var otherProviders = []string{"claude", "anthropic", "llama", "meta-llama", "mistral", "mixtral", "codestral", "gemini", "gemma",
	"qwen", "deepseek", "command", "phi-", "yi-", "grok", "nova", "titan", "jamba"}

// EncodingName returns what a model's text is counted with: o200k_base,
// cl100k_base or the heuristic.
func (t *Tokenizer) EncodingName(model string) string { return t.counterFor(model).Name() }

func (t *Tokenizer) counterFor(model string) counter {
	m := strings.ToLower(strings.TrimSpace(model))
	if i := strings.LastIndexByte(m, '/'); i >= 0 { // "openai/gpt-4o", "anthropic/claude-3"
		if strings.HasPrefix(m, "anthropic/") {
			return heuristic{}
		}
		m = m[i+1:]
	}
	if m == "gpt-4" || m == "gpt-3.5-turbo" {
		return t.cl100k
	}
	for _, p := range cl100kPrefixes {
		if strings.HasPrefix(m, p) {
			return t.cl100k
		}
	}
	for _, p := range otherProviders {
		if strings.HasPrefix(m, p) {
			return heuristic{}
		}
	}
	return t.o200k
}

// Count counts text as model's tokenizer would, stopping past limit
// (negative: no limit).
func (t *Tokenizer) Count(model, text string, limit int) (int, error) {
	c := t.counterFor(model)
	if e, ok := c.(*Encoding); ok {
		if err := e.load(); err != nil {
			return 0, err
		}
	}
	return c.countBytes(bytesOf(text), limit), nil
}

// bytesOf views s as bytes without copying; the bytes are only read.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// heuristic estimates tokens of models whose tokenizer is not public:
// 3.5 characters per token (Anthropic's published rule of thumb for
// English, and the seed's estimate), except that ideographs, kana and
// hangul count a token each, since every BPE vocabulary spends at least
// that on them.
type heuristic struct{}

func (heuristic) Name() string { return Heuristic }

func (heuristic) countBytes(text []byte, limit int) int {
	var chars, wide int
	for len(text) > 0 {
		r, size := utf8.DecodeRune(text)
		text = text[size:]
		if isWide(r) {
			wide++
		} else {
			chars++
		}
		if limit >= 0 && wide+chars*2/7 > limit {
			break
		}
	}
	return wide + (chars*2+6)/7 // ceil(chars/3.5)
}

func isWide(r rune) bool {
	return r >= 0x1100 && (r <= 0x11FF || // hangul jamo
		r >= 0x2E80 && r <= 0x9FFF || // CJK radicals … unified ideographs, kana
		r >= 0xAC00 && r <= 0xD7AF || // hangul syllables
		r >= 0xF900 && r <= 0xFAFF || // CJK compatibility ideographs
		r >= 0x20000 && r <= 0x3FFFF) // CJK extensions
}
