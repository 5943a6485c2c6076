package pdf

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// seedPDFs are the tests' PDFs, for the fuzz target.
func seedPDFs() [][]byte {
	var seeds [][]byte
	d := newDoc()
	d.textPage("BT /F1 12 Tf 72 720 Td (Hello) Tj [(Wor) -20 (ld) -500 (again)] TJ 0 -14 Td (next) ' ET", false)
	seeds = append(seeds, d.bytes())
	d = newDoc()
	p1 := d.textPage(show("packed first page"), true)
	tu := d.flate("", []byte("1 begincodespacerange <00> <FF> endcodespacerange 1 beginbfchar <41> <0042> endbfchar 1 beginbfrange <61> <63> <0078> endbfrange"))
	f := d.add(fmt.Sprintf("<< /Type /Font /Subtype /Type1 /ToUnicode %d 0 R >>", tu))
	form := d.flate("/Subtype /Form", []byte("BT /F2 9 Tf (Aabc) Tj ET BI /W 1 /H 1 ID x EI"))
	d.textPage("/Fm Do", true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R /F2 %d 0 R >> /XObject << /Fm %d 0 R >> >>", d.font, f, form))
	d.pack(d.catalog, d.pages, d.font, p1, f)
	seeds = append(seeds, d.xrefStream(d.catalog), []byte("not a pdf"), []byte("%PDF-1.4\n1 0 obj (x) endobj\n"))
	small, tiny := attackContent(2 << 10)
	_ = tiny
	short, _ := attackContent(512)
	for _, data := range filterCasesOf(small, short) {
		seeds = append(seeds, data)
	}
	for _, m := range []map[string][]byte{hostileCases(), bombCases()} {
		for _, data := range m {
			if len(data) < 64<<10 {
				seeds = append(seeds, data)
			}
		}
	}
	return seeds
}

// checkRead reads data under small limits and checks what must hold of
// any input: no panic, no error but ErrBound, the budget respected (within
// one token or decoder chunk), and the accounting: the bytes handed over
// as they are are exactly those no checked structure covers.
func checkRead(t *testing.T, data []byte) {
	lim := Limits{MaxDecoded: 1 << 20, MaxSteps: 200_000 + 4*int64(len(data)), MaxPages: 10}
	var got int64
	r := newReader(data, lim, func(p []byte) error { got += int64(len(p)); return nil })
	res, err := r.result(r.run())
	if err != nil {
		if err != ErrBound {
			t.Fatalf("err %v", err)
		}
		return
	}
	if r.b.steps < -1<<20 || r.b.bytes < -1<<20 {
		t.Fatalf("budget overrun: %d steps, %d bytes", r.b.steps, r.b.bytes)
	}
	if res.Pages < 1 {
		t.Fatalf("result %+v", res)
	}
	if len(r.objs) == 0 {
		if r.out.rawN != int64(len(data)) {
			t.Fatalf("not a PDF: %d of %d bytes costed as text", r.out.rawN, len(data))
		}
		return
	}
	var uncovered int64
	for _, c := range append([]*coverage{&r.file}, r.decodedCov...) {
		for _, g := range c.gaps() {
			uncovered += int64(len(g))
		}
	}
	if r.out.rawN < uncovered {
		t.Fatalf("%d bytes uncovered, %d costed as text", uncovered, r.out.rawN)
	}
}

func FuzzRead(f *testing.F) {
	for _, s := range seedPDFs() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkRead(t, data) })
}

// The accounting as a property, over random files and random damage to
// real ones: a text inserted anywhere outside a comment or a string is
// read, and random bytes without an object are all text.
func TestAccountingProperty(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	seeds := seedPDFs()
	const marker = "ZQXJ marker words"
	for i := 0; i < 300; i++ {
		junk := make([]byte, rng.Intn(4000))
		rng.Read(junk)
		checkRead(t, junk)
		s := seeds[rng.Intn(len(seeds))]
		checkRead(t, s)
		// Damage: flip, cut or insert bytes.
		m := bytes.Clone(s)
		for k := rng.Intn(8); k >= 0 && len(m) > 0; k-- {
			m[rng.Intn(len(m))] = byte(rng.Intn(256))
		}
		checkRead(t, m)
		checkRead(t, s[:rng.Intn(len(s)+1)])
		// A marker between two objects is text.
		ends := indexAll(s, []byte("endobj\n"))
		if len(ends) == 0 {
			continue
		}
		at := ends[rng.Intn(len(ends))] + len("endobj\n")
		in := append(append(append([]byte(nil), s[:at]...), marker+"\n"...), s[at:]...)
		var text strings.Builder
		if _, err := Read(in, testLimits, func(p []byte) error { text.Write(p); return nil }); err == nil && !strings.Contains(text.String(), marker) {
			t.Fatalf("marker at %d not read", at)
		}
	}
}

func indexAll(s, sep []byte) []int {
	var out []int
	for i := 0; ; {
		k := bytes.Index(s[i:], sep)
		if k < 0 {
			return out
		}
		out = append(out, i+k)
		i += k + 1
	}
}
