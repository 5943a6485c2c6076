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
//     repetition the deadline bounds). Every other stream (page contents,
//     forms, ToUnicode CMaps) is decoded by this package, never by the
//     library's reader, through a meter: a page's streams may decode to
//     MaxDecompressed together.
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
// bytes one character each); pages beyond count in Result.Pages only.
//
// Streams are decoded as pdf.js, the reference reader, decodes them
// (decode.go, filters.go): their data runs to /Length when `endstream`
// follows, else to the next `endstream`; every filter pdf.js applies is
// applied, by full name or abbreviation, in chains of any length (Flate,
// with raw deflate when the zlib header is wrong; LZW with /EarlyChange;
// ASCII85; ASCIIHex; RunLength; Crypt and Identity, which pdf.js passes
// through; PNG and TIFF predictors); and the dictionary is read as pdf.js
// reads it (/F before /Filter, /DP before /DecodeParms): when that reading
// differs from the library's and the specification's, the stream is read
// both ways, as separate content.
//
// What cannot be decoded is never costed by its size alone, since a reader
// may decompress it: the bytes of a stream under a filter this package does
// not apply (Brotli, an unknown name, bad predictor parameters, an image
// codec on the content of a page the library reads), and the bytes after
// the damage of a damaged stream, count in Result.Unread as if they
// expanded maxExpansion (1032) times, taken from MaxDecompressed: past it,
// ErrBound. (A damaged stream's size counts too, and the text before the
// damage is read.) Result.Unread may therefore exceed the file's size. If
// the library fails on some object after text was written, the scan's cost
// is added: the cost never falls below what the scan finds.
//
// A file the library cannot read (a broken xref, garbage around it,
// truncation, encryption, a file the check refuses) is costed by the scan
// alone: the strings of the text-showing operators of every decoded stream
// (it knows no fonts: each string is read one character per byte, and
// through each of the file's ToUnicode CMaps, and the longest reading
// counts: at least as many tokens as the text they encode, in practice,
// even when a CMap maps a code to many characters), including
// streams named as page /Contents whatever their dictionary claims, plus
// what it cannot decode, priced as above; its pages are the /Type /Page
// dictionaries, or the page references of /Kids arrays if more. Input that
// is not a PDF at all is one page of len(data) unread bytes.
//
// # Encrypted files
//
// A file encrypted by the Standard security handler whose user password is
// empty opens in every reader without a password, so its text counts like
// any other file's (crypt.go): the file key is computed with the empty
// password as pdf.js computes it (RC4 of 40 to 128 bits, /V 1 and 2; /V 4
// with /CFM /V2 or /AESV2; /V 5, AES-256, /R 5 and 6), from the encryption
// dictionary and file id of every trailer and cross-reference stream of
// the file, and checked against /U; every stream, object streams included,
// is decrypted with its object's key before it is decoded, under the same
// budget. The scan reads such a file (the library's decryption is not
// used). A file whose user password is not empty cannot be
// read by the provider either: every stream of it counts its size in
// Result.Unread, as does every stream of a file that names an encryption
// this package does not know (another security handler, /V 3).
package pdf
