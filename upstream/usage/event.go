package usage

import (
	"bytes"
	"encoding/binary"
	"sync"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

var (
	usageKey = []byte(`"usage"`)
	evalKey  = []byte(`"eval_count"`)
)

// hasUsage reports whether data holds the key "usage" (with its quotes).
// It is bytes.Contains made cheap for JSON, where quotes are everywhere
// and a generic search stumbles on each: it jumps from 'u' to 'u'.
func hasUsage(data []byte) bool {
	for i := 1; i < len(data); {
		j := bytes.IndexByte(data[i:], 'u')
		if j < 0 {
			return false
		}
		i += j
		if data[i-1] == '"' && len(data)-i >= 6 && string(data[i+1:i+6]) == `sage"` {
			return true
		}
		i++
	}
	return false
}

// anthropic is what an Anthropic stream reported so far.
type anthropic struct {
	start, delta fields
	sawDelta     bool
}

// dispatch acts on the event the parser just ended: records its usage,
// keeps its payload for the fallback count, and says what stripping does
// with it (r.spans holds what to remove, as payload offsets).
func (r *reader) dispatch() action {
	ps := &r.ps
	if ps.dataLines == 0 {
		return actKeep
	}
	name := ps.eventName()
	if ps.over {
		r.overEvent(name)
		return actKeep
	}
	data := ps.payload()
	if string(data) == "[DONE]" {
		return actKeep
	}
	act := actKeep
	switch r.o.API {
	case OpenAIResponses:
		r.responsesEvent(name, data)
	case Anthropic:
		r.anthropicEvent(name, data)
	case Generic:
		r.genericEvent(name, data)
	default:
		act = r.openaiEvent(data)
	}
	if act != actDrop && r.wantText(name) {
		r.retain(data)
	}
	return act
}

// record takes a usage found: a complete one replaces what was found
// before; a partial one is kept only while nothing complete was.
func (r *reader) record(u Usage, complete bool) {
	if complete {
		r.usage, r.reported = u, true
	} else if !r.reported {
		r.usage = u
	}
}

// openaiEvent handles a chat or completions chunk. OpenAI's "usage":null
// as the last member is recognised from the end of the payload, a chunk
// without "usage" by a byte search; only the others are walked.
func (r *reader) openaiEvent(data []byte) action {
	if s, ok := nullLast(data); ok {
		if !r.cut {
			return actKeep
		}
		r.spans = append(r.spans[:0], s)
		return actRemove
	}
	if !hasUsage(data) {
		return actKeep
	}
	return r.topUsage(data)
}

// nullLast recognises a JSON object whose last member is "usage": null and
// returns the span that removes it with the comma before it (or the member
// alone when it is the only one). In valid JSON a quote preceded by a comma
// or by the opening brace is never inside a string, and the last closing
// brace closes the top-level object, so the member is top-level.
func nullLast(d []byte) (span, bool) {
	start := jsonscan.SkipSpace(d, 0)
	if start >= len(d) || d[start] != '{' {
		return span{}, false
	}
	i := jsonscan.SpaceBefore(d, len(d))
	if i == 0 || d[i-1] != '}' {
		return span{}, false
	}
	i = jsonscan.SpaceBefore(d, i-1)
	if i < 4 || string(d[i-4:i]) != "null" {
		return span{}, false
	}
	ve := i
	i = jsonscan.SpaceBefore(d, i-4)
	if i < 1 || d[i-1] != ':' {
		return span{}, false
	}
	i = jsonscan.SpaceBefore(d, i-1)
	if i < len(usageKey) || string(d[i-len(usageKey):i]) != string(usageKey) {
		return span{}, false
	}
	ks := i - len(usageKey)
	i = jsonscan.SpaceBefore(d, ks)
	switch {
	case i > start+1 && d[i-1] == ',':
		return span{i - 1, ve}, true
	case i == start+1:
		return span{ks, ve}, true
	}
	return span{}, false
}

// topUsage walks the chunk's top-level members: records a non-null
// "usage", and when stripping returns the removal of every "usage" member
// (each with one adjacent comma), or the drop of a usage chunk (non-null
// usage, empty choices). Malformed JSON is passed as it is.
func (r *reader) topUsage(data []byte) action {
	o := jsonscan.OpenObject(data, 0)
	r.spans = r.spans[:0]
	var val []byte
	emptyChoices := false
	taken := -1 // a comma already removed with the member before
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		switch string(m.Key) {
		case "choices":
			emptyChoices = jsonscan.IsEmptyArray(data[m.VS:m.VE])
		case "usage":
			if v := data[m.VS:m.VE]; jsonscan.Whole(v) {
				val = v
			}
			if !r.cut {
				continue
			}
			var s span
			if m.Comma >= 0 && m.Comma != taken {
				s = span{m.Comma, m.VE}
			} else if k := jsonscan.SkipSpace(data, m.VE); k < len(data) && data[k] == ',' {
				s, taken = span{m.KS, k + 1}, k
			} else {
				s = span{m.KS, m.VE}
			}
			r.spans = append(r.spans, s)
		}
	}
	if o.Bad {
		return actKeep
	}
	if val != nil {
		r.record(parseFields(val).normalize(r.o.API))
	}
	switch {
	case !r.cut || len(r.spans) == 0:
		return actKeep
	case val != nil && emptyChoices:
		return actDrop
	}
	return actRemove
}

// eventType is the event's name, or else its payload's "type".
func eventType(name, data []byte) []byte {
	if len(name) > 0 {
		return name
	}
	return jsonscan.Unquoted(jsonscan.Lookup(data, "type"))
}

// responsesEvent takes the usage of a Responses stream's final event.
func (r *reader) responsesEvent(name, data []byte) {
	if !hasUsage(data) {
		return
	}
	switch string(eventType(name, data)) {
	case "response.completed", "response.incomplete", "response.failed":
		u := jsonscan.Lookup(jsonscan.Lookup(data, "response"), "usage")
		if jsonscan.Whole(u) {
			r.record(parseFields(u).normalize(OpenAIResponses))
		}
	}
}

// anthropicEvent takes message_start's input figures and message_delta's
// cumulative output (and the input figures it may repeat).
func (r *reader) anthropicEvent(name, data []byte) {
	if !hasUsage(data) {
		return
	}
	switch string(eventType(name, data)) {
	case "message_start":
		u := jsonscan.Lookup(jsonscan.Lookup(data, "message"), "usage")
		if !jsonscan.Whole(u) {
			return
		}
		r.anth.start = parseFields(u)
	case "message_delta":
		u := jsonscan.Lookup(data, "usage")
		if !jsonscan.Whole(u) {
			return
		}
		r.anth.delta = r.anth.delta.overlay(parseFields(u))
		r.anth.sawDelta = true
	default:
		return
	}
	u, complete := r.anth.start.overlay(r.anth.delta).normalize(Anthropic)
	r.record(u, complete && r.anth.sawDelta && r.anth.delta.set&hasOutput != 0)
}

// genericEvent reads an event of unknown shape: Anthropic's and the
// Responses API's by their types, else a top-level usage or Ollama counts.
func (r *reader) genericEvent(name, data []byte) {
	if !hasUsage(data) && !bytes.Contains(data, evalKey) {
		return
	}
	typ := eventType(name, data)
	switch {
	case bytes.HasPrefix(typ, []byte("message_")):
		r.anthropicEvent(name, data)
	case bytes.HasPrefix(typ, []byte("response.")):
		r.responsesEvent(name, data)
	default:
		r.docUsage(data)
	}
}

// overEvent handles an event whose payload passed MaxEvent: its usage is
// looked for in its last tailWindow bytes, its text read from its head.
func (r *reader) overEvent(name []byte) {
	if v := jsonscan.LastObject(r.ps.tail.bytes(), `"usage"`); v != nil {
		api := r.o.API
		if api == OpenAIResponses || api == Generic && bytes.HasPrefix(name, []byte("response.")) {
			api = OpenAIResponses
		}
		r.record(parseFields(v).normalize(api))
	}
	if r.wantText(name) {
		r.flushKeep()
		eventText(&r.cnt, r.ps.payload())
	}
}

// textTypes are the Responses events whose "delta" is output text.
var textTypes = [...]string{
	"response.output_text.delta",
	"response.refusal.delta",
	"response.function_call_arguments.delta",
	"response.reasoning_summary_text.delta",
	"response.reasoning_text.delta",
}

func isTextType(t []byte) bool {
	for _, s := range textTypes {
		if string(t) == s {
			return true
		}
	}
	return false
}

// wantText says whether an event of this name may carry output text.
func (r *reader) wantText(name []byte) bool {
	switch r.o.API {
	case OpenAIEmbeddings:
		return false
	case OpenAIResponses:
		return len(name) == 0 || isTextType(name)
	case Anthropic:
		return len(name) == 0 || string(name) == "content_block_delta"
	}
	return true
}

// keepStart is the first capacity of the payloads kept.
const keepStart = 16 << 10

// keepPool recycles the buffers of payloads kept at the default MaxText:
// every stream fills one, and a long one fills it whole.
var keepPool = sync.Pool{New: func() any { return new([defaultMaxText]byte) }}

// growKeep makes room for need more bytes in r.keep: a pooled buffer at the
// default MaxText, else in two steps rather than append's many (most
// streams are short; a long one fills MaxText).
func (r *reader) growKeep(need int) {
	if r.o.MaxText == defaultMaxText {
		if cap(r.keep) == 0 {
			r.keep = keepPool.Get().(*[defaultMaxText]byte)[:0]
		}
		return
	}
	size := r.o.MaxText
	if cap(r.keep) == 0 {
		size = min(size, max(keepStart, need))
	}
	r.keep = append(make([]byte, 0, size), r.keep...)
}

// releaseKeep gives a pooled buffer back.
func (r *reader) releaseKeep() {
	if cap(r.keep) == defaultMaxText && r.o.MaxText == defaultMaxText {
		keepPool.Put((*[defaultMaxText]byte)(r.keep[:defaultMaxText]))
	}
	r.keep = nil
}

// retain keeps a payload for the fallback count. Past MaxText, what is
// kept is read for its text and dropped; a payload longer than MaxText is
// read at once.
func (r *reader) retain(data []byte) {
	if i := jsonscan.SkipSpace(data, 0); i == len(data) || data[i] != '{' {
		return
	}
	need := binary.MaxVarintLen32 + len(data)
	if len(r.keep)+need > r.o.MaxText {
		r.flushKeep()
	}
	if need > r.o.MaxText {
		eventText(&r.cnt, data)
		return
	}
	if len(r.keep)+need > cap(r.keep) {
		r.growKeep(need)
	}
	r.keep = binary.AppendUvarint(r.keep, uint64(len(data)))
	r.keep = append(r.keep, data...)
}

// flushKeep reads the text of the payloads kept and drops them.
func (r *reader) flushKeep() {
	k := r.keep
	for len(k) > 0 {
		n, w := binary.Uvarint(k)
		if w <= 0 || n > uint64(len(k)-w) {
			break
		}
		eventText(&r.cnt, k[w:w+int(n)])
		k = k[w+int(n):]
	}
	r.keep = r.keep[:0]
}
