package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"
)

// MaxHeadBytes bounds a response head (status line and headers), as
// http.Transport's default MaxResponseHeaderBytes does.
const MaxHeadBytes = 10 << 20

var (
	errHeadTooLarge = errors.New("h1: response head too large")
	errMalformed    = errors.New("h1: malformed response head")
)

// ReadResponse reads a response head from br and returns the response
// with a Body reading its framing from br, as http.ReadResponse does for
// a request with the given method ("" is GET), with two differences: a
// "Pragma: no-cache" gains no Cache-Control header (nothing is added to
// what the origin sent), and the head is parsed from one block of br's
// buffer into one string, with no per-line garbage.
func ReadResponse(br *bufio.Reader, method string) (*http.Response, error) {
	res := new(http.Response)
	b := new(Body)
	if _, err := readResponse(br, method, res, b); err != nil {
		return nil, err
	}
	return res, nil
}

// readResponse fills res from the head in br and sets res.Body to b (or
// http.NoBody); got reports whether any byte of a response came.
func readResponse(br *bufio.Reader, method string, res *http.Response, b *Body) (got bool, err error) {
	block, err := readHead(br)
	if err != nil {
		return br.Buffered() > 0 || !(err == io.EOF || errors.Is(err, errNothingCame)), err
	}
	if err := parseHead(block, res); err != nil {
		return true, err
	}
	if method == "" {
		method = http.MethodGet
	}
	return true, framing(br, method, res, b)
}

// nothingCameError is a read error before any byte of a response.
type nothingCameError struct{ err error }

var errNothingCame = errors.New("h1: nothing of a response came")

func (e *nothingCameError) Error() string   { return e.err.Error() }
func (e *nothingCameError) Unwrap() []error { return []error{e.err, errNothingCame} }

// readHead returns the response head, up to and including its blank line,
// as one string, and advances br past it.
func readHead(br *bufio.Reader) (string, error) {
	scanned := 0
	for {
		buf, _ := br.Peek(br.Buffered())
		if end := headEnd(buf, scanned); end >= 0 {
			s := string(buf[:end])
			br.Discard(end)
			return s, nil
		}
		scanned = max(0, len(buf)-2)
		if len(buf) == br.Size() {
			return readLongHead(br)
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			if errors.Is(err, io.EOF) {
				if len(buf) == 0 {
					return "", io.EOF // nothing of a response: the peer closed
				}
				return "", io.ErrUnexpectedEOF
			}
			if len(buf) == 0 {
				return "", &nothingCameError{err}
			}
			return "", fmt.Errorf("h1: reading response head: %w", err)
		}
	}
}

// readLongHead reads a head longer than br's buffer into its own memory.
func readLongHead(br *bufio.Reader) (string, error) {
	var block []byte
	for {
		p, err := br.ReadSlice('\n')
		from := max(0, len(block)-2)
		block = append(block, p...)
		if end := headEnd(block, from); end >= 0 {
			// ReadSlice stops at the first \n, so the blank line is the
			// end of block.
			return string(block[:end]), nil
		}
		if len(block) > MaxHeadBytes {
			return "", errHeadTooLarge
		}
		if err != nil && err != bufio.ErrBufferFull {
			if errors.Is(err, io.EOF) {
				return "", io.ErrUnexpectedEOF
			}
			return "", fmt.Errorf("%w: %w", errPartHead, err)
		}
	}
}

// headEnd returns the length of the head in buf (through the blank line
// that ends it: a line that is empty once its \n or \r\n is removed,
// after the status line), or -1; it looks from index from on.
func headEnd(buf []byte, from int) int {
	for i := from; i < len(buf); i++ {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j
		if i >= 1 && buf[i-1] == '\n' {
			return i + 1
		}
		if i >= 2 && buf[i-1] == '\r' && buf[i-2] == '\n' {
			return i + 1
		}
	}
	return -1
}

// nextLine returns the line of s at *pos without its \n or \r\n, and
// moves *pos past it.
func nextLine(s string, pos *int) string {
	rest := s[*pos:]
	i := strings.IndexByte(rest, '\n')
	if i < 0 {
		*pos = len(s)
		return rest
	}
	*pos += i + 1
	line := rest[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line
}

// parseHead parses a head as http.ReadResponse does: the status line,
// then header fields as textproto.Reader.ReadMIMEHeader reads them
// (obsolete line folding joined with one space, names canonicalised).
func parseHead(s string, res *http.Response) error {
	pos := 0
	line := nextLine(s, &pos)
	proto, status, ok := strings.Cut(line, " ")
	if !ok {
		return fmt.Errorf("%w: malformed HTTP response %q", errMalformed, line)
	}
	res.Proto = proto
	res.Status = strings.TrimLeft(status, " ")
	code, _, _ := strings.Cut(res.Status, " ")
	if len(code) != 3 {
		return fmt.Errorf("%w: malformed HTTP status code %q", errMalformed, code)
	}
	if c0, c1, c2 := code[0]-'0', code[1]-'0', code[2]-'0'; c0 <= 9 && c1 <= 9 && c2 <= 9 {
		res.StatusCode = int(c0)*100 + int(c1)*10 + int(c2)
	} else if n, err := strconv.Atoi(code); err != nil || n < 0 {
		return fmt.Errorf("%w: malformed HTTP status code %q", errMalformed, code)
	} else {
		res.StatusCode = n
	}
	switch proto {
	case "HTTP/1.1":
		res.ProtoMajor, res.ProtoMinor = 1, 1
	case "HTTP/1.0":
		res.ProtoMajor, res.ProtoMinor = 1, 0
	default:
		if res.ProtoMajor, res.ProtoMinor, ok = http.ParseHTTPVersion(proto); !ok {
			return fmt.Errorf("%w: malformed HTTP version %q", errMalformed, proto)
		}
	}

	if pos < len(s) && (s[pos] == ' ' || s[pos] == '\t') {
		return fmt.Errorf("%w: malformed MIME header initial line", errMalformed)
	}
	// One slab of values, cut into one-element slices, as textproto does.
	n := strings.Count(s[pos:], "\n") - 1
	h := make(http.Header, max(n, 0))
	var slab []string
	if n > 0 {
		slab = make([]string, n)
	}
	var fold []byte
	for {
		kv := nextLine(s, &pos)
		if kv == "" {
			break
		}
		kv = trim(kv)
		if pos < len(s) && (s[pos] == ' ' || s[pos] == '\t') {
			if strings.IndexByte(kv, ':') < 0 {
				return fmt.Errorf("%w: missing colon", errMalformed)
			}
			// Obsolete line folding: each continuation line joins the
			// value after one space.
			fold = append(fold[:0], kv...)
			for pos < len(s) && (s[pos] == ' ' || s[pos] == '\t') {
				fold = append(fold, ' ')
				fold = append(fold, trim(nextLine(s, &pos))...)
			}
			kv = string(fold)
		}
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return fmt.Errorf("%w: malformed MIME header line", errMalformed)
		}
		key, ok := canonicalKey(k)
		if !ok {
			return fmt.Errorf("%w: malformed MIME header line", errMalformed)
		}
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
				return fmt.Errorf("%w: malformed MIME header line", errMalformed)
			}
		}
		value := strings.TrimLeft(v, " \t")
		if vv, ok := h[key]; ok {
			h[key] = append(vv, value)
		} else if len(slab) > 0 {
			vv, slab = slab[:1:1], slab[1:]
			vv[0] = value
			h[key] = vv
		} else {
			h[key] = []string{value}
		}
	}
	res.Header = h
	return nil
}

// trim removes leading and trailing spaces and tabs.
func trim(s string) string {
	return strings.TrimRight(strings.TrimLeft(s, " \t"), " \t")
}

// canonicalKey is textproto's canonical form of a header name; ok false
// when the name is not one (empty, or a byte outside a token besides a
// space, which is kept as is).
func canonicalKey(k string) (string, bool) {
	if k == "" {
		return "", false
	}
	canonical, space := true, false
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !tokenByte(c) {
			if c != ' ' {
				return k, false
			}
			space = true
			continue
		}
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			canonical = false
		}
		upper = c == '-'
	}
	if space || canonical {
		return k, true
	}
	return textproto.CanonicalMIMEHeaderKey(k), true
}

// tokenByte reports whether c may appear in a header name (RFC 7230 tchar).
func tokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// framing sets res's length, close and body as net/http's readTransfer
// does for a response.
func framing(br *bufio.Reader, method string, res *http.Response, b *Body) error {
	h := res.Header
	closing := shouldClose(res.ProtoMajor, res.ProtoMinor, h)
	major, minor := res.ProtoMajor, res.ProtoMinor
	if major == 0 && minor == 0 {
		major, minor = 1, 1
	}
	chunked := false
	if te, ok := h["Transfer-Encoding"]; ok {
		delete(h, "Transfer-Encoding")
		if major > 1 || major == 1 && minor >= 1 {
			if len(te) != 1 {
				return fmt.Errorf("h1: too many transfer encodings: %q", te)
			}
			if !asciiEqualFold(te[0], "chunked") {
				return fmt.Errorf("h1: unsupported transfer encoding: %q", te[0])
			}
			chunked = true
		}
	}
	length, err := fixLength(res.StatusCode, method, h, chunked)
	if err != nil {
		return err
	}
	res.ContentLength = length
	if method == http.MethodHead {
		if res.ContentLength, err = parseContentLength(h["Content-Length"]); err != nil {
			return err
		}
	}
	if res.Trailer, err = fixTrailer(h, chunked); err != nil {
		return err
	}
	if length == -1 && !chunked && bodyAllowed(res.StatusCode) {
		closing = true // read until the peer closes
	}
	res.Close = closing
	b.br, b.res = br, res
	switch {
	case chunked:
		res.TransferEncoding = []string{"chunked"}
		if method == http.MethodHead || !bodyAllowed(res.StatusCode) {
			res.Body = http.NoBody
			return nil
		}
		b.kind, b.chunks = bodyChunked, httputil.NewChunkedReader(br)
	case length > 0:
		b.kind, b.left = bodyLength, length
	case length < 0 && closing:
		b.kind = bodyUntilClose
	default:
		res.Body = http.NoBody
		return nil
	}
	res.Body = b
	return nil
}

func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == 204 || status == 304)
}

func fixLength(status int, method string, h http.Header, chunked bool) (int64, error) {
	cls := h["Content-Length"]
	if len(cls) > 1 {
		first := textproto.TrimString(cls[0])
		for _, v := range cls[1:] {
			if textproto.TrimString(v) != first {
				return 0, fmt.Errorf("h1: multiple Content-Length headers: %q", cls)
			}
		}
		cls = []string{first}
		h["Content-Length"] = cls
	}
	var n int64
	if len(cls) > 0 {
		var err error
		if n, err = parseContentLength(cls); err != nil {
			return -1, err
		}
	}
	if method == http.MethodHead || !bodyAllowed(status) {
		return 0, nil
	}
	if chunked {
		delete(h, "Content-Length")
		return -1, nil
	}
	if len(cls) > 0 {
		return n, nil
	}
	delete(h, "Content-Length")
	return -1, nil
}

func parseContentLength(cls []string) (int64, error) {
	if len(cls) == 0 {
		return -1, nil
	}
	cl := textproto.TrimString(cls[0])
	if cl == "" {
		return 0, errors.New("h1: invalid empty Content-Length")
	}
	n, err := strconv.ParseUint(cl, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("h1: bad Content-Length %q", cl)
	}
	return int64(n), nil
}

func fixTrailer(h http.Header, chunked bool) (http.Header, error) {
	vv, ok := h["Trailer"]
	if !ok || !chunked {
		return nil, nil
	}
	delete(h, "Trailer")
	trailer := http.Header{}
	for _, v := range vv {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f == "" {
				continue
			}
			key := http.CanonicalHeaderKey(f)
			switch key {
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return nil, fmt.Errorf("h1: bad trailer key %q", key)
			}
			trailer[key] = nil
		}
	}
	if len(trailer) == 0 {
		return nil, nil
	}
	return trailer, nil
}

// shouldClose is net/http's: whether the connection ends with this
// response; a "close" token is removed with the Connection header.
func shouldClose(major, minor int, h http.Header) bool {
	if major < 1 {
		return true
	}
	conv := h["Connection"]
	hasClose := containsToken(conv, "close")
	if major == 1 && minor == 0 {
		return hasClose || !containsToken(conv, "keep-alive")
	}
	if hasClose {
		delete(h, "Connection")
	}
	return hasClose
}

// containsToken reports whether a comma-separated element of values is
// token, in ASCII case folding.
func containsToken(values []string, token string) bool {
	for _, v := range values {
		for {
			elem, rest, more := strings.Cut(v, ",")
			if asciiEqualFold(strings.Trim(elem, " \t"), token) {
				return true
			}
			if !more {
				break
			}
			v = rest
		}
	}
	return false
}

func asciiEqualFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		a, b := s[i], t[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}
