package pdf

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	lib "github.com/ledongthuc/pdf"
)

// seedPDFs are the tests' PDFs, for the fuzz targets and benchmarks.
func seedPDFs() [][]byte {
	var seeds [][]byte
	d := newDoc()
	d.textPage("BT /F1 12 Tf 72 720 Td (Hello) Tj [(Wor) -20 (ld) -500 (again)] TJ 0 -14 Td (next) ' ET", false)
	seeds = append(seeds, d.bytes())

	d = newDoc()
	d.textPage(show("alpha page one", "beta"), true)
	d.textPage(show("gamma page two"), true)
	seeds = append(seeds, d.bytes())

	d = newDoc()
	p1 := d.textPage(show("packed first page"), true)
	tu := d.flate("", []byte("1 begincodespacerange <00> <FF> endcodespacerange 1 beginbfchar <41> <0042> endbfchar 1 beginbfrange <61> <63> <0078> endbfrange"))
	f := d.add(fmt.Sprintf("<< /Type /Font /Subtype /Type1 /ToUnicode %d 0 R >>", tu))
	form := d.flate("/Subtype /Form", []byte("BT /F2 9 Tf (Aabc) Tj ET BI /W 1 /H 1 ID x EI"))
	d.textPage("/Fm Do", true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R /F2 %d 0 R >> /XObject << /Fm %d 0 R >> >>", d.font, f, form))
	d.pack(d.catalog, d.pages, d.font, p1, f)
	seeds = append(seeds, d.xrefStream(d.catalog))

	content, _ := attackContent(4 << 10)
	d = newDoc()
	d.textPage(content, true)
	seeds = append(seeds, d.bytes())

	seeds = append(seeds, []byte("not a pdf"), []byte("%PDF-1.4\n1 0 obj (x) endobj\n"))
	for _, data := range hostileCases() {
		if len(data) < 64<<10 {
			seeds = append(seeds, data)
		}
	}
	for _, data := range bombCases() {
		if len(data) < 64<<10 {
			seeds = append(seeds, data)
		}
	}
	// Every filter chain, and every encryption, over a small text.
	small, _ := attackContent(2 << 10)
	tiny, _ := attackContent(512)
	for _, data := range filterCasesOf(small, tiny) {
		seeds = append(seeds, data)
	}
	for _, k := range encKinds {
		for _, packed := range []bool{false, true} {
			seeds = append(seeds, encryptedPDF(k, small, packed))
		}
	}
	return seeds
}

var errFuzzSink = errors.New("fuzz sink")

func FuzzRead(f *testing.F) {
	for _, s := range seedPDFs() {
		f.Add(s)
	}
	lim := Limits{MaxDecompressed: 1 << 20, Timeout: 100 * time.Millisecond, MaxPages: 10}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Without Read's recover, so that a panic of this package shows.
		start := time.Now()
		var text int
		l := lim.withDefaults()
		b := newBudget(l, start)
		out := &textOut{sink: func(p []byte) error {
			text += len(p)
			return nil
		}}
		res, how, err := finish(data, l, b, out)
		took := time.Since(start)
		if err != nil && !errors.Is(err, ErrBound) {
			t.Fatalf("error %v", err)
		}
		// Unread is at most the file's size and the estimates of what
		// could not be decoded, taken from the budget.
		if err == nil && (res.Pages < 1 || res.Unread < 0 || res.Unread > int64(len(data))+l.MaxDecompressed) {
			t.Fatalf("result %+v for %d bytes", res, len(data))
		}
		if err == nil && how != viaLibrary && text == 0 && res.Unread == 0 && len(data) > 0 {
			t.Fatalf("costed as nothing: %+v", res)
		}
		// Generous: fuzzing workers share the CPU.
		if took > lim.Timeout+time.Second {
			t.Fatalf("took %v", took)
		}

		// A sink that refuses at once stops Read with its error.
		calls := 0
		_, err = Read(data, lim, func([]byte) error {
			calls++
			return errFuzzSink
		})
		if calls > 1 || calls == 1 && !errors.Is(err, errFuzzSink) {
			t.Fatalf("sink called %d times, error %v", calls, err)
		}
		if calls == 0 && err != nil && !errors.Is(err, ErrBound) {
			t.Fatalf("error %v", err)
		}
	})
}

// FuzzReadParts fuzzes the pieces of a well-formed file, so that the
// library path (not only the scan) meets arbitrary objects: a content
// stream, and an object used as the page's font, form XObject and
// resources, stored plainly or in an object stream.
func FuzzReadParts(f *testing.F) {
	f.Add([]byte("BT /F2 12 Tf (Hello) Tj /X Do ET"), []byte("<< /Type /Font /Encoding << /Differences [65 /B] >> >>"), false)
	f.Add([]byte("/X Do [(a) -300 (b)] TJ"), []byte(streamBody("/Subtype /Form", []byte("/X Do (f) Tj"))), false)
	f.Add([]byte("BT /F2 1 Tf <0102> Tj ET"), []byte("<< /ToUnicode 4 0 R /Encoding /Identity-H >>"), true)
	f.Add([]byte("BI /W 1 ID \x00 EI (x) '"), []byte("[1 0 R 2 0 R 3 0 R]"), true)
	lim := Limits{MaxDecompressed: 1 << 20, Timeout: 100 * time.Millisecond, MaxPages: 10}
	f.Fuzz(func(t *testing.T, content, obj []byte, packed bool) {
		d := newDoc()
		x := d.add(string(obj))
		c := d.flate("", content)
		p := d.add(fmt.Sprintf("<< /Type /Page /Parent %d 0 R /Contents %d 0 R /Resources << /Font << /F1 %d 0 R /F2 %d 0 R >> /XObject << /X %d 0 R >> >> >>", d.pages, c, d.font, x, x))
		d.kids = append(d.kids, p)
		d.finish("")
		var data []byte
		if packed {
			d.pack(d.catalog, d.pages, d.font, p)
			if !bytes.Contains(obj, []byte("stream")) {
				d.pack(x)
			}
			data = d.xrefStream(d.catalog)
		} else {
			data = d.table(d.catalog, "")
		}
		start := time.Now()
		l := lim.withDefaults()
		b := newBudget(l, start)
		out := &textOut{sink: func([]byte) error { return nil }}
		res, _, err := finish(data, l, b, out)
		if err != nil && !errors.Is(err, ErrBound) {
			t.Fatalf("error %v", err)
		}
		if err == nil && (res.Pages < 1 || res.Unread < 0 || res.Unread > int64(len(data))+l.MaxDecompressed) {
			t.Fatalf("result %+v", res)
		}
		if took := time.Since(start); took > lim.Timeout+time.Second {
			t.Fatalf("took %v", took)
		}
	})
}

// FuzzLexAgreement checks the mirror lexer (lex.go) against the library:
// wherever the library reads an object, the mirror must read the same one.
// The structure check relies on it.
func FuzzLexAgreement(f *testing.F) {
	for _, s := range []string{
		"<< /Type /ObjStm /N 3 /First 12 /Filter [/FlateDecode] /DecodeParms [<< /Predictor 12 /Columns 5 >>] >>",
		"[1 2.5 -3 +4 .5 (a\\(b\\)c\\101\\n) <48 65 6C> /N#41me true false null 7 0 R]",
		"<< /A << /B [ [ ] ] >> /C (nested (parens)) /D 12 >>",
		"<< /Length 3 >> stream\nabc\nendstream",
		"<< /K >> >> /X 1 >>",
		"[ 1 2 ] ] % comment\n",
		"(unbalanced \\",
		"<< /Size 9999999999999999999 >>",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		var buf bytes.Buffer
		buf.WriteString("%PDF-1.4\n%" + string(bytes.Repeat([]byte{'.'}, 100)) + "\n")
		off := buf.Len()
		buf.WriteString("1 0 obj\n")
		buf.Write(obj)
		buf.WriteString("\nendobj\n")
		x := buf.Len()
		fmt.Fprintf(&buf, "xref\n0 2\n0000000000 65535 f \n%010d 00000 n \ntrailer\n<< /Size 2 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", off, x)
		data := buf.Bytes()

		mine, myErr := parse(func() any {
			def, ok := newLexer(data, off).readObject().(objdef)
			if !ok || def.ref != (objref{1, 0}) {
				panic(lexFail{})
			}
			return def.obj
		})
		r, err := lib.NewReader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return // obj broke the file around it
		}
		var theirs lib.Value
		libOK := func() (ok bool) {
			defer func() {
				if recover() != nil {
					ok = false
				}
			}()
			theirs = r.Trailer().Key("Root")
			return true
		}()
		if !libOK {
			return
		}
		if myErr != nil {
			t.Fatalf("the library reads %q as %v; the mirror fails", obj, theirs)
		}
		if !sameValue(mine, theirs, 0) {
			t.Fatalf("%q: mirror %#v, library %v", obj, mine, theirs)
		}
	})
}

// sameValue compares a mirror object with a library Value.
func sameValue(mine any, v lib.Value, depth int) bool {
	if depth > 50 {
		return true
	}
	switch m := mine.(type) {
	case nil:
		return v.Kind() == lib.Null
	case objref:
		return true // the library resolves it; nothing to compare
	case bool:
		return v.Kind() == lib.Bool && v.Bool() == m
	case int64:
		return v.Kind() == lib.Integer && v.Int64() == m
	case float64:
		return v.Kind() == lib.Real && (v.Float64() == m || m != m)
	case string:
		return v.Kind() == lib.String && v.RawString() == m
	case pdfName:
		return v.Kind() == lib.Name && v.Name() == string(m)
	case keyword, eofToken:
		return false
	case array:
		if v.Kind() != lib.Array || v.Len() != len(m) {
			return false
		}
		for i, e := range m {
			if !sameValue(e, v.Index(i), depth+1) {
				return false
			}
		}
		return true
	case dict:
		if v.Kind() != lib.Dict {
			return false
		}
		return sameDict(m, v, depth)
	case streamObj:
		if v.Kind() != lib.Stream {
			return false
		}
		want := fmt.Sprintf("@%d", m.offset)
		s := v.String()
		return sameDict(m.hdr, v, depth) && len(s) >= len(want) && s[len(s)-len(want):] == want
	}
	return false
}

func sameDict(m dict, v lib.Value, depth int) bool {
	keys := v.Keys()
	var mk []string
	for k := range m {
		mk = append(mk, string(k))
	}
	if len(keys) != len(mk) {
		return false
	}
	for _, k := range keys {
		e, ok := m[pdfName(k)]
		if !ok || !sameValue(e, v.Key(k), depth+1) {
			return false
		}
	}
	return true
}
