package tokens

import (
	"bytes"
	"compress/zlib"
	"errors"
	"io"
	"mime"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/audio"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/pdf"
)

// What a whole file costs, decided in one place (costFile): each format's
// reading — images (imagefile.go), PDFs (tokens/pdf), audio
// (tokens/audio) — plus the bytes it could not account for, as text.

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
