// Package testpdf builds small PDFs for tests: the shape of the attack
// SPEC §4.6 names, a kilobyte or two of compressed PDF that shows tens of
// thousands of tokens of text.
package testpdf

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"strings"
)

// OnePage returns a one-page PDF whose Flate-compressed content stream
// shows text, a line per line of text, in Helvetica.
func OnePage(text string) []byte {
	var content bytes.Buffer
	content.WriteString("BT /F1 12 Tf 72 720 Td\n")
	esc := strings.NewReplacer(`\`, `\\`, "(", `\(`, ")", `\)`)
	for line := range strings.SplitSeq(text, "\n") {
		fmt.Fprintf(&content, "(%s) Tj T*\n", esc.Replace(line))
	}
	content.WriteString("ET\n")
	return File([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
		Stream("/Filter /FlateDecode", Zlib(content.Bytes())),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
	})
}

// File writes objs (the bodies of objects 1, 2, …, object 1 the catalog)
// as a PDF with a classic xref table.
func File(objs []string) []byte {
	var out bytes.Buffer
	out.WriteString("%PDF-1.7\n")
	offs := make([]int, len(objs))
	for i, o := range objs {
		offs[i] = out.Len()
		fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\n", i+1, o)
	}
	xref := out.Len()
	fmt.Fprintf(&out, "xref\n0 %d\n0000000000 65535 f \n", len(objs)+1)
	for _, off := range offs {
		fmt.Fprintf(&out, "%010d 00000 n \n", off)
	}
	fmt.Fprintf(&out, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(objs)+1, xref)
	return out.Bytes()
}

// Zlib compresses data.
func Zlib(data []byte) []byte {
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	zw.Write(data)
	zw.Close()
	return z.Bytes()
}

// Stream is the body of a stream object holding data, extra in its
// dictionary.
func Stream(extra string, data []byte) string {
	return fmt.Sprintf("<< /Length %d %s >>\nstream\n%s\nendstream", len(data), extra, data)
}

// ObjStmFonts is a one-page PDF whose page uses fonts fonts, all of them
// in one Flate object stream that also holds pad bytes of padding: a
// reader that decodes the object stream again for every object it takes
// from it does fonts times the work.
func ObjStmFonts(fonts, pad int) []byte {
	// 1 catalog, 2 pages, 3 page, 4 content, 5 object stream, fonts 6…
	var hdr, body, res, content bytes.Buffer
	for i := 0; i < fonts; i++ {
		fmt.Fprintf(&hdr, "%d %d ", 6+i, body.Len())
		body.WriteString("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>\n")
		fmt.Fprintf(&res, "/F%d %d 0 R ", i, 6+i)
		fmt.Fprintf(&content, "BT /F%d 9 Tf (x) Tj ET\n", i)
	}
	fmt.Fprintf(&hdr, "%d %d ", 6+fonts, body.Len())
	body.WriteString("(" + strings.Repeat("p", pad) + ")\n")
	stm := append(hdr.Bytes(), body.Bytes()...)
	return File([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /Resources << /Font << " + res.String() + ">> >> /Contents 4 0 R >>",
		Stream("/Filter /FlateDecode", Zlib(content.Bytes())),
		Stream(fmt.Sprintf("/Type /ObjStm /N %d /First %d /Filter /FlateDecode", fonts+1, hdr.Len()), Zlib(stm)),
	})
}

// ManyPages is a PDF of n empty pages sharing one content stream, the
// pages in one Flate object stream.
func ManyPages(n int) []byte {
	var hdr, body, kids bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&hdr, "%d %d ", 5+i, body.Len())
		body.WriteString("<< /Type /Page /Parent 2 0 R /Contents 3 0 R >>\n")
		fmt.Fprintf(&kids, "%d 0 R ", 5+i)
	}
	stm := append(hdr.Bytes(), body.Bytes()...)
	return File([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		fmt.Sprintf("<< /Type /Pages /Kids [%s] /Count %d >>", kids.String(), n),
		Stream("", []byte("BT ET")),
		Stream(fmt.Sprintf("/Type /ObjStm /N %d /First %d /Filter /FlateDecode", n, hdr.Len()), Zlib(stm)),
	})
}

// Inflating is a one-page PDF with an unused Flate stream of size zero
// bytes.
func Inflating(size int) []byte {
	return File([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>",
		Stream("", []byte("BT (hello) Tj ET")),
		Stream("/Filter /FlateDecode", Zlib(make([]byte, size))),
	})
}
