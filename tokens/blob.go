package tokens

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/audio"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/pdf"
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

// pdfLimits bound the reading of a PDF of n bytes: work in proportion to
// the file (measured in tokens/pdf's BenchmarkHostile: within 5 ms plus
// 25 ms a MiB of CPU, and 64 MiB of memory).
func pdfLimits(n int) pdf.Limits {
	return pdf.Limits{
		MaxDecoded: min(1<<20+8*int64(n), 48<<20),
		MaxSteps:   500_000 + 4*int64(n),
		MaxPages:   100,
	}
}

// fileInfo is what the members around a file say of it: its declared
// media type and file name, an audio format, an image's detail, and the
// kind of file its slot holds ("image" for an image_url, "audio" for an
// input_audio; "" for a slot of any file).
type fileInfo struct{ mediaType, format, detail, filename, slot string }

// names reports whether everything said of the file names kind: its slot,
// or its declared type with a file name that does not say otherwise. Such
// a file is read as kind upstream, and only as kind.
func (fi fileInfo) names(kind string) bool {
	if fi.slot != "" {
		return fi.slot == kind
	}
	byName := declaredKind(mime.TypeByExtension(strings.ToLower(path.Ext(fi.filename))))
	switch mt, _, _ := strings.Cut(strings.ToLower(fi.mediaType), ";"); strings.TrimSpace(mt) {
	case "", "application/octet-stream", "binary/octet-stream":
		// A type that says nothing: the name says the format.
		return byName == kind
	}
	return declaredKind(fi.mediaType) == kind && (fi.filename == "" || byName == kind)
}

// declaredKind is the kind of file a media type names ("" for any other).
func declaredKind(mediaType string) string {
	mediaType, _, _ = strings.Cut(strings.ToLower(mediaType), ";")
	switch {
	case strings.HasPrefix(mediaType, "image/"):
		return "image"
	case strings.HasPrefix(mediaType, "audio/"), strings.HasPrefix(mediaType, "video/"):
		return "audio"
	case mediaType == "application/pdf":
		return "pdf"
	}
	return ""
}

// costFile is the one place that decides what a file costs; kind is
// "text", "image", "pdf", "audio" or "binary" (see fileKind).
//
// A reader that recognises the format gives one reading: what the
// structure it checked costs (an image's size, a PDF's pages and page
// text, audio's duration) plus, as text, every byte it did not check. A
// file nobody reads (binary) costs the size rule. Unless everything said
// of the file names its format, an upstream may as well read it as text:
// then the runs of text in its bytes are a second reading, and the higher
// of the two counts. So a reader can only add: a file it cannot read, or
// bytes it cannot account for, are text.
func (m *meter) costFile(kind string, data []byte, fi fileInfo, p pricing) error {
	if kind == "text" {
		return m.valueBytes(data)
	}
	read := func(m *meter) error {
		switch kind {
		case "image":
			return m.costImage(data, fi.detail, p)
		case "pdf":
			return m.costPDF(data, p)
		case "audio":
			return m.costAudio(data)
		}
		return m.add(unreadableTokens(int64(len(data))))
	}
	if fi.names(kind) {
		return read(m)
	}
	return m.higher(read, func(m *meter) error { return textRuns(data, m.valueBytes) })
}

// costImage adds what an image file costs: its price by its size for the
// request's model (the largest image's when no walk checks out), and, as
// text, every byte the walk did not check, and the free text and pixel
// data inside it that are text.
func (m *meter) costImage(data []byte, detail string, p pricing) error {
	l, ok := readImage(data)
	img := imageRef{present: true, detail: detail}
	if ok {
		img.width, img.height = l.width, l.height
	}
	if err := m.add(p.image(img)); err != nil {
		return err
	}
	for _, s := range append(l.text, l.data...) {
		if err := textRuns(data[s.from:s.to], m.valueBytes); err != nil {
			return err
		}
	}
	for _, s := range l.packed {
		if err := m.inflatedRuns(data[s.from:s.to]); err != nil {
			return err
		}
	}
	return m.valueBytes(data[l.end:])
}

// inflatedRuns costs the text runs of a zlib stream's output, read a
// piece at a time; each piece draws on the work budget.
func (m *meter) inflatedRuns(z []byte) error {
	zr, err := zlib.NewReader(bytes.NewReader(z))
	if err != nil {
		return nil // not zlib: its bytes were costed as they are
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := io.ReadFull(zr, buf)
		if werr := m.work.draw(int64(n>>10)+1, LimitedImage); werr != nil {
			return werr
		}
		if rerr := textRuns(buf[:n], m.valueBytes); rerr != nil {
			return rerr
		}
		if err != nil {
			return nil // its end, or damage: what came before counted
		}
	}
}

// minTextRun is the shortest run of text textRuns hands on. In random
// bytes a run this long of text characters almost never comes (a 4 MB PNG
// of noise has none); it is applied only inside a checked structure, to
// what a format carries beside its pixels (comments, text chunks) and to
// the pixel data, none of which the model is shown as text.
const minTextRun = 32

// textRuns hands sink every run of at least minTextRun bytes of b that
// reads as text (UTF-8 without control characters but white space): the
// text a reader of b as text would see, however the runs are separated.
func textRuns(b []byte, sink func([]byte) error) error {
	start := 0
	for i := 0; i < len(b); {
		c := b[i]
		if textByte[c] { // printable ASCII, tab, newline, carriage return
			i++
			continue
		}
		size := 1
		if c >= 0xC2 && c <= 0xF4 { // a lead byte: the only ones worth decoding
			var r rune
			r, size = utf8.DecodeRune(b[i:])
			if r != utf8.RuneError && r >= 0xA0 {
				i += size
				continue
			}
		}
		if i-start >= minTextRun {
			if err := sink(b[start:i]); err != nil {
				return err
			}
		}
		i += size
		start = i
	}
	if len(b)-start >= minTextRun {
		return sink(b[start:])
	}
	return nil
}

// textByte marks the ASCII bytes that are text.
var textByte = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = true
	}
	t['\t'], t['\n'], t['\r'] = true, true, true
	return t
}()

// costPDF adds a PDF's text (what its pages show, and every byte the
// reader could not account for, as it is) and its pages. A PDF past the
// reading bounds costs what 48 MiB cost by the size rule: more than any
// sane cap.
func (m *meter) costPDF(data []byte, p pricing) error {
	lim := pdfLimits(len(data))
	// The file's own bound, and no more than the request has left (a PDF
	// step is about a hundredth of a budget step).
	lim.MaxSteps = min(lim.MaxSteps, m.work.steps()*pdfStepsPerStep)
	// A stream no page shows costs the text runs it holds.
	opaque := func(b []byte) error {
		if err := m.endText(); err != nil {
			return err
		}
		return textRuns(b, m.valueBytes)
	}
	res, err := pdf.ReadWith(data, lim, m.text, opaque)
	if err == nil {
		err = m.work.draw(res.Steps/pdfStepsPerStep, LimitedPDF)
	}
	if errors.Is(err, pdf.ErrBound) {
		return m.work.exhaust(LimitedPDF)
	}
	if err != nil {
		return err
	}
	if err := m.endText(); err != nil {
		return err
	}
	return m.add(res.Pages * p.pdfPage())
}

// costAudio adds an audio file's cost: its duration at the audio rate,
// the bytes the reader did not account for as text, and the samples of
// uncompressed audio at the higher of their two readings, sound and text.
// A file past the reading bound costs more than any sane cap.
func (m *meter) costAudio(data []byte) error {
	res, err := audio.Measure(data, audio.Limits{MaxSteps: int64(len(data))}, m.text)
	if errors.Is(err, audio.ErrBound) {
		return m.work.exhaust(LimitedAudio)
	}
	if err != nil {
		return err
	}
	if err := m.endText(); err != nil {
		return err
	}
	if err := m.add(audio.Tokens(res.Duration)); err != nil {
		return err
	}
	// Samples are any bytes: they cost the higher of their sound and of
	// the text they hold (runs of text, as inside an image).
	pcm := &meter{c: m.c, limit: m.budget(), work: m.work}
	if err := textRuns(res.PCM, pcm.valueBytes); err != nil && !errors.Is(err, errStop) {
		return err
	}
	return m.add(max(pcm.total, audio.Tokens(res.PCMDuration)))
}
