package tokens

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/url"
	"strings"
	"unicode/utf8"
)

// formParams are the form fields that are parameters, not text: every
// other field of a form is text the model may read, and counts.
var formParams = map[string]bool{"model": true, "stream": true, "temperature": true, "top_p": true, "top_k": true,
	"max_tokens": true, "max_completion_tokens": true, "max_output_tokens": true, "n": true, "seed": true, "user": true,
	"frequency_penalty": true, "presence_penalty": true}

// isFile reports whether a part is a file: it names a filename, even in a
// Content-Disposition Go's parser rejects (filename=a b.pdf unquoted), as
// lenient parsers (python-multipart, busboy) read it.
func isFile(part *multipart.Part) bool {
	return part.FileName() != "" || strings.Contains(strings.ToLower(part.Header.Get("Content-Disposition")), "filename")
}

func isModelField(name string) bool {
	var buf [16]byte
	return string(fold([]byte(name), buf[:0])) == "model"
}

// isTextField reports whether a form field's value counts.
func isTextField(name string) bool {
	var buf [64]byte
	return !formParams[string(fold([]byte(name), buf[:0]))]
}

func newMultipart(r io.Reader, boundary string) (*multipart.Reader, error) {
	if boundary == "" {
		return nil, &InvalidError{msg: "multipart body without a boundary parameter"}
	}
	return multipart.NewReader(r, boundary), nil
}

// nextPart is NextPart with the end of the body told apart from a body cut
// short (which NextPart reports as a wrapped io.EOF).
// Each part draws on the request's work budget.
func nextPart(mr *multipart.Reader, wk *work) (*multipart.Part, error) {
	if err := wk.draw(workPart, LimitedMultipart); err != nil {
		return nil, err
	}
	p, err := mr.NextPart()
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		// mime/multipart's messages may quote header lines: say only where.
		return nil, &InvalidError{msg: "invalid multipart body: malformed or truncated part"}
	}
	return p, nil
}

// multipartModel returns the value of a "model" field, "" if none.
func multipartModel(r io.Reader, boundary string, wk *work) (string, error) {
	mr, err := newMultipart(r, boundary)
	if err != nil {
		return "", err
	}
	for {
		p, err := nextPart(mr, wk)
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if !isFile(p) && isModelField(p.FormName()) {
			b, err := io.ReadAll(io.LimitReader(p, 256))
			if err != nil {
				return "", &InvalidError{msg: "invalid multipart body: truncated part"}
			}
			return strings.TrimSpace(string(b)), nil
		}
	}
}

// countMultipart counts a multipart form: its text fields, and its files:
// text files by their content, images by the vision formula, PDFs by their
// text and pages, audio by its duration, other files (documents,
// archives, binaries) by the size rule.
func countMultipart(r io.Reader, boundary string, p pricing, m *meter) error {
	mr, err := newMultipart(r, boundary)
	if err != nil {
		return err
	}
	sawModel := false
	for {
		part, err := nextPart(mr, m.work)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if !isFile(part) && isModelField(part.FormName()) {
			if sawModel {
				return &InvalidError{msg: "duplicate member \"model\"", final: true}
			}
			sawModel = true
		}
		switch {
		case isFile(part):
			err = countFile(part, p, m)
		case isTextField(part.FormName()):
			err = countText(part, m)
		}
		if err != nil {
			if errors.Is(err, errStop) || errors.Is(err, errWork) {
				return err
			}
			var inv *InvalidError
			if errors.As(err, &inv) {
				return err
			}
			return &InvalidError{msg: "invalid multipart body: truncated part"}
		}
	}
}

// UnreadableBytesPerToken is the size heuristic for a file whose text
// cannot be read here (PDF, Office, archives): the seed's example puts
// 10 KB of PDF at ~3000 characters, and 3.5 characters make a token, so
// one token per 35/3 ≈ 11.7 bytes.
func unreadableTokens(n int64) int { return int((n*3 + 34) / 35) }

func countFile(part *multipart.Part, p pricing, m *meter) error {
	var head [512]byte
	n, err := io.ReadFull(part, head[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return err
	}
	mediaType, _, _ := mime.ParseMediaType(part.Header.Get("Content-Type"))
	kind := fileKind(mediaType, head[:n])
	if kind == "text" {
		if err := m.text(head[:n]); err != nil {
			return err
		}
		return countText(part, m)
	}
	// Any other file is held whole (the file cap bounds it) and costed by
	// costFile; bytes past maxBlob cost the size rule.
	data := append([]byte(nil), head[:n]...)
	rest, err := io.ReadAll(io.LimitReader(part, maxBlob))
	if err != nil {
		return err
	}
	over, err := io.Copy(io.Discard, part)
	if err != nil {
		return err
	}
	if err := m.add(unreadableTokens(over)); err != nil {
		return err
	}
	fi := fileInfo{mediaType: mediaType, filename: part.FileName()}
	return m.costFile(kind, append(data, rest...), fi, p)
}

// fileKind classifies a file: "text", "image", "pdf", "audio" or
// "binary". The bytes' own signature wins over the declared type (a PDF
// sent as text/plain is a PDF to an upstream that sniffs it); a declared
// image, audio or PDF whose bytes are plain text is text; then the
// declared type; then the bytes again.
func fileKind(mediaType string, head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte("%PDF-")):
		return "pdf"
	case bytes.HasPrefix(head, []byte("\x89PNG")), bytes.HasPrefix(head, []byte("\xff\xd8\xff")),
		bytes.HasPrefix(head, []byte("GIF8")), len(head) >= 12 && string(head[:4]) == "RIFF" && string(head[8:12]) == "WEBP":
		return "image"
	case len(head) >= 12 && string(head[:4]) == "RIFF" && string(head[8:12]) == "WAVE",
		bytes.HasPrefix(head, []byte("ID3")), bytes.HasPrefix(head, []byte("OggS")), bytes.HasPrefix(head, []byte("fLaC")),
		len(head) >= 8 && string(head[4:8]) == "ftyp", bytes.HasPrefix(head, []byte("\x1a\x45\xdf\xa3")):
		return "audio"
	case bytes.HasPrefix(head, []byte("\xff\xfe")), bytes.HasPrefix(head, []byte("\xfe\xff")):
		return "text" // UTF-16 with its byte order mark: counted as its bytes, which costs more
	}
	declared := ""
	switch {
	case strings.HasPrefix(mediaType, "text/"), mediaType == "application/json", strings.HasSuffix(mediaType, "+json"),
		mediaType == "application/xml", strings.HasSuffix(mediaType, "+xml"), mediaType == "application/x-yaml",
		mediaType == "application/yaml", mediaType == "application/javascript", mediaType == "application/x-ndjson":
		return "text"
	case mediaType == "application/pdf":
		declared = "pdf"
	case strings.HasPrefix(mediaType, "image/"):
		declared = "image"
	case strings.HasPrefix(mediaType, "audio/"), strings.HasPrefix(mediaType, "video/"):
		declared = "audio"
	}
	if looksLikeText(head) && len(head) > 0 {
		return "text"
	}
	if declared != "" {
		return declared
	}
	if len(head) >= 4 && head[0] == 0xFF && head[1]&0xE0 == 0xE0 && head[1] != 0xFE && mediaType == "" {
		return "audio" // an MPEG audio frame header
	}
	return "binary"
}

// looksLikeText: valid UTF-8 (a sequence cut at the end is fine) without
// NUL or other C0 controls than tab, newline, carriage return, form feed.
func looksLikeText(b []byte) bool {
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' {
			return false
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 && len(b)-i >= utf8.UTFMax {
			return false
		}
		i += size
	}
	return true
}

// maxParsedForm is the largest URL-encoded form parsed in memory: a
// larger one's model is not read, and it is counted as text.
const maxParsedForm = 1 << 20

// formModel returns a URL-encoded form's model field ("" if none); one
// with two model fields is refused, as a JSON body with two is.
func formModel(b []byte) (string, error) {
	vals, err := url.ParseQuery(string(b))
	if err != nil {
		return "", nil // not a form: counted as text
	}
	var model []string
	for k, vs := range vals {
		if isModelField(k) {
			model = append(model, vs...)
		}
	}
	if len(model) > 1 {
		return "", &InvalidError{msg: "duplicate member \"model\"", final: true}
	}
	if len(model) == 1 {
		return strings.TrimSpace(model[0]), nil
	}
	return "", nil
}

// countForm counts a URL-encoded form's text fields; a form too large to
// parse in memory, or that does not parse, is counted as text.
func countForm(r io.Reader, size int64, m *meter) error {
	if size <= maxParsedForm {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if vals, err := url.ParseQuery(string(b)); err == nil {
			for k, vs := range vals {
				if !isTextField(k) {
					continue
				}
				for _, v := range vs {
					if err := m.value(v); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return countText(bytes.NewReader(b), m)
	}
	return countText(r, m)
}
