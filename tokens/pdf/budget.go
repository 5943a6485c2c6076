package pdf

import (
	"errors"
	"io"
	"time"
)

// budget is the work Read may still do: bytes its decoders may produce and
// the wall time left. Everything that can take time in this package (the
// decoders, the scans, the content interpreter, every read the library makes)
// checks it, so Read returns within about one decoder chunk of the
// deadline and no goroutine is needed.
type budget struct {
	deadline time.Time
	left     int64 // decoder output still allowed
	ticks    int
	over     bool
	// reserved is what reserve took for streams that could not be
	// decoded: Result.Unread may exceed the file's size by as much.
	reserved int64
}

// errOver is how the package's own code reports a passed bound; Read turns
// it into ErrBound.
var errOver = errors.New("pdf: bound passed")

func newBudget(lim Limits, now time.Time) *budget {
	return &budget{deadline: now.Add(lim.Timeout), left: lim.MaxDecompressed}
}

// charge records n bytes of decoder output.
func (b *budget) charge(n int) error {
	b.left -= int64(n)
	if b.left < 0 {
		b.over = true
	}
	return b.check()
}

// check reports errOver once any bound has passed.
func (b *budget) check() error {
	if b.over {
		return errOver
	}
	if time.Now().After(b.deadline) {
		b.over = true
		return errOver
	}
	return nil
}

// tick is check for hot loops: it reads the clock every 256 calls.
func (b *budget) tick() error {
	if b.over {
		return errOver
	}
	b.ticks++
	if b.ticks&255 != 0 {
		return nil
	}
	return b.check()
}

// meter charges the bytes read through it to the budget: wrapped around
// every decoder's output (each layer of a filter chain), it bounds what the
// decoders produce, whoever reads them.
type meter struct {
	r io.Reader
	b *budget
}

func (m *meter) Read(p []byte) (int, error) {
	if m.b.over {
		return 0, errOver
	}
	n, err := m.r.Read(p)
	if cerr := m.b.charge(n); cerr != nil {
		return n, cerr
	}
	return n, err
}

// readAll reads r to its end into memory, starting with room for hint
// bytes. It stops with errOver when the budget is spent; r is expected to
// be metered.
func readAll(r io.Reader, b *budget, hint int) ([]byte, error) {
	hint = max(512, min(hint, int(min(b.left, 4<<20))))
	buf := make([]byte, 0, hint)
	for {
		if len(buf) == cap(buf) {
			// Double, but not far past what the budget still allows.
			n := min(2*cap(buf), len(buf)+int(min(max(b.left, 0), 1<<30))+4096)
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if b.over {
			return buf, errOver
		}
		if err != nil {
			return buf, err
		}
	}
}

// maxExpansion is the worst expansion assumed of data this package cannot
// decode: Flate's (a 258-byte match in two bits), a plausible bound for any
// general compressor on text.
const maxExpansion = 1032

// reserve prices n bytes that a reader might decompress but this package
// could not decode (a filter it does not know, the rest of a stream after
// damage): as if they expanded by maxExpansion. The estimate is taken from
// the budget, and returned to be counted as unread; when the budget cannot
// cover it, the bound is passed (ErrBound): such a stream could hold more
// text than any cap allows.
func (b *budget) reserve(n int) (int64, error) {
	if n <= 0 {
		return 0, b.check()
	}
	need := int64(n) * maxExpansion
	if need > b.left {
		b.over = true
		return 0, errOver
	}
	b.left -= need
	b.reserved += need
	return need, b.check()
}
