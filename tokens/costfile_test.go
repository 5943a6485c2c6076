package tokens_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// A file is costed at the higher of its readings: unless everything said
// of it names its format, its runs of text are a reading too.
func TestFileReadingsHigherCounts(t *testing.T) {
	prose := strings.Repeat("The committee approved the budget after a long debate about priorities. ", 1000)
	proseTokens := n(t, "gpt-4o", prose)

	// A PDF whose one page says "hi" and whose Info dictionary holds the
	// prose: a PDF to a PDF reader, prose to a text reader.
	pdf := fmt.Sprintf("%%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n"+
		"3 0 obj\n<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>\nendobj\n4 0 obj\n<< /Length 17 >>\nstream\nBT (hi) Tj ET    \nendstream\nendobj\n"+
		"5 0 obj\n<< /Title (%s) >>\nendobj\ntrailer\n<< /Root 1 0 R /Info 5 0 R >>\n%%%%EOF\n", prose)
	asPDF, ct := multipartFile(t, "report.pdf", "application/pdf", []byte(pdf))
	asText, ct2 := multipartFile(t, "notes.txt", "text/plain", []byte(pdf))
	pdfCost := estimateCT(t, tokens.FormatSeedChat, ct, asPDF)
	textCost := estimateCT(t, tokens.FormatSeedChat, ct2, asText)
	if textCost < proseTokens {
		t.Errorf("a PDF sent as notes.txt: %d tokens, its prose alone %d", textCost, proseTokens)
	}
	if pdfCost < proseTokens {
		// Strings the structure holds are text, whatever reads the file.
		t.Errorf("a PDF sent as a PDF: %d tokens, its Info prose %d", pdfCost, proseTokens)
	}

	// Prose with a NUL every 200 bytes is no text file and no known
	// format: it costs its runs of text, not the size rule's third.
	var b strings.Builder
	for i := 0; i < len(prose); i += 200 {
		b.WriteString(prose[i:min(i+200, len(prose))])
		b.WriteByte(0)
	}
	blob, ct3 := multipartFile(t, "data.bin", "application/octet-stream", []byte(b.String()))
	if got := estimateCT(t, tokens.FormatSeedChat, ct3, blob); got < proseTokens*9/10 {
		t.Errorf("prose with NULs uploaded: %d tokens, the prose %d", got, proseTokens)
	}
	// The same in a chat file part.
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"data.bin","file_data":"data:application/octet-stream;base64,` +
		base64.StdEncoding.EncodeToString([]byte(b.String())) + `"}}]}]}`
	if got := estimate(t, tokens.FormatChat, "application/json", body, -1).Tokens; got < proseTokens*9/10 {
		t.Errorf("prose with NULs in a file part: %d tokens, the prose %d", got, proseTokens)
	}
}

// Prose a PDF holds anywhere but its pages — a string in a dictionary, a
// comment, a stream no page shows, plain or compressed — costs its text
// even in a PDF sent as a PDF.
func TestPDFHiddenProseCosts(t *testing.T) {
	prose := strings.Repeat("Forward this memo to every regional office before the audit begins. ", 500)
	want := n(t, "gpt-4o", prose) * 9 / 10
	page := []string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>",
		testpdf.Stream("", []byte("BT (hi) Tj ET")),
	}
	cases := map[string][]byte{
		"info title":          testpdf.File(append(page, "<< /Title ("+prose+") >>")),
		"annotation contents": testpdf.File(append(page, "<< /Type /Annot /Contents <"+fmt.Sprintf("%x", prose)+"> >>")),
		"comment":             append([]byte("%PDF-1.7\n%"+prose+"\n"), testpdf.File(page)[len("%PDF-1.7\n"):]...),
		"unshown stream":      testpdf.File(append(page, testpdf.Stream("", []byte(prose)))),
		"unshown flate":       testpdf.File(append(page, testpdf.Stream("/Filter /FlateDecode", testpdf.Zlib([]byte(prose))))),
	}
	for name, pdf := range cases {
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` +
			base64.StdEncoding.EncodeToString(pdf) + `"}}]}]}`
		if got := estimate(t, tokens.FormatChat, "application/json", body, -1).Tokens; got < want {
			t.Errorf("%s: %d tokens, the prose %d", name, got, want)
		}
	}
	// The small form: a plain one-page PDF costs its page and its text.
	plain := testpdf.OnePage("Invoice 42")
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` +
		base64.StdEncoding.EncodeToString(plain) + `"}}]}]}`
	if got := estimate(t, tokens.FormatChat, "application/json", body, -1).Tokens; got > 765+30 {
		t.Errorf("a plain page: %d tokens", got)
	}
}
