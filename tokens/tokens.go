// Package tokens estimates the input tokens of chat/LLM API requests: every
// text the model will read, counted with the tiktoken encoding of the
// request's model, plus each format's published overhead. Counting stops
// as soon as a cap is passed, so its cost is bounded by the cap, not by the
// input. It knows nothing of HTTP.
//
// It also reads the body fields that rate-limit rules key on (Fields: a
// JSON member by dotted path, the text of an XML element by local name, a
// form field), in the first pass Estimate makes over a body to find its
// model, or alone with ReadFields. They are read as the count reads the
// body: JSON member names after unescaping and with Unicode simple
// folding, a member the proxy decides on (the model, a key's member)
// repeated in any spelling refused, so that no copy the upstream might
// read instead goes unseen. Every reader stays within the body it is
// given, in time linear in its size.
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
	other         otherProvider
}

// New returns a Tokenizer. Nothing is loaded until the first count; call
// Preload to pay the loading (~0.1 s per encoding) at start instead.
func New() *Tokenizer {
	cl := newEncoding(CL100KBase)
	return &Tokenizer{o200k: newEncoding(O200KBase), cl100k: cl, other: otherProvider{cl}}
}

// Preload loads both encodings now.
func (t *Tokenizer) Preload() error {
	return errors.Join(t.o200k.load(), t.cl100k.load())
}

// Heuristic names the estimate used for models of other providers, whose
// tokenizers are not public: cl100k_base's count, never below the seed's
// ⌈characters ÷ 3.5⌉ (SPEC §4.4). Neither alone is safe: the heuristic
// prices 6,900 emoji at ~1,970 tokens where a byte-level BPE spends
// 13,000 or more, and a BPE prices long runs of repeated letters at far
// fewer tokens than a model of another family may.
const Heuristic = "max(cl100k_base,chars/3.5)"

// counter counts one text value with early stop (see Encoding.Count).
type counter interface {
	countBytes(text []byte, limit int) int
	Name() string
}

// The encodings of OpenAI's model families (SPEC §4.4). A model of any
// other name — another provider's (claude, llama, mistral, gemini, …,
// under whatever naming a gateway gives it: "us.anthropic.claude-…",
// "codellama:13b"), a deployment name, or none — is counted as another
// provider's: cl100k_base, never below ⌈characters ÷ 3.5⌉; a body that
// names no model, with cl100k_base. An allow-list
// of OpenAI's names, not a list of everyone else's, so that an unfamiliar
// name can only cost more.
var (
	o200kPrefixes = []string{"gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss", "gpt-realtime", "gpt-audio", "gpt-image",
		"chatgpt-4o", "o1", "o3", "o4", "codex-", "computer-use", "ft:gpt-4o", "ft:gpt-4.1", "ft:o"}
	cl100kPrefixes = []string{"gpt-4", "gpt-3.5", "gpt-35", "text-embedding-", "ft:gpt-4", "ft:gpt-3.5", "davinci", "babbage"}
)

// EncodingName returns what a model's text is counted with: o200k_base,
// cl100k_base or Heuristic.
func (t *Tokenizer) EncodingName(model string) string { return t.counterFor(model).Name() }

func (t *Tokenizer) counterFor(model string) counter {
	m := strings.ToLower(strings.TrimSpace(model))
	if m == "" {
		return t.cl100k // no model named (the seed's /api/chat): SPEC §4.4's "cl100k_base otherwise"
	}
	if i := strings.LastIndexByte(m, '/'); i >= 0 { // "openai/gpt-4o", "anthropic/claude-3"
		if !strings.HasPrefix(m, "openai/") && !strings.HasPrefix(m, "azure/") {
			return t.other
		}
		m = m[i+1:]
	}
	for _, p := range o200kPrefixes { // before cl100k's "gpt-4"
		if strings.HasPrefix(m, p) {
			return t.o200k
		}
	}
	for _, p := range cl100kPrefixes {
		if strings.HasPrefix(m, p) {
			return t.cl100k
		}
	}
	return t.other
}

// Count counts text as model's tokenizer would, stopping past limit
// (negative: no limit).
func (t *Tokenizer) Count(model, text string, limit int) (int, error) {
	c := t.counterFor(model)
	if err := load(c); err != nil {
		return 0, err
	}
	return c.countBytes(bytesOf(text), limit), nil
}

// bytesOf views s as bytes without copying; the bytes are only read.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// load loads the encoding a counter uses.
func load(c counter) error {
	switch c := c.(type) {
	case *Encoding:
		return c.load()
	case otherProvider:
		return c.cl100k.load()
	}
	return nil
}

// otherProvider counts for models of other providers (see Heuristic).
type otherProvider struct{ cl100k *Encoding }

func (otherProvider) Name() string { return Heuristic }

func (o otherProvider) countBytes(text []byte, limit int) int {
	h := (utf8.RuneCount(text)*2 + 6) / 7 // ⌈characters ÷ 3.5⌉
	if limit >= 0 && h > limit {
		return h
	}
	return max(h, o.cl100k.countBytes(text, limit))
}

// CountText counts text as Count does, without a limit and without copying
// it; an encoding that cannot load counts by the characters rule.
func (t *Tokenizer) CountText(model string, text []byte) int {
	c := t.counterFor(model)
	if err := load(c); err != nil {
		return t.other.countBytes(text, -1)
	}
	return c.countBytes(text, -1)
}
