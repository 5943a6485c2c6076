package pdf

import (
	"errors"
	"slices"
)

// Limits bound the work of Read. A zero or negative field takes its
// default.
type Limits struct {
	MaxDecoded int64 // bytes all decoders may produce together (object streams included, each stream decoded once), plus what parsed values hold; past it, ErrBound
	MaxSteps   int64 // objects visited, lexer tokens, content operators: one step each; past it, ErrBound
	MaxPages   int   // pages whose text is read; every page still counts in Result.Pages
}

// The defaults of Limits.
const (
	DefaultMaxDecoded = 16 << 20
	DefaultMaxSteps   = 4 << 20
	DefaultMaxPages   = 100
)

func (l Limits) withDefaults() Limits {
	if l.MaxDecoded <= 0 {
		l.MaxDecoded = DefaultMaxDecoded
	}
	if l.MaxSteps <= 0 {
		l.MaxSteps = DefaultMaxSteps
	}
	if l.MaxPages <= 0 {
		l.MaxPages = DefaultMaxPages
	}
	return l
}

// Result is what Read found besides the text.
type Result struct {
	Pages int   // every /Type /Page object of the file; at least 1
	Steps int64 // the steps of Limits.MaxSteps spent
}

// ErrBound reports that a bound of Limits was passed: the caller treats the
// PDF as over any token cap.
var ErrBound = errors.New("pdf: over the work bound")

// budget is the work Read may still do.
type budget struct {
	steps, bytes int64
	over         bool
}

// step spends n steps; it reports false once the budget is spent.
func (b *budget) step(n int) bool {
	b.steps -= int64(n)
	b.over = b.over || b.steps < 0
	return !b.over
}

// take spends n bytes of decoder output or held memory.
func (b *budget) take(n int) bool {
	b.bytes -= int64(n)
	b.over = b.over || b.bytes < 0
	return !b.over
}

// span is a range [from, to) of a buffer.
type span struct{ from, to int }

// coverage records the parts of one buffer (the file, or a decoded object
// stream) whose structure was checked. What it does not cover is handed
// to the sink as text: that is the one place where bytes are accounted.
type coverage struct {
	buf   []byte
	spans []span
	text  []span // strings and comments inside covered parts: text all the same
}

func (c *coverage) cover(from, to int) {
	if from < to {
		c.spans = append(c.spans, span{from, to})
	}
}

// gaps returns the parts of buf no span covers, in order, but for those
// of white space alone (which a decoded buffer does not cover).
func (c *coverage) gaps() [][]byte {
	slices.SortFunc(c.spans, func(a, b span) int { return a.from - b.from })
	var out [][]byte
	var holes []span
	at := 0
	for _, s := range c.spans {
		if s.to-s.from < 64 && blank(c.buf[s.from:s.to]) {
			continue // white space between two gaps joins them
		}
		if s.from > at && !blank(c.buf[at:s.from]) {
			holes = append(holes, span{at, s.from})
		}
		at = max(at, s.to)
	}
	if at < len(c.buf) && !blank(c.buf[at:]) {
		holes = append(holes, span{at, len(c.buf)})
	}
	for _, h := range holes {
		out = append(out, c.buf[h.from:h.to])
	}
	// Strings and comments the structure holds, each once, but for those
	// inside a hole (already text).
	slices.SortFunc(c.text, func(a, b span) int { return a.from - b.from })
	end, k := 0, 0
	for _, t := range c.text {
		t.from = max(t.from, end)
		for k < len(holes) && holes[k].to <= t.from {
			k++
		}
		if t.to <= t.from || k < len(holes) && holes[k].from < t.to {
			continue
		}
		out = append(out, c.buf[t.from:t.to])
		end = t.to
	}
	return out
}

// Read hands the text of data to sink in pieces: the text its pages show
// (the first lim.MaxPages pages), then, as they are, every byte of data
// whose structure it did not check. An error from sink stops Read at once
// and is returned as is. Read returns no other error than sink's or
// ErrBound: a malformed, encrypted or foreign file is text.
//
// sink must not keep text after it returns: Read reuses the buffer.
func Read(data []byte, lim Limits, sink func(text []byte) error) (Result, error) {
	return ReadWith(data, lim, sink, nil)
}

// ReadWith is Read that also hands opaque the decoded data of every
// stream that decoded but that no page shows (an embedded file, XMP
// metadata, a font program, a stream nothing refers to): bytes a reader
// of the file could take for text, which the caller may cost by what text
// they hold. An error from opaque stops ReadWith as one from sink does.
func ReadWith(data []byte, lim Limits, sink, opaque func([]byte) error) (Result, error) {
	lim = lim.withDefaults()
	r := newReader(data, lim, sink)
	r.lim, r.opaque = lim, opaque
	return r.result(r.run())
}

func (r *reader) result(pages int, err error) (Result, error) {
	switch {
	case r.out.err != nil:
		return Result{}, r.out.err
	case r.b.over || err != nil:
		return Result{}, ErrBound
	}
	return Result{Pages: max(pages, 1), Steps: r.lim.MaxSteps - r.b.steps}, nil
}

// errBound is how the package's code stops on a spent budget.
var errBound = ErrBound

func (r *reader) run() (int, error) {
	r.scan()
	if r.b.over {
		return 0, errBound
	}
	if len(r.objs) == 0 {
		// Not a PDF: every byte is text.
		if err := r.out.raw(r.data); err != nil {
			return 0, err
		}
		return 1, r.out.flush()
	}
	r.unpackObjStms()
	pages, err := r.readPages()
	if err != nil {
		return 0, err
	}
	if err := r.sweep(); err != nil {
		return 0, err
	}
	return pages, r.emitGaps()
}

// emitGaps hands every unaccounted byte to the sink, separated from the
// text before by a line break.
func (r *reader) emitGaps() error {
	if err := r.out.flush(); err != nil {
		return err
	}
	bufs := append([]*coverage{&r.file}, r.decodedCov...)
	for _, c := range bufs {
		for _, g := range c.gaps() {
			if !r.b.step(16 + len(g)/16) {
				return errBound
			}
			r.out.separate('\n')
			if err := r.out.raw(g); err != nil {
				return err
			}
		}
	}
	return r.out.flush()
}

func blank(p []byte) bool {
	for _, c := range p {
		if !isSpace(c) {
			return false
		}
	}
	return true
}
