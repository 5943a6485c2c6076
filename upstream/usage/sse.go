package usage

import "bytes"

// What parser.scan stopped at.
const (
	kindPartial = iota // all of its input was consumed and the event goes on
	kindEvent          // an event ended, its blank line included
	kindLF             // the '\n' of a "\r\n" whose '\r' ended the last event
)

// Where the parser is in a line.
const (
	stLine  = iota // at the start of a line
	stName         // in the field name
	stSpace        // just after the colon (one space may follow)
	stValue        // in the value
)

// The fields the parser keeps; the others (id, retry, comments, unknown)
// pass without a trace.
const (
	fOther = iota
	fData
	fEvent
)

// maxSegs bounds the data lines whose positions are tracked for editing an
// event; one with more is only ever dropped whole or passed as it is.
const maxSegs = 32

var (
	newline     = []byte{'\n'}
	unknownName = []byte("?")
)

// seg places one data line's value: raw is its offset in the event's bytes,
// pay its offset in the data payload, n its length.
type seg struct{ raw, pay, n int }

// parser reads text/event-stream bytes in pieces, as the WHATWG rules do:
// lines end in "\n", "\r\n" or "\r"; an empty line ends an event; "data:"
// lines (one space after the colon dropped) join with "\n" into the
// payload; "event:" names the event. It keeps one event's payload, up to
// maxData bytes, then the last tailWindow bytes, and its name; scan reports
// where events end so the caller can act on them.
type parser struct {
	maxData int
	track   bool // record data line positions (segs) for editing

	st      uint8
	field   uint8
	cr      bool // the last line ended in '\r': a '\n' next belongs to it
	crEnded bool // the event just returned ended in '\r'
	fresh   bool // an event was returned: reset before reading on

	name    [8]byte // the field name being read
	nameLen int     // may pass len(name): then the name is none we keep

	ev     [64]byte // the event name
	evLen  int
	evOver bool

	dataLines int
	raw       int // bytes of the current event before the current scan

	data []byte  // the payload, up to maxData bytes
	over bool    // the payload passed maxData: tail holds its end
	tail tailBuf // with over, the payload's last tailWindow bytes

	// ref is the payload read in place, not copied into data, when it is
	// one data line whole in one scan's input (the common case); valid
	// until the scan returns, copied into data if the event goes on.
	ref     []byte
	hasRef  bool
	valHere bool // the current value began in this scan's input

	segs    []seg
	segOver bool
}

// eventName returns the current event's name ("" when none was given); a
// name too long to keep is returned as "?", which no rule matches.
func (ps *parser) eventName() []byte {
	if ps.evOver {
		return unknownName
	}
	return ps.ev[:ps.evLen]
}

// payload returns the current event's data payload (its head, with over).
func (ps *parser) payload() []byte {
	if ps.hasRef {
		return ps.ref
	}
	return ps.data
}

// unref copies a payload read in place into data.
func (ps *parser) unref() {
	if ps.hasRef {
		ps.data = append(ps.data[:0], ps.ref...)
		ps.ref, ps.hasRef = nil, false
	}
}

// reset starts a new event.
func (ps *parser) reset() {
	ps.fresh = false
	ps.dataLines, ps.raw = 0, 0
	ps.ref, ps.hasRef = nil, false
	if cap(ps.data) > 256<<10 {
		ps.data = nil // a big event passed: do not keep its buffer for the rest of the stream
	}
	ps.data = ps.data[:0]
	ps.over = false
	ps.tail.reset()
	ps.evLen, ps.evOver = 0, false
	ps.segs, ps.segOver = ps.segs[:0], false
}

// scan reads b (not empty) up to the end of the current event, returning
// how many bytes it took and what it stopped at. After kindEvent the
// event's payload, name and segs stay readable until the next scan.
func (ps *parser) scan(b []byte) (int, int) {
	if ps.fresh {
		ps.reset()
	}
	if ps.crEnded {
		ps.crEnded = false
		if b[0] == '\n' {
			return 1, kindLF
		}
	}
	i := 0
	for i < len(b) {
		if ps.cr {
			ps.cr = false
			if b[i] == '\n' {
				i++
				continue
			}
		}
		switch ps.st {
		case stLine:
			var ended bool
			if i, ended = ps.lineStart(b, i); ended {
				return i, kindEvent
			}
		case stName:
			i = ps.readName(b, i)
		case stSpace:
			if b[i] == ' ' {
				i++
			}
			ps.startValue(i)
			ps.st = stValue
		case stValue:
			i = ps.readValue(b, i)
		}
	}
	ps.raw += len(b)
	ps.valHere = false
	ps.unref() // b is the caller's until the next scan
	return len(b), kindPartial
}

// lineStart reads the start of a line at b[i]: an empty line ends the
// event (true); "data:" starts a data field; anything else a field name.
func (ps *parser) lineStart(b []byte, i int) (int, bool) {
	c := b[i]
	if c == '\n' || c == '\r' {
		ps.fresh, ps.crEnded = true, c == '\r'
		return i + 1, true
	}
	if len(b)-i >= 5 && string(b[i:i+5]) == "data:" {
		ps.field, ps.st = fData, stSpace
		return i + 5, false
	}
	ps.st, ps.nameLen = stName, 0
	return i, false
}

// readName reads a field name from b[i] up to its colon or the end of the
// line, and returns where it stopped.
func (ps *parser) readName(b []byte, i int) int {
	for i < len(b) {
		c := b[i]
		if c == ':' || c == '\n' || c == '\r' {
			break
		}
		if ps.nameLen < len(ps.name) {
			ps.name[ps.nameLen] = c
		}
		ps.nameLen++
		i++
	}
	if i == len(b) {
		return i
	}
	ps.field = fOther
	if ps.nameLen <= len(ps.name) {
		switch string(ps.name[:ps.nameLen]) {
		case "data":
			ps.field = fData
		case "event":
			ps.field = fEvent
		}
	}
	if b[i] == ':' {
		ps.st = stSpace
		return i + 1
	}
	// A line without a colon is a field with an empty value.
	ps.startValue(i)
	ps.cr = b[i] == '\r'
	ps.st = stLine
	return i + 1
}

// readValue takes a field's value from b[i] to the end of its line (or of
// b), and returns where it stopped.
func (ps *parser) readValue(b []byte, i int) int {
	rest := b[i:]
	end := bytes.IndexByte(rest, '\n')
	stop := end
	if stop < 0 {
		stop = len(rest)
	}
	if c := bytes.IndexByte(rest[:stop], '\r'); c >= 0 {
		end, stop = c, c
	}
	if end >= 0 && ps.valHere && ps.field == fData && ps.dataLines == 1 && stop <= ps.maxData {
		// The whole payload is here: read it in place.
		ps.ref, ps.hasRef = rest[:stop], true
		if ps.track && len(ps.segs) > 0 {
			ps.segs[len(ps.segs)-1].n = stop
		}
	} else {
		ps.value(rest[:stop])
	}
	if end < 0 {
		return len(b)
	}
	ps.cr = rest[end] == '\r'
	ps.st = stLine
	return i + end + 1
}

// startValue begins the value of the current field, at offset i of the
// scan's input.
func (ps *parser) startValue(i int) {
	ps.valHere = true
	switch ps.field {
	case fData:
		if ps.dataLines > 0 {
			ps.unref()
			ps.appendData(newline)
		}
		ps.dataLines++
		if ps.track && !ps.segOver {
			if len(ps.segs) == maxSegs {
				ps.segOver = true
			} else {
				ps.segs = append(ps.segs, seg{raw: ps.raw + i, pay: len(ps.data)})
			}
		}
	case fEvent:
		ps.evLen, ps.evOver = 0, false
	}
}

// value takes the next piece of the current field's value.
func (ps *parser) value(v []byte) {
	switch ps.field {
	case fData:
		if ps.track && !ps.segOver && len(ps.segs) > 0 {
			ps.segs[len(ps.segs)-1].n += len(v)
		}
		ps.appendData(v)
	case fEvent:
		if ps.evLen+len(v) > len(ps.ev) {
			ps.evOver = true
			return
		}
		ps.evLen += copy(ps.ev[ps.evLen:], v)
	}
}

func (ps *parser) appendData(v []byte) {
	if !ps.over {
		room := ps.maxData - len(ps.data)
		if len(v) <= room {
			ps.data = append(ps.data, v...)
			return
		}
		ps.data = append(ps.data, v[:room]...)
		ps.over = true
		ps.tail.write(ps.data)
		v = v[room:]
	}
	ps.tail.write(v)
}

// tailBuf keeps the last tailWindow bytes written to it, in amortised
// constant time per byte.
type tailBuf struct{ b []byte }

func (t *tailBuf) reset() { t.b = t.b[:0] }

func (t *tailBuf) write(p []byte) {
	if len(p) >= tailWindow {
		t.b = append(t.b[:0], p[len(p)-tailWindow:]...)
		return
	}
	if len(t.b)+len(p) > 2*tailWindow {
		keep := tailWindow - len(p)
		t.b = t.b[:copy(t.b, t.b[len(t.b)-keep:])]
	}
	t.b = append(t.b, p...)
}

// bytes returns the last tailWindow bytes written (all, when fewer).
func (t *tailBuf) bytes() []byte {
	if len(t.b) > tailWindow {
		return t.b[len(t.b)-tailWindow:]
	}
	return t.b
}
