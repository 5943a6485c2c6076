// Package pdf reads the text of a PDF under hard bounds, so that a proxy can
// cost a PDF by the text a model will read from it.
//
// # The library
//
// Parsing is done by github.com/ledongthuc/pdf (BSD-3-Clause), the
// maintained fork of rsc.io/pdf. It was chosen over
//
//   - rsc.io/pdf: the original, unmaintained since 2014; its lexer recurses
//     without a depth limit (a stack overflow is fatal in Go, recover cannot
//     catch it);
//   - github.com/dslipak/pdf: a stale fork of the same code, without the
//     depth limit or the later fixes;
//   - github.com/pdfcpu/pdfcpu (Apache-2.0): a large processing toolkit
//     with no text extraction (it dumps content streams; it does not decode
//     their strings through fonts), which reads a whole file eagerly.
//
// ledongthuc/pdf reads text well for its size (simple-font encodings with
// the Adobe glyph list, ToUnicode CMaps, xref and object streams), and it is
// the easiest to bound: a few thousand lines that can be audited in full, it
// reads the file only through an io.ReaderAt, lazily, one object at a time,
// and exposes its object model (Value) and font encodings, so this package
// drives it instead of calling its whole-document helpers.
//
// # The bounds
//
// Read starts no goroutine: every piece of work checks one budget (bytes
// decoded, wall time) as it goes, so the work itself is bounded and stops
// within about one decoder chunk, or one object, of the deadline.
//
//  1. The scan (scan.go) finds every stream in the raw bytes and decodes
//     each one that could hold text with this package's own decoders, every
//     byte of every filter step charged to MaxDecompressed. A bomb anywhere
//     (page content, object stream, an object nothing uses) returns ErrBound
//     before the library is called. Images, font programs and metadata are
//     not decoded: no text is read from them.
//  2. The structure check (check.go) replays, with a mirror of the library's
//     lexer (lex.go, checked against the library by FuzzLexAgreement), what
//     the library does on its own when it opens a file and resolves
//     objects: the xref tables and streams, the object streams. It refuses
//     the library every file on which the library would allocate by an
//     attacker's number (an xref /Size or subsection start, a predictor's
//     /Columns: out of memory is fatal), build an object too large in
//     memory (a 10 MB array), loop without reading (/W [0 0 0],
//     an object stream's /N, a hex string open at its end), recurse without
//     bound (an object stream inside an object stream, or whose /N is inside
//     one: stack overflow is fatal), follow a /Prev cycle, decrypt, or read
//     another object than other readers would (hybrid xref, duplicate ids in
//     an object stream). Those files go to the scan's fallback.
//  3. The library reads through an io.ReaderAt that checks the deadline on
//     every read; it keeps no cache, so every object it resolves is a read.
//     The only streams it decodes on its own are those the check has already
//     decoded under the budget (xref and object streams; the library decodes
//     an object stream again for every object it takes from it, a
//     repetition the deadline bounds). Every other stream
//     is decoded on this package's request, after its filters are checked
//     (at most one Flate step, bounded predictor rows), through a meter: a
//     page's streams may decode to MaxDecompressed together.
//  4. This package walks the page tree itself (each Pages node once, /Parent
//     never followed, depth bounded), interprets content streams itself
//     (content.go: a bounded operand stack, inline images skipped, form
//     XObjects entered to a bounded depth, each cycle cut, each form without
//     text run once) and reads ToUnicode CMaps itself (cmap.go), instead of
//     the library's PostScript interpreter, whose stack grows with its input.
//
// # What a PDF costs
//
// Text is handed to the sink as UTF-8, in page order. The library path reads
// the first MaxPages pages through their fonts (ToUnicode CMaps, standard and
// /Differences encodings, UCS-2 CMaps; a font it cannot decode shows its
// bytes one character each); pages beyond count in Result.Pages only. A
// stream whose filters the library cannot decode (LZW, two Flate steps, …)
// counts its encoded size in Result.Unread. If the library fails on some
// object after text was written, the scan's cost is added: the cost never
// falls below what the scan finds.
//
// A file the library cannot read (a broken xref, garbage around it,
// truncation, encryption, a file the check refuses) is costed by the scan
// alone: the strings of the text-showing operators of every decoded stream
// (one character per byte when there is no font to read them with: at
// least as many tokens as the text they encode, in practice), including
// streams named as page /Contents whatever their dictionary claims, plus
// the encoded size of every stream it cannot decode (and of every stream of
// an encrypted file, and of a damaged one) in Result.Unread; its pages are
// the /Type /Page dictionaries, or the page references of /Kids arrays if
// more. Input that is not a PDF at all is one page of len(data) unread
// bytes.
package pdf
