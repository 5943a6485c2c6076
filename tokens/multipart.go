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

// textFields are the form fields whose text the model reads (the seed's
// /api/chat form, and the OpenAI-style names for other routes).
var textFields = map[string]bool{"message": true, "system": true, "prompt": true, "input": true, "instructions": true}

func newMultipart(r io.Reader, boundary string) (*multipart.Reader, error) {
	if boundary == "" {
		return nil, &InvalidError{msg: "multipart body without a boundary parameter"}
	}
	return multipart.NewReader(r, boundary), nil
}

// nextPart is NextPart with the end of the body told apart from a body cut
// short (which NextPart reports as a wrapped io.EOF).
func nextPart(mr *multipart.Reader) (*multipart.Part, error) {
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
func multipartModel(r io.Reader, boundary string) (string, error) {
	mr, err := newMultipart(r, boundary)
	if err != nil {
		return "", err
	}
	for {
		p, err := nextPart(mr)
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if p.FileName() == "" && p.FormName() == "model" {
			b, err := io.ReadAll(io.LimitReader(p, 256))
			if err != nil {
				return "", &InvalidError{msg: "invalid multipart body: truncated part"}
			}
			return strings.TrimSpace(string(b)), nil
		}
	}
}

// countMultipart counts a multipart form: its text fields, and its files:
// text files by their content, PNG/JPEG/GIF images by the vision formula,
// other files (PDFs, documents, binaries) by the size heuristic.
func countMultipart(r io.Reader, boundary, model string, m *meter) error {
	mr, err := newMultipart(r, boundary)
	if err != nil {
		return err
	}
	for {
		p, err := nextPart(mr)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case p.FileName() != "":
			err = countFile(p, model, m)
		case textFields[p.FormName()]:
			err = countText(p, m)
		}
		if err != nil {
			if errors.Is(err, errStop) {
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

func countFile(p *multipart.Part, model string, m *meter) error {
	var head [512]byte
	n, err := io.ReadFull(p, head[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return err
	}
	mediaType, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
	switch fileKind(mediaType, head[:n]) {
	case "text":
		if err := m.text(head[:n]); err != nil {
			return err
		}
		return countText(p, m)
	case "image":
		data := append([]byte(nil), head[:n]...)
		more, err := io.ReadAll(io.LimitReader(p, imageHead-int64(n)))
		if err != nil {
			return err
		}
		data = append(data, more...)
		if _, err := io.Copy(io.Discard, p); err != nil {
			return err
		}
		img := imageRef{present: true}
		img.width, img.height = rawImageSize(data)
		return m.add(img.openAITokens(model))
	}
	total := int64(n)
	var buf [32 << 10]byte
	for {
		k, err := p.Read(buf[:])
		total += int64(k)
		if errors.Is(err, io.EOF) {
			return m.add(unreadableTokens(total))
		}
		if err != nil {
			return err
		}
		if m.limit >= 0 && m.total+unreadableTokens(total) > m.limit {
			return m.add(unreadableTokens(total)) // past the cap already: stop reading
		}
	}
}

// fileKind classifies a file part by its declared type, else its first
// bytes: "text", "image" or "binary".
func fileKind(mediaType string, head []byte) string {
	switch {
	case strings.HasPrefix(mediaType, "text/"), mediaType == "application/json", strings.HasSuffix(mediaType, "+json"),
		mediaType == "application/xml", strings.HasSuffix(mediaType, "+xml"), mediaType == "application/x-yaml",
		mediaType == "application/yaml", mediaType == "application/javascript", mediaType == "application/x-ndjson":
		return "text"
	case bytes.HasPrefix(head, []byte("\x89PNG")), bytes.HasPrefix(head, []byte("\xff\xd8\xff")), bytes.HasPrefix(head, []byte("GIF8")):
		return "image"
	case mediaType == "" || mediaType == "application/octet-stream":
		if looksLikeText(head) {
			return "text"
		}
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

func rawImageSize(data []byte) (int, int) {
	for _, mt := range []string{"image/png", "image/jpeg", "image/gif"} {
		if w, h := imageSizeRaw(mt, data); w > 0 {
			return w, h
		}
	}
	return 0, 0
}

// countForm counts a URL-encoded form's text fields; a form too large to
// parse in memory, or that does not parse, is counted as text.
func countForm(r io.Reader, size int64, m *meter) error {
	if size <= 1<<20 {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if vals, err := url.ParseQuery(string(b)); err == nil {
			for k, vs := range vals {
				if !textFields[k] {
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
