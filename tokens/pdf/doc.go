// Package pdf reads a PDF's text for costing, with its own small reader,
// under a work budget, and accounts for every byte of the file.
//
// # What it reads
//
// The file is scanned once, start to end: every `N G obj … endobj` is an
// object (a later definition of a number wins, as in an incremental
// update); cross-reference tables and streams are read as structure, never
// trusted to say where objects are. A stream's data runs to /Length when
// `endstream` follows it, else to the next `endstream`. Object streams are
// decoded once and their objects parsed once, however many references
// they have. Filters: Flate (zlib, or raw deflate), LZW (with
// /EarlyChange), ASCII85, ASCIIHex, RunLength, PNG and TIFF predictors, in
// chains of up to eight; /F and /DP (pdf.js's reading) beside /Filter and
// /DecodeParms, both readings when they differ. Image codecs (DCT, JPX,
// JBIG2, CCITT) are not decoded: such data is an image. Encrypted files are
// not decrypted.
//
// Every /Type /Page object is a page (Result.Pages). The first MaxPages are
// read in file order: their content streams are interpreted for the
// strings Tj, TJ, ' and " show, each decoded through the font's ToUnicode
// CMap, else its simple encoding (WinAnsi, MacRoman, Standard, with
// /Differences by glyph name), else one character a byte (so an Identity-H
// font without a CMap shows its bytes). Form XObjects are interpreted once
// each (nesting bounded, cycles cut); their text counts every time they
// are shown.
//
// # What it accounts for
//
// The reader covers what it checked: the objects it parsed, white space and
// comments, cross-reference sections and trailers, the data of streams it
// decoded whole or recognised as image data (a JPEG by its signature). One
// coverage map per buffer (the file, each decoded object stream) records
// it; at the end every byte it does not cover goes to the sink as it is —
// garbage between objects, objects that do not parse, streams under an
// unknown filter, damaged (their text before the damage counts too) or
// encrypted — for the caller to cost as text. A file without a single
// object is all text. So the reader can only add to what the bytes cost.
//
// # The budget
//
// Read starts no goroutine and reads no clock. Every lexer token, object,
// content operator and decoded byte is drawn from Limits.MaxSteps (a step
// is about a nanosecond or a few), and every decoded byte, parsed value and
// kept form text from Limits.MaxDecoded, which therefore bounds the memory
// held. No allocation is sized by a number read from the file. Past either
// bound Read returns ErrBound: the caller refuses the PDF as over its cap.
package pdf
