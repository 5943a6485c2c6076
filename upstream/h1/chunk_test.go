package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http/httputil"
	"strings"
	"testing"
)

// FuzzChunkDecoder checks chunkDecoder against net/http's chunked reader:
// the same data, the same verdict (a last chunk reached, or an error), and
// the trailer starting at the same byte, whatever pieces the coding comes
// in.
func FuzzChunkDecoder(f *testing.F) {
	for _, s := range []string{
		"5\r\nhello\r\n0\r\n\r\n",
		"3;ext=1\r\nabc\r\n0\r\nX-T: v\r\n\r\n",
		"1\r\na\r\n1\r\nb\r\n0\r\n\r\n",
		"A\r\n0123456789\r\n0\r\n\r\n",
		"5 \t\r\nhello\r\n0\r\n\r\n",
		"5\nhello\r\n0\r\n\r\n",
		"5\r\nhelloXY0\r\n\r\n",
		"5\r\nhel\rlo\r\n0\r\n\r\n",
		"5\r\r\nhello\r\n0\r\n\r\n",
		"zz\r\n",
		"\r\n",
		";\r\n",
		"00000000000000001\r\na\r\n",
		"fffffffffffffffff\r\n",
		"ffffffffffffffff\r\nabc",
		"5\r\nhel",
		"1;" + strings.Repeat("x", 5000) + "\r\na\r\n0\r\n\r\n",
		strings.Repeat("1;"+strings.Repeat("e", 100)+"\r\na\r\n", 200) + "0\r\n\r\n",
	} {
		f.Add([]byte(s), byte(7))
		f.Add([]byte(s), byte(1))
	}
	f.Fuzz(func(t *testing.T, raw []byte, step byte) {
		src := bytes.NewReader(raw)
		br := bufio.NewReaderSize(src, 64<<10)
		want, werr := io.ReadAll(httputil.NewChunkedReader(br))
		wantRest := br.Buffered() + src.Len()

		var d chunkDecoder
		var got []byte
		var gerr error
		rest := -1
		buf := append([]byte(nil), raw...)
		n := max(int(step), 1)
		for off := 0; off < len(buf) && gerr == nil && rest < 0; off += n {
			p := buf[off:min(off+n, len(buf))]
			data, used, err := d.decode(p)
			got = append(got, p[:data]...)
			gerr = err
			if err == nil && d.state == chunkLast {
				rest = len(buf) - off - used
			}
		}
		if gerr == nil && rest < 0 {
			gerr = io.ErrUnexpectedEOF // the coding ended without a last chunk
		}
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("net/http: %v, decoder: %v (input %q)", werr, gerr, raw)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("data differs: got %q, want %q (input %q)", got, want, raw)
		}
		if werr == nil && rest != wantRest {
			t.Fatalf("trailer starts %d bytes before the end, want %d (input %q)", rest, wantRest, raw)
		}
	})
}

// TestChunkDecoderKeepsLineAcrossReads feeds a size line a byte at a time:
// its pieces are kept, and a line that can only end too long is refused
// before it is whole.
func TestChunkDecoderKeepsLineAcrossReads(t *testing.T) {
	var d chunkDecoder
	for _, c := range []byte("1a;name=x\r\n") {
		if _, _, err := d.decode([]byte{c}); err != nil {
			t.Fatal(err)
		}
	}
	if d.state != chunkData || d.n != 0x1a {
		t.Fatalf("state %d, %d bytes to come; want data, 26", d.state, d.n)
	}

	d = chunkDecoder{}
	long := bytes.Repeat([]byte("0"), maxChunkLine)
	if _, _, err := d.decode(long); err != nil {
		t.Fatalf("%d bytes of a line: %v", len(long), err)
	}
	if _, _, err := d.decode([]byte("0")); err != errChunkLineLong {
		t.Fatalf("one more byte: %v, want %v", err, errChunkLineLong)
	}
	if cap(d.line) > 2*maxChunkLine {
		t.Fatalf("the kept line grew to %d bytes", cap(d.line))
	}
}
