package tokens

import (
	"bytes"
	"encoding/base64"
	"mime"
	"net/url"
	"path"
	"strings"
)

// What cannot be read as text is costed, never skipped (SPEC §4.6): images
// by their size, PDFs by their text and pages, audio by its duration, any
// other file by the size rule. In JSON these arrive as strings — data URLs,
// bare base64, plain text — whose meaning may only be known once the
// members beside them have been read, so a blob is kept (within maxBlob)
// until its object is done.

// blobHint is what a member says its data is.
type blobHint uint8

const (
	blobFile  blobHint = iota // a file of any kind: its type or its bytes decide
	blobImage                 // an image, whatever its bytes
	blobAudio                 // audio, whatever its bytes
)

// maxBlob bounds the bytes of one blob kept: the body cap bounds them
// already; past this the rest is costed by the size rule.
const maxBlob = 64 << 20

// blob is one data string as read.
type blob struct {
	hint  blobHint
	raw   []byte // the string's first maxBlob bytes
	size  int64  // the string's length in bytes
	costd bool
}

// partState is what a part's members say about the images and files it
// carries, gathered until the part ends.
type partState struct {
	typ, mediaType, detail, format, filename string
	image                                    *blob // an image_url's data URL, URL or base64
	imageSeen                                bool  // an image is referred to (image_url, a source, a file id)
	sources                                  []sourceRef
	files                                    []*blob
	result                                   *blob // a "result": text, or a generated image (image_generation_call)
	storedFile                               bool  // a file_id or file_url: a file the proxy cannot see
}

// sourceRef is what an Anthropic source says of its data. It is costed
// with its block, once the block's type is known: a client that sorts
// keys sends "source" before "type".
type sourceRef struct {
	typ, mediaType string
	data           *blob // base64 or text data, not costed yet
	remote         bool  // a URL or a stored file
}

// metadata is where a part keeps the metadata member pk, and how many
// bytes of it are kept.
func (ps *partState) metadata(pk partKey) (*string, int) {
	switch pk {
	case partType:
		return &ps.typ, 64
	case partMediaType:
		return &ps.mediaType, 128
	}
	return &ps.format, 64
}

// addDetail records a detail member; an image may have two (in image_url
// and beside it). It is low detail only if every one says so, whatever
// their order.
func (ps *partState) addDetail(d string) {
	if d == "" {
		d = "auto"
	}
	if d != "low" || ps.detail == "" {
		ps.detail = d
	}
}

// readBlob reads a string value as a blob.
func (w *walker) readBlob(hint blobHint) (*blob, error) {
	b := &blob{hint: hint}
	err := w.j.str(func(p []byte) error {
		if room := maxBlob - len(b.raw); room > 0 {
			b.raw = append(b.raw, p[:min(room, len(p))]...)
		}
		b.size += int64(len(p))
		return nil
	})
	return b, err
}

// imageURL reads an OpenAI image_url: a URL string, or {"url","detail"}.
func (w *walker) imageURL(ps *partState) error {
	ps.imageSeen = true
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		ps.image, err = w.readBlob(blobImage)
		return err
	case '{':
		return w.j.object(func(key []byte) error {
			switch w.fold(key) {
			case "url":
				if ok, err := w.is('"'); !ok {
					return err
				}
				ps.image, err = w.readBlob(blobImage)
				return err
			case "detail":
				if ok, err := w.is('"'); !ok {
					return err
				}
				d, err := w.j.stringValue(16)
				ps.addDetail(d)
				return err
			}
			return w.content()
		})
	}
	return w.content()
}

// is reports whether the next value is of kind k (see jsonReader.kind); a
// value of another kind is counted as content, and ok is false.
func (w *walker) is(k byte) (ok bool, err error) {
	got, err := w.j.kind()
	if err != nil {
		return false, err
	}
	if got != k {
		return false, w.content()
	}
	return true, nil
}

// source reads an Anthropic source: {"type":"base64"|"text"|"url"|
// "content"|"file", "media_type", "data", "url", "content", "file_id"} of
// an image or document block, or a search result's source string. Its
// data is costed by finishPart, as what its block turns out to be.
func (w *walker) source(ps *partState) error {
	if ok, err := w.is('{'); !ok {
		return err
	}
	var s sourceRef
	err := w.j.object(func(key []byte) error {
		k, err := w.j.kind()
		if err != nil {
			return err
		}
		switch name := w.fold(key); {
		case name == "type" && k == '"':
			s.typ, err = w.j.stringValue(64)
			return err
		case name == "media_type" && k == '"':
			s.mediaType, err = w.j.stringValue(128)
			return err
		case name == "data" && k == '"' && s.typ == "text":
			return w.str() // text whatever its block: counted as it streams
		case name == "data" && k == '"':
			s.data, err = w.readBlob(blobFile)
			return err
		case (name == "url" || name == "file_id") && k == '"':
			s.remote = true
			return w.j.skip()
		}
		return w.content()
	})
	ps.sources = append(ps.sources, s)
	return err
}

// costSource costs an Anthropic source of a part whose members are all
// known, and reports whether it was an image.
func (w *walker) costSource(s sourceRef, ps *partState) (image bool, err error) {
	image = ps.typ == "image" || strings.HasPrefix(s.mediaType, "image/")
	switch {
	case s.data != nil && (s.typ == "text" || s.typ == "" && strings.HasPrefix(s.mediaType, "text/")):
		return false, w.m.valueBytes(s.data.raw)
	case s.data != nil:
		if image {
			s.data.hint = blobImage
		}
		return image, w.costBlob(s.data, s.mediaType, "", ps.detail, "")
	case s.remote && image:
		return true, w.m.add(w.imageTokens(imageRef{present: true, detail: ps.detail}))
	case s.remote:
		// A document the proxy cannot read (a URL, a stored file): at
		// least one page of it.
		return false, w.m.add(w.pricing().pdfPage())
	}
	return false, nil
}

// file reads an OpenAI chat file part: {"file_data","filename","file_id"}.
func (w *walker) file(ps *partState) error {
	if ok, err := w.is('{'); !ok {
		return err
	}
	var fs partState
	var data *blob
	stored := false
	err := w.j.object(func(key []byte) error {
		k, err := w.j.kind()
		if err != nil {
			return err
		}
		switch name := w.fold(key); {
		case name == "file_data" && k == '"':
			data, err = w.readBlob(blobFile)
			return err
		case name == "filename" && k == '"':
			fs.filename, err = w.countedString(256)
			return err
		case strings.HasSuffix(name, "_id") && k == '"':
			stored = true
			return w.j.skip()
		}
		return w.content()
	})
	if err != nil {
		return err
	}
	if data == nil {
		if stored { // a file stored at the provider: at least a page
			return w.m.add(w.pricing().pdfPage())
		}
		return nil
	}
	return w.costBlob(data, "", fs.filename, "", "")
}

// audio reads an OpenAI input_audio: {"data","format"}.
func (w *walker) audio() error {
	if ok, err := w.is('{'); !ok {
		return err
	}
	var data *blob
	format := ""
	err := w.j.object(func(key []byte) error {
		k, err := w.j.kind()
		if err != nil {
			return err
		}
		switch name := w.fold(key); {
		case name == "data" && k == '"':
			data, err = w.readBlob(blobAudio)
			return err
		case name == "format" && k == '"':
			format, err = w.j.stringValue(64)
			return err
		}
		return w.content()
	})
	if err != nil || data == nil {
		return err
	}
	return w.costBlob(data, "", "", "", format)
}

// images reads Ollama's images: an array of base64 images.
func (w *walker) images() error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	if k != '[' {
		return w.content()
	}
	return w.j.array(func(int) error {
		if ok, err := w.is('"'); !ok {
			return err
		}
		b, err := w.readBlob(blobImage)
		if err != nil {
			return err
		}
		return w.costBlob(b, "", "", "", "")
	})
}

// finishPart costs what a part carried, once all its members are known.
func (w *walker) finishPart(ps *partState) error {
	imageCosted := false
	for _, s := range ps.sources {
		image, err := w.costSource(s, ps)
		if err != nil {
			return err
		}
		imageCosted = imageCosted || image
	}
	switch {
	case ps.image != nil:
		if err := w.costBlob(ps.image, ps.mediaType, "", ps.detail, ""); err != nil {
			return err
		}
	case imageCosted:
	case ps.imageSeen || ps.typ == "input_image" || ps.typ == "image":
		// An image the proxy cannot see (a file id, a bare reference).
		if err := w.m.add(w.imageTokens(imageRef{present: true, detail: ps.detail})); err != nil {
			return err
		}
	}
	for _, f := range ps.files {
		if err := w.costBlob(f, ps.mediaType, ps.filename, ps.detail, ps.format); err != nil {
			return err
		}
	}
	if ps.result != nil {
		if ps.typ == "image_generation_call" { // a generated image, replayed: an image
			ps.result.hint = blobImage
			return w.costBlob(ps.result, "", "", "", "")
		}
		return w.m.valueBytes(ps.result.raw)
	}
	if ps.typ == "input_file" && len(ps.files) == 0 && ps.storedFile {
		return w.m.add(w.pricing().pdfPage()) // a file_id or file_url: at least a page
	}
	return nil
}

// imageTokens is an image's cost in the request's API.
func (w *walker) imageTokens(img imageRef) int { return w.pricing().image(img) }

func (w *walker) pricing() pricing {
	return pricing{model: w.model, anthropic: w.format == FormatMessages}
}

// pricing is how the request's API prices what is not text.
type pricing struct {
	model     string
	anthropic bool
}

// pdfPage is what one page of a document costs besides its text.
// Each page is also shown to the model as an image: priced as a
// 2048×2048 image at high detail for the request's model (765 on gpt-4o,
// 1600 on Claude).
func (p pricing) pdfPage() int {
	return imageCost(p.model, p.anthropic, imageRef{present: true, detail: "high", width: 2048, height: 2048})
}

func (p pricing) image(img imageRef) int { return imageCost(p.model, p.anthropic, img) }

// costBlob costs one blob: a data URL's media type, else mediaType, the
// filename's extension or the bytes themselves say what it is.
func (w *walker) costBlob(b *blob, mediaType, filename, detail, format string) error {
	if b.costd {
		return nil
	}
	b.costd = true
	payload, declared := bytes.TrimLeft(b.raw, " \t\r\n"), false
	isBase64 := true
	if len(payload) >= 5 && strings.EqualFold(string(payload[:5]), "data:") {
		// data:[<media type>][;param…][;base64],<data>, read as leniently
		// as any decoder reads it: any case, spaces, the flag anywhere.
		if meta, rest, ok := bytes.Cut(payload[5:], []byte(",")); ok {
			isBase64, declared = false, true
			for i, p := range strings.Split(string(meta), ";") {
				p = strings.TrimSpace(p)
				switch {
				case strings.EqualFold(p, "base64"):
					isBase64 = true
				case i == 0 && p != "":
					mediaType = p
				}
			}
			payload = rest
		}
	} else if hasURLScheme(payload) {
		// A remote URL, not fetched: an image costs the largest image at
		// its detail, a document a page (README).
		if b.hint == blobImage {
			return w.m.add(w.imageTokens(imageRef{present: true, detail: detail}))
		}
		if err := w.m.valueBytes(b.raw); err != nil {
			return err
		}
		return w.m.add(w.pricing().pdfPage())
	}
	var data []byte
	if isBase64 {
		var ok bool
		data, ok = decodeBase64(payload, declared || b.hint != blobFile)
		if !ok {
			if b.hint == blobImage {
				return w.m.add(w.imageTokens(imageRef{present: true, detail: detail}))
			}
			return w.m.valueBytes(b.raw) // not base64: what the model gets is this text
		}
	} else {
		u, err := url.PathUnescape(string(payload))
		if err != nil {
			u = string(payload)
		}
		data = []byte(u)
	}
	over := b.size - int64(len(b.raw)) // past maxBlob: not kept
	if over > 0 {
		if err := w.m.add(unreadableTokens(over)); err != nil {
			return err
		}
	}
	mediaType = strings.ToLower(strings.TrimSpace(mediaType))
	if mediaType == "" && filename != "" {
		mediaType = mime.TypeByExtension(strings.ToLower(path.Ext(filename)))
		if i := strings.IndexByte(mediaType, ';'); i >= 0 {
			mediaType = mediaType[:i]
		}
	}
	kind := fileKind(mediaType, data[:min(len(data), 512)])
	switch {
	case b.hint == blobImage:
		kind = "image"
	case b.hint == blobAudio:
		kind = "audio"
	case format != "" && kind == "binary":
		kind = "audio"
	}
	fi := fileInfo{mediaType: mediaType, format: format, detail: detail, filename: filename}
	switch {
	case b.hint == blobImage:
		fi.slot = "image"
	case b.hint == blobAudio || format != "":
		fi.slot = "audio"
	}
	return w.m.costFile(kind, data, fi, w.pricing())
}

// hasURLScheme reports whether s starts like an absolute URL (http:,
// https:, gs:, s3:, file: …) rather than base64 or text.
func hasURLScheme(s []byte) bool {
	i := bytes.IndexByte(s[:min(len(s), 16)], ':')
	if i <= 0 {
		return false
	}
	for _, c := range s[:i] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return len(s) > i+1 && s[i+1] == '/'
}

// decodeBase64 decodes standard or URL-safe base64, padded or not, with
// white space anywhere. lenient (the data is declared base64) also drops
// any other character, as Python's b64decode and Node's Buffer do by
// default; otherwise such a character means the string is not base64.
func decodeBase64(s []byte, lenient bool) ([]byte, bool) {
	// Cleaned a chunk at a time: the only allocation is the output.
	out := make([]byte, 0, base64.RawStdEncoding.DecodedLen(len(s)))
	var chunk [4096]byte
	n := 0
	decode := func() bool {
		m, err := base64.RawStdEncoding.Decode(out[len(out):cap(out)], chunk[:n])
		out, n = out[:len(out)+m], 0
		return err == nil
	}
	for _, c := range s {
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
		case c == '-':
			c = '+'
		case c == '_':
			c = '/'
		case c == '=', c == ' ', c == '\t', c == '\r', c == '\n':
			continue
		case !lenient:
			return nil, false
		default:
			continue
		}
		chunk[n] = c
		if n++; n == len(chunk) && !decode() {
			return nil, false
		}
	}
	if n%4 == 1 { // a lone trailing character holds no byte
		n--
	}
	if !decode() {
		return nil, false
	}
	return out, true
}
