package pdf_test

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/pdf"
)

// A one-page PDF showing "Hello, world" (built here so that the example is
// self-contained).
func helloPDF() []byte {
	var z bytes.Buffer
	w := zlib.NewWriter(&z)
	w.Write([]byte("BT /F1 12 Tf 72 720 Td (Hello, world) Tj ET"))
	w.Close()
	objs := []string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
		fmt.Sprintf("<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream", z.Len(), z.Bytes()),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
	}
	var b bytes.Buffer
	b.WriteString("%PDF-1.4\n")
	var offs []int
	for i, o := range objs {
		offs = append(offs, b.Len())
		fmt.Fprintf(&b, "%d 0 obj\n%s\nendobj\n", i+1, o)
	}
	x := b.Len()
	fmt.Fprintf(&b, "xref\n0 %d\n0000000000 65535 f \n", len(objs)+1)
	for _, off := range offs {
		fmt.Fprintf(&b, "%010d 00000 n \n", off)
	}
	fmt.Fprintf(&b, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(objs)+1, x)
	return b.Bytes()
}

func ExampleRead() {
	data := helloPDF()
	// Limits proportional to the file: work grows linearly with it.
	lim := pdf.Limits{MaxDecoded: 1<<20 + 8*int64(len(data)), MaxSteps: 500_000 + 4*int64(len(data)), MaxPages: 100}
	var text bytes.Buffer
	res, err := pdf.Read(data, lim, func(p []byte) error {
		text.Write(p) // a token counter would count here, and stop past its cap
		return nil
	})
	switch {
	case errors.Is(err, pdf.ErrBound):
		fmt.Println("over the bounds: over any cap")
	case err != nil:
		fmt.Println("the sink stopped reading:", err)
	default:
		fmt.Printf("%d page: %q\n", res.Pages, text.String())
	}
	// Output: 1 page: "Hello, world"
}
