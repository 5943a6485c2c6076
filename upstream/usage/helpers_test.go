package usage_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// countBytes is a Count whose total does not depend on where batches are
// cut: a test can say exactly what Output must be.
func countBytes(b []byte) int { return len(b) }

// pieces returns the upstream's writes as reads: one Read per piece.
type pieces struct {
	p [][]byte
	i int
}

func (r *pieces) Read(b []byte) (int, error) {
	for r.i < len(r.p) && len(r.p[r.i]) == 0 {
		r.i++
	}
	if r.i == len(r.p) {
		return 0, io.EOF
	}
	n := copy(b, r.p[r.i])
	r.p[r.i] = r.p[r.i][n:]
	return n, nil
}

// splitAt cuts body at the given offsets.
func splitAt(body []byte, at ...int) io.Reader {
	var p [][]byte
	prev := 0
	for _, a := range at {
		p = append(p, body[prev:a])
		prev = a
	}
	return &pieces{p: append(p, body[prev:])}
}

// randomSplits cuts body in random places, seeded.
func randomSplits(body []byte, seed uint64) io.Reader {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var p [][]byte
	for len(body) > 0 {
		n := 1 + rng.IntN(min(len(body), 1+rng.IntN(64)))
		p = append(p, body[:n])
		body = body[n:]
	}
	return &pieces{p: p}
}

// splitter names a way of cutting a body into reads.
type splitter struct {
	name string
	wrap func(body []byte) io.Reader
}

// splitters are the cuttings every fixture goes through: results and
// output must not depend on them.
func splitters() []splitter {
	s := []splitter{
		{"whole", func(b []byte) io.Reader { return bytes.NewReader(b) }},
		{"one-byte", func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) }},
		{"half", func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) }},
		{"data-err", func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) }},
	}
	for seed := range uint64(8) {
		s = append(s, splitter{fmt.Sprint("random-", seed), func(b []byte) io.Reader { return randomSplits(b, seed) }})
	}
	return s
}

// run reads body through a reader as httputil.ReverseProxy does (a 32 KiB
// buffer, Close at the end) and returns what the client got and the result.
func run(t testing.TB, src io.Reader, o usage.Options) ([]byte, usage.Result) {
	t.Helper()
	return runUpTo(t, src, o, -1)
}

// runUpTo is run with the client gone after reads reads (-1: to EOF).
func runUpTo(t testing.TB, src io.Reader, o usage.Options, reads int) ([]byte, usage.Result) {
	t.Helper()
	return runBuf(t, src, o, reads, 32<<10)
}

// runBuf is runUpTo with the client's buffer of size bytes.
func runBuf(t testing.TB, src io.Reader, o usage.Options, reads, size int) ([]byte, usage.Result) {
	t.Helper()
	var res usage.Result
	calls := 0
	rc := usage.NewReader(io.NopCloser(src), o, func(r usage.Result) { res = r; calls++ })
	var out []byte
	buf := make([]byte, size)
	for i := 0; reads < 0 || i < reads; i++ {
		n, err := rc.Read(buf)
		out = append(out, buf[:n]...)
		if n == 0 && err == nil {
			t.Fatalf("Read returned 0, nil")
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
	}
	if err := rc.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := rc.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if calls != 1 {
		t.Fatalf("done called %d times, want 1", calls)
	}
	return out, res
}

// check runs body through every splitter and requires the same output and
// result from each; it returns them.
func check(t *testing.T, body []byte, o usage.Options) ([]byte, usage.Result) {
	t.Helper()
	var out0 []byte
	var res0 usage.Result
	for i, s := range splitters() {
		out, res := run(t, s.wrap(body), o)
		if i == 0 {
			out0, res0 = out, res
			continue
		}
		if !bytes.Equal(out, out0) {
			t.Fatalf("%s: output differs from whole read:\n%q\nwant\n%q", s.name, out, out0)
		}
		if res != res0 {
			t.Fatalf("%s: result %+v, whole read %+v", s.name, res, res0)
		}
	}
	// Pushed, as an upstream connection pushes a stream: the same bytes and
	// result, stripped or not.
	for _, s := range splitters() {
		out, res, pushed := runPush(t, s.wrap(body), o)
		if !pushed {
			t.Fatalf("%s: not pushed", s.name)
		}
		if !bytes.Equal(out, out0) || res != res0 {
			t.Fatalf("%s, pushed: got\n%q %+v\nwant\n%q %+v", s.name, out, res, out0, res0)
		}
	}
	// Small client buffers: what a read releases does not fit at once.
	for _, size := range []int{1, 7, 300} {
		out, res := runBuf(t, randomSplits(body, uint64(size)), o, -1, size)
		if !bytes.Equal(out, out0) || res != res0 {
			t.Fatalf("buffer of %d: got\n%q %+v\nwant\n%q %+v", size, out, res, out0, res0)
		}
	}
	return out0, res0
}

// pushBody is a body that pushes itself as an upstream connection's does:
// each read of src written, then flushed.
type pushBody struct{ src io.Reader }

func (p *pushBody) Read(b []byte) (int, error) { return p.src.Read(b) }
func (p *pushBody) Close() error               { return nil }

func (p *pushBody) Push(w io.Writer, flush func() error, buf []byte) (bool, error) {
	for {
		n, err := p.src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return true, werr
			}
			flush()
		}
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return true, err
		}
	}
}

// runPush is run with the reader pushed instead of read, when it can be;
// pushed says whether it was.
func runPush(t testing.TB, src io.Reader, o usage.Options) (out []byte, res usage.Result, pushed bool) {
	t.Helper()
	calls := 0
	rc := usage.NewReader(&pushBody{src: src}, o, func(r usage.Result) { res = r; calls++ })
	var w bytes.Buffer
	pushed, err := rc.(interface {
		Push(io.Writer, func() error, []byte) (bool, error)
	}).Push(&w, func() error { return nil }, make([]byte, 32<<10))
	if err != nil {
		t.Fatalf("Push: %v", err)
	}
	if !pushed {
		if _, err := io.Copy(&w, rc); err != nil {
			t.Fatalf("Read after a declined push: %v", err)
		}
	}
	if err := rc.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if calls != 1 {
		t.Fatalf("done called %d times, want 1", calls)
	}
	return w.Bytes(), res, pushed
}
