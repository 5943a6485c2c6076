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
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	zw.Write(content.Bytes())
	zw.Close()
	objs := []string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
		fmt.Sprintf("<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream", z.Len(), z.Bytes()),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
	}
	var out bytes.Buffer
	out.WriteString("%PDF-1.4\n")
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
