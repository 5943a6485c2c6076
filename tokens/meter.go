package tokens

import "errors"

// errStop unwinds a count once the running total has passed the limit.
var errStop = errors.New("token limit passed")

// meter keeps the running total of one request and stops it past limit.
// Text values arrive in pieces; each value is counted as a whole (a token
// never spans two values), in chunks cut where the count stays exact.
type meter struct {
	c       counter
	limit   int // negative: none
	total   int
	pending []byte
	batch   int // members of a top-level array of requests
	buf     []byte
	work    *work // the request's costing budget
}

// scratch is a read buffer the meter's readers share: a body of many small
// parts must not cost an allocation a part.
func (m *meter) scratch() []byte {
	if m.buf == nil {
		m.buf = make([]byte, 8192)
	}
	return m.buf
}

func (m *meter) over() bool { return m.limit >= 0 && m.total > m.limit }

// add counts n tokens of overhead.
func (m *meter) add(n int) error {
	m.total += n
	if m.over() {
		return errStop
	}
	return nil
}

func (m *meter) budget() int {
	if m.limit < 0 {
		return -1
	}
	return max(m.limit-m.total, 0)
}

// text takes the next piece of the current value. Whole chunks are
// counted as soon as they are there, straight from p when nothing is
// pending, so a large piece costs no copy and stops at the cap.
func (m *meter) text(p []byte) error {
	src := p
	if len(m.pending) > 0 {
		m.pending = append(m.pending, p...)
		src = m.pending
	}
	off := 0
	for len(src)-off >= 2*chunkBytes {
		cut := safeCut(src[off:], chunkBytes)
		m.total += m.c.countBytes(src[off:off+cut], m.budget())
		off += cut
		if m.over() {
			m.pending = m.pending[:0]
			return errStop
		}
	}
	m.pending = append(m.pending[:0], src[off:]...)
	return nil
}

// endText counts the rest of the current value.
func (m *meter) endText() error {
	if len(m.pending) > 0 {
		m.total += m.c.countBytes(m.pending, m.budget())
		m.pending = m.pending[:0]
	}
	if m.over() {
		return errStop
	}
	return nil
}

// higher adds the higher of two readings of the same bytes, each counted
// on a meter of its own within what m has left.
func (m *meter) higher(a, b func(*meter) error) error {
	most := 0
	for _, read := range []func(*meter) error{a, b} {
		sub := &meter{c: m.c, limit: m.budget(), work: m.work, buf: m.buf}
		if err := read(sub); err != nil && !errors.Is(err, errStop) {
			return err
		}
		most = max(most, sub.total)
	}
	return m.add(most)
}

// value counts a whole text value.
func (m *meter) value(s string) error { return m.valueBytes(bytesOf(s)) }

func (m *meter) valueBytes(b []byte) error {
	if err := m.text(b); err != nil {
		return err
	}
	return m.endText()
}

// stream returns a sink for jsonReader.str that counts the string read.
func (m *meter) stream() func([]byte) error { return m.text }
