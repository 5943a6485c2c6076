package usage

import "io"

// maxPrefix bounds the held event copied to the front of the client's
// buffer before a read, so that the event, once the read completes it,
// lies whole in the buffer and everything is released in place. A longer
// held event (rare: OpenAI's chunks are a few hundred bytes) goes through
// r.out instead; the bound keeps the copy per read small.
const maxPrefix = 8 << 10

// readStrip reads while stripping: events are released when they end,
// edited or dropped as Options.Strip says, compacted in place in p.
func (r *reader) readStrip(p []byte) (int, error) {
	for empty := 0; ; {
		if r.outPos < len(r.out) {
			n := copy(p, r.out[r.outPos:])
			r.outPos += n
			if r.outPos == len(r.out) {
				r.out, r.outPos = r.out[:0], 0
			}
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		if !r.strip {
			return r.readPass(p)
		}
		held := 0
		if h := len(r.hold); h > 0 && h <= maxPrefix && h <= len(p)/2 {
			held = copy(p, r.hold)
			r.hold = r.hold[:0]
		}
		n, err := r.body.Read(p[held:])
		w := 0
		if n > 0 {
			w = r.consume(p[:held+n], held)
		} else if held > 0 {
			r.hold = append(r.hold, p[:held]...)
		}
		if err != nil {
			r.fail(err)
		}
		if w > 0 {
			return w, nil
		}
		if n == 0 && err == nil {
			if empty++; empty >= maxEmptyReads {
				return 0, io.ErrNoProgress
			}
		}
	}
}

// emitter writes released bytes: in place at the front of the read buffer
// while every byte comes from it in order, else to r.out.
type emitter struct {
	r     *reader
	p     []byte
	w     int
	toOut bool
}

// put releases b; held says b is not a piece of p (it comes from r.hold).
func (e *emitter) put(b []byte, held bool) {
	if len(b) == 0 {
		return
	}
	if held || e.toOut {
		e.toOut = true
		e.r.out = append(e.r.out, b...)
		return
	}
	if cap(e.p)-cap(b) == e.w { // b is already in place: nothing was removed before it
		e.w += len(b)
		return
	}
	e.w += copy(e.p[e.w:], b)
}

// consume parses p, whose first from bytes are the start of the current
// event, already scanned (see readStrip). It returns how many bytes at
// the front of p are for the client; more may be left in r.out, and an
// unfinished event in r.hold.
func (r *reader) consume(p []byte, from int) int {
	e := emitter{r: r, p: p}
	start := 0 // where the current event began in p
	for off := from; off < len(p); {
		if !r.strip { // an event passed MaxEvent: the rest passes
			r.scan(p[off:])
			e.put(p[start:], false)
			break
		}
		k, kind := r.ps.scan(p[off:])
		off += k
		dropLF := r.dropLF
		r.dropLF = false
		switch kind {
		case kindLF:
			if !dropLF {
				e.put(p[off-1:off], false)
			}
			start = off
		case kindPartial:
			if len(r.hold)+off-start <= r.o.MaxEvent {
				r.hold = append(r.hold, p[start:]...)
				break
			}
			r.strip = false
			e.put(r.hold, true)
			r.hold = r.hold[:0]
			e.put(p[start:], false)
		case kindEvent:
			act := r.dispatch()
			raw, held := p[start:off], len(r.hold) > 0
			if held {
				r.hold = append(r.hold, raw...)
				raw = r.hold
			}
			start = off
			if len(raw) > r.o.MaxEvent {
				act = actKeep
				r.strip = false
			}
			if act == actRemove && !r.rawSpans() {
				act = actKeep
			}
			switch act {
			case actKeep:
				e.put(raw, held)
			case actDrop:
				r.dropLF = r.ps.crEnded
			case actRemove:
				at := 0
				for _, s := range r.spans {
					e.put(raw[at:s.a], held)
					at = s.b
				}
				e.put(raw[at:], held)
			}
			r.hold = r.hold[:0]
		}
	}
	return e.w
}

// rawSpans turns r.spans from payload offsets into offsets in the event's
// bytes, through the data lines' positions. It fails (the event is then
// passed as it is) when a span does not lie within one data line.
func (r *reader) rawSpans() bool {
	ps := &r.ps
	if ps.segOver || ps.over {
		return false
	}
	for i, s := range r.spans {
		found := false
		for _, g := range ps.segs {
			if g.pay <= s.a && s.b <= g.pay+g.n {
				r.spans[i] = span{g.raw + s.a - g.pay, g.raw + s.b - g.pay}
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
