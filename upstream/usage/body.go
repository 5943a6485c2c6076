package usage

import "github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"

// The modes of a non-stream body, decided by its first non-space byte.
const (
	bodyUndecided = iota
	bodyJSON      // '{' or '[': kept (bounded) and parsed at Close
	bodyText      // anything else: all output text, counted as it passes
)

// docScan keeps a non-stream body on the side: its head up to MaxBody,
// and past that its last tailWindow bytes.
type docScan struct {
	mode uint8
	head []byte
	over bool
	tail tailBuf
}

// feedBody takes bytes of a non-stream body that pass to the client.
func (r *reader) feedBody(b []byte) {
	d := &r.doc
	if d.mode == bodyUndecided {
		i := jsonscan.SkipSpace(b, 0)
		if i == len(b) {
			return
		}
		b = b[i:]
		d.mode = bodyText
		if b[0] == '{' || b[0] == '[' {
			d.mode = bodyJSON
		}
	}
	if d.mode == bodyText {
		if r.o.API != OpenAIEmbeddings {
			r.cnt.write(b)
		}
		return
	}
	if !d.over {
		room := r.o.MaxBody - len(d.head)
		if len(b) <= room {
			d.head = append(d.head, b...)
			return
		}
		d.head = append(d.head, b[:room]...)
		d.over = true
		d.tail.write(d.head)
		b = b[room:]
	}
	d.tail.write(b)
}

// docs calls fn for each top-level value in b (one JSON document, or
// several as NDJSON), the last possibly cut short.
func docs(b []byte, fn func(doc []byte)) {
	for i := jsonscan.SkipSpace(b, 0); i < len(b); i = jsonscan.SkipSpace(b, i) {
		e, ok := jsonscan.SkipValue(b, i)
		if e == i {
			return
		}
		fn(b[i:e])
		if !ok {
			return
		}
		i = e
	}
}

// finishBody finds the usage of a JSON body: in every document kept
// (the last complete one wins), or in the tail of a body too long to keep.
func (r *reader) finishBody() {
	d := &r.doc
	if d.mode != bodyJSON {
		return
	}
	if !d.over {
		docs(d.head, r.docUsage)
		return
	}
	t := d.tail.bytes()
	if v := jsonscan.LastObject(t, `"usage"`); v != nil {
		r.record(parseFields(v).normalize(r.o.API))
	}
	if r.o.API == Generic && !r.reported {
		var f fields
		f.num(jsonscan.LastNumber(t, `"prompt_eval_count"`), hasPromptEval, &f.promptEval)
		f.num(jsonscan.LastNumber(t, `"eval_count"`), hasEval, &f.eval)
		if f.set != 0 {
			r.record(f.normalize(Generic))
		}
	}
}

// docUsage records the usage of one JSON document: its top-level "usage",
// and for Generic also Ollama's top-level counts.
func (r *reader) docUsage(doc []byte) {
	if u := jsonscan.Lookup(doc, "usage"); jsonscan.Whole(u) {
		r.record(parseFields(u).normalize(r.o.API))
		return
	}
	if r.o.API == Generic {
		var f fields
		f.read(doc, true)
		if f.set != 0 {
			r.record(f.normalize(Generic))
		}
	}
}

// bodyText reads the output text of a JSON body kept (its head only, when
// it was too long); a text body was counted as it passed.
func (r *reader) bodyText() {
	if r.doc.mode != bodyJSON || r.o.API == OpenAIEmbeddings {
		return
	}
	docs(r.doc.head, func(doc []byte) { docText(&r.cnt, doc) })
}
