package tokens

import (
	"bufio"
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
)

// XML key parts: the text of the first element of a local name, read with
// encoding/xml token by token, in strict mode. An upstream that reads XML
// (SIFEN's e-invoices) parses it strictly; a lenient reading here (unquoted
// attributes, unknown entities kept as text, mismatched end tags) could
// find an element the upstream never sees, or miss one it does. So a body
// strict XML refuses is refused, never guessed at: unknown entities are an
// error (only the five predefined ones and character references are
// expanded; a DOCTYPE's entities are never), as is any encoding but UTF-8
// (or US-ASCII), or nesting deeper than maxXMLDepth.

// maxXMLDepth bounds the nesting of an XML body.
const maxXMLDepth = 1000

// isXMLType reports whether a media type says XML.
func isXMLType(mediaType string) bool {
	return mediaType == "application/xml" || mediaType == "text/xml" || strings.HasSuffix(mediaType, "+xml")
}

var errNotUTF8XML = &InvalidError{msg: "an XML body must be UTF-8", final: true}

// xmlCapture is the text gathered for the element names[i] opened at depth.
type xmlCapture struct {
	i, depth int
	text     []byte
}

// readXML reads the text of the first element of each local name in names
// into vals, stopping once all are found. A body is XML when its type says
// so (declared) or when it starts with '<' after white space (and a UTF-8
// byte order mark); any other body has no elements. XML must be well
// formed up to where the reading stops: one root element, no text
// outside it.
func readXML(r io.Reader, declared bool, charset string, names []string, vals []Value) error {
	src, err := xmlSource(r, declared, charset)
	if src == nil || err != nil {
		return err
	}
	badCharset := false
	d := xml.NewDecoder(src)
	d.Strict = true
	d.CharsetReader = func(label string, in io.Reader) (io.Reader, error) {
		switch strings.ToLower(label) {
		case "utf8":
			return in, nil
		case "us-ascii", "ascii":
			return asciiReader{in}, nil
		}
		badCharset = true
		return nil, errNotUTF8XML
	}

	var active []xmlCapture
	depth, rootSeen, remaining := 0, false, len(names)
	for remaining > 0 {
		tok, err := d.Token()
		if err == io.EOF {
			return nil // well formed to its end: Token reports unclosed elements
		}
		if err != nil {
			if badCharset || errors.Is(err, errNotASCII) {
				return errNotUTF8XML
			}
			return xmlError(err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 0 && rootSeen {
				return &InvalidError{msg: "invalid XML: data after the root element"}
			}
			depth++
			rootSeen = true
			if depth > maxXMLDepth {
				return &InvalidError{msg: "invalid XML: nesting deeper than " + strconv.Itoa(maxXMLDepth)}
			}
			for i, n := range names {
				if n == t.Name.Local && !vals[i].Found && !capturing(active, i) {
					active = append(active, xmlCapture{i: i, depth: depth})
				}
			}
		case xml.EndElement:
			for k := 0; k < len(active); {
				if c := active[k]; c.depth == depth {
					vals[c.i] = Value{S: strings.Trim(string(c.text), " \t\r\n"), Found: true}
					remaining--
					active = append(active[:k], active[k+1:]...)
					continue
				}
				k++
			}
			depth--
		case xml.CharData:
			if depth == 0 && strings.Trim(string(t), " \t\r\n") != "" {
				return &InvalidError{msg: "invalid XML: text outside the root element"}
			}
			for k := range active {
				active[k].text = append(active[k].text, t...)
			}
		}
	}
	return nil
}

// xmlSource is the body as the XML decoder should read it: past a UTF-8
// byte order mark, checked for ASCII when the charset says so. It is nil
// (with no error) for a body that is empty, white space, or does not start
// like XML and was not declared XML; errNotUTF8XML for other encodings.
func xmlSource(r io.Reader, declared bool, charset string) (io.Reader, error) {
	br := bufio.NewReaderSize(r, 16<<10)
	head, _ := br.Peek(512)
	if xmlInOtherEncoding(head) {
		return nil, errNotUTF8XML
	}
	if strings.HasPrefix(string(head), "\xef\xbb\xbf") {
		br.Discard(3) // UTF-8's byte order mark, which XML allows
	}
	for {
		b, err := br.Peek(1)
		if err != nil {
			return nil, nil // empty, or white space only: no element
		}
		if !isXMLSpace(b[0]) {
			if b[0] != '<' && !declared {
				return nil, nil // not XML
			}
			break
		}
		br.Discard(1)
	}
	switch strings.ToLower(charset) {
	case "", "utf-8", "utf8":
		return br, nil
	case "us-ascii", "ascii":
		return asciiReader{br}, nil
	}
	return nil, errNotUTF8XML
}

func capturing(active []xmlCapture, i int) bool {
	for _, c := range active {
		if c.i == i {
			return true
		}
	}
	return false
}

// xmlError says where an XML body is malformed, never what it holds
// (encoding/xml's messages quote element names).
func xmlError(err error) error {
	var se *xml.SyntaxError
	if errors.As(err, &se) {
		return &InvalidError{msg: "invalid XML at line " + strconv.Itoa(se.Line)}
	}
	return &InvalidError{msg: "invalid XML"}
}

func isXMLSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// xmlInOtherEncoding reports whether a body starts like XML in UTF-16 or
// UTF-32 (behind a byte order mark, or with its ASCII padded with NULs),
// which XML parsers decode: read here as UTF-8 it would hide its
// elements, so it is refused.
func xmlInOtherEncoding(head []byte) bool {
	odd := false
	for i, c := range head {
		switch c {
		case '<':
			return odd || i+1 < len(head) && head[i+1] == 0
		case 0, 0xfe, 0xff:
			odd = true
		case ' ', '\t', '\r', '\n':
		default:
			return false
		}
	}
	return false
}

// errNotASCII is a byte past 0x7F in a body declared US-ASCII.
var errNotASCII = errors.New("not US-ASCII")

// asciiReader reads a body declared US-ASCII, refusing any other byte:
// parsers disagree on what such a byte is.
type asciiReader struct{ r io.Reader }

func (a asciiReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	for _, c := range p[:n] {
		if c >= 0x80 {
			return 0, errNotASCII
		}
	}
	return n, err
}
