package pdf

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Bombs and hostile structures: Read stays within its bounds.

func bombCases() map[string][]byte {
	single := bombZlib(1 << 30)
	nested := zlibBytes(single)
	cases := map[string][]byte{}

	d := newDoc()
	c := d.stream("/Filter [/FlateDecode /FlateDecode]", nested)
	d.page(c)
	cases["nested page content"] = d.bytes()

	d = newDoc()
	d.textPage(show("innocent"), true)
	d.stream("/Filter [/FlateDecode /FlateDecode]", nested) // referenced by nothing
	cases["unused object"] = d.bytes()

	d = newDoc()
	d.textPage(show("innocent"), true)
	d.stream("/Filter /FlateDecode", single)
	cases["single-layer unused object"] = d.bytes()

	// An object stream that bombs: the catalog lives in it.
	d = newDoc()
	d.textPage(show("innocent"), true)
	d.finish("")
	data := d.xrefStream(d.catalog)
	stm := fmt.Sprintf("%d 0 obj\n%s\nendobj\n", 99, streamBody("/Type /ObjStm /N 1 /First 4 /Filter [/FlateDecode /FlateDecode]", nested))
	cases["object stream"] = append([]byte(stm), data...)

	// A bomb with no dictionary the scan can read.
	d = newDoc()
	d.textPage(show("innocent"), true)
	d.add("<< /Length 5 0 R /Filter 7 0 R ( >> stream\n" + string(single) + "\nendstream")
	cases["unreadable dictionary"] = d.bytes()
	return cases
}

func TestDecompressionBombs(t *testing.T) {
	for name, data := range bombCases() {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			o := readAllText(t, data, testLimits)
			runtime.ReadMemStats(&after)
			if !errors.Is(o.err, ErrBound) {
				t.Errorf("err %v, want ErrBound (result %+v)", o.err, o.res)
			}
			// The best of three runs: other processes share the CPU.
			for i := 0; i < 2 && o.took > 500*time.Millisecond; i++ {
				o.took = min(o.took, readAllText(t, data, testLimits).took)
			}
			if o.took > 500*time.Millisecond {
				t.Errorf("took %v", o.took)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Errorf("allocated %d MiB", alloc>>20)
			}
			t.Logf("%d-byte file: %v in %v", len(data), o.err, o.took)
		})
	}
}

// Structures that make a reader loop or recurse must end within the
// deadline, with nil or ErrBound.

func hostileCases() map[string][]byte {
	cases := map[string][]byte{}
	const pad = "%" + "................................................................................................\n"
	plain := func(f func(d *doc)) []byte {
		d := newDoc()
		f(d)
		return d.bytes()
	}
	cases["page tree cycle"] = plain(func(d *doc) {
		d.textPage(show("one"), false)
		d.kids = append(d.kids, d.pages) // the root is its own kid
	})
	cases["parent loop"] = func() []byte {
		d := newDoc()
		n := d.reserve()
		m := d.reserve()
		d.set(n, fmt.Sprintf("<< /Type /Pages /Kids [%d 0 R] /Parent %d 0 R /Count 1 >>", m, m))
		d.set(m, fmt.Sprintf("<< /Type /Pages /Kids [%d 0 R] /Parent %d 0 R /Count 1 >>", n, n))
		d.kids = append(d.kids, n)
		return d.bytes()
	}()
	cases["self reference"] = plain(func(d *doc) {
		r := d.reserve()
		d.set(r, fmt.Sprintf("%d 0 R", r))
		p := d.add(fmt.Sprintf("<< /Type /Page /Contents %d 0 R /Resources %d 0 R >>", r, r))
		d.kids = append(d.kids, p)
	})
	cases["deep arrays"] = plain(func(d *doc) {
		deep := d.add(strings.Repeat("[", 200000) + strings.Repeat("]", 200000))
		p := d.add(fmt.Sprintf("<< /Type /Page /Contents %d 0 R >>", deep))
		d.kids = append(d.kids, p)
		d.textPage(strings.Repeat("[", 100000)+"(x) Tj", true)
	})
	cases["wide page tree"] = plain(func(d *doc) {
		p := d.textPage(show("wide"), false)
		for i := 0; i < 50000; i++ {
			d.kids = append(d.kids, p)
		}
	})
	cases["form fan-out"] = func() []byte {
		// Eight forms, each showing the next fifty times: 50^8 runs unless
		// a form known to show nothing is skipped.
		d := newDoc()
		next := d.stream("/Subtype /Form", []byte("0 0 m 1 1 l S"))
		for i := 0; i < maxFormDepth-1; i++ {
			next = d.stream(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /N %d 0 R >> >>", next), []byte(strings.Repeat("/N Do ", 50)))
		}
		d.textPage(strings.Repeat("/N Do ", 50), false)
		d.finish(fmt.Sprintf("<< /XObject << /N %d 0 R >> >>", next))
		return d.table(d.catalog, "")
	}()
	cases["form recursion"] = func() []byte {
		d := newDoc()
		f := d.reserve()
		d.set(f, streamBody(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /X %d 0 R >> >>", f), []byte(strings.Repeat("/X Do ", 50))))
		d.textPage("/X Do", false)
		d.finish(fmt.Sprintf("<< /XObject << /X %d 0 R >> >>", f))
		return d.table(d.catalog, "")
	}()
	// Object stream hazards, written by hand in an xref stream file.
	objStm := func(dictExtra, body string, xrefRows func(stm int) [][3]int) []byte {
		var out bytes.Buffer
		out.WriteString("%PDF-1.7\n" + pad)
		off := out.Len()
		fmt.Fprintf(&out, "1 0 obj\n%s\nendobj\n", streamBody("/Type /ObjStm "+dictExtra, []byte(body)))
		rows := xrefRows(1)
		xoff := out.Len()
		var raw []byte
		rows = append([][3]int{{0, 0, 65535}, {1, off, 0}}, rows...)
		for _, r := range rows {
			raw = append(raw, byte(r[0]), byte(r[1]>>24), byte(r[1]>>16), byte(r[1]>>8), byte(r[1]), byte(r[2]>>8), byte(r[2]))
		}
		fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\nstartxref\n%d\n%%%%EOF\n", len(rows), streamBody(fmt.Sprintf("/Type /XRef /Size %d /W [1 4 2] /Root 2 0 R", len(rows)), raw), xoff)
		return out.Bytes()
	}
	cases["object stream in itself"] = objStm("/N 1 /First 4", "2 0 <</Type/Catalog>>", func(int) [][3]int {
		return [][3]int{{2, 3, 0}, {2, 2, 0}} // 2 lives in 3, 3 lives in 2
	})
	cases["object stream huge N"] = objStm("/N 9000000000 /First 4", "2 0 <</Type/Catalog>>", func(int) [][3]int {
		return [][3]int{{2, 1, 0}}
	})
	cases["object stream open hex"] = objStm("/N 1 /First 4", "2 0 <</Type/Catalog /Pages <0a0b", func(int) [][3]int {
		return [][3]int{{2, 1, 0}}
	})
	cases["object stream duplicate ids"] = objStm("/N 2 /First 8", "2 0 2 19 <</Type/Catalog>> <</Type/Catalog /Pages 9 0 R>>", func(int) [][3]int {
		return [][3]int{{2, 1, 1}}
	})
	cases["object stream N by reference"] = objStm("/N 2 0 R /First 4", "2 0 7", func(int) [][3]int {
		return [][3]int{{2, 1, 0}}
	})
	// Xref hazards (pad makes each file long enough for the library).
	// @O@ is the offset of object 1, @X@ that of the xref section.
	fix := func(s string) []byte {
		o := strings.Index(s, "1 0 obj")
		x := strings.Index(s, "\nxref\n") + 1
		if x == 0 {
			x = o
		}
		s = strings.ReplaceAll(s, "@O@", fmt.Sprintf("%010d", o))
		return []byte(strings.ReplaceAll(s, "@X@", fmt.Sprint(x)))
	}
	cases["xref huge start"] = fix("%PDF-1.4\n" + pad + "1 0 obj << /Type /Catalog >> endobj\nxref\n4000000000 2\n@O@ 00000 n \n@O@ 00000 n \ntrailer << /Size 3 /Root 1 0 R >>\nstartxref\n@X@\n%%EOF\n")
	cases["xref prev cycle"] = fix("%PDF-1.4\n" + pad + "1 0 obj << /Type /Catalog >> endobj\nxref\n0 2\n0000000000 65535 f \n@O@ 00000 n \ntrailer << /Size 2 /Root 1 0 R /Prev @X@ >>\nstartxref\n@X@\n%%EOF\n")
	cases["xref stream empty rows"] = fix("%PDF-1.5\n" + pad + "1 0 obj << /Type /XRef /Size 3 /W [0 0 0] /Index [0 900000000] /Length 0 >>\nstream\n\nendstream\nendobj\nstartxref\n@X@\n%%EOF\n")
	cases["xref stream huge size"] = fix("%PDF-1.5\n" + pad + "1 0 obj << /Type /XRef /Size 900000000 /W [1 1 1] /Length 3 >>\nstream\n\x01\x09\x00\nendstream\nendobj\nstartxref\n@X@\n%%EOF\n")
	cases["predictor huge columns"] = fix("%PDF-1.5\n" + pad + "1 0 obj << /Type /XRef /Size 3 /W [1 1 1] /Length 10 /Filter /FlateDecode /DecodeParms << /Predictor 12 /Columns 9000000000 >> >>\nstream\nx\x9c\x03\x00\x00\x00\x00\x01\x00\x00\nendstream\nendobj\nstartxref\n@X@\n%%EOF\n")
	return cases
}

// The structure check refuses the library every file on which the library
// itself would crash (out of memory, stack overflow) or spin: each of these
// does so when given to the library directly.
func TestCheckRefusesHazards(t *testing.T) {
	cases := hostileCases()
	for _, name := range []string{
		"object stream in itself", "object stream huge N", "object stream open hex",
		"object stream N by reference", "object stream duplicate ids", "xref huge start",
		"xref prev cycle", "xref stream empty rows", "xref stream huge size", "predictor huge columns",
	} {
		v, _, ok := libraryView(cases[name])
		if !ok {
			t.Errorf("%s: no library view", name)
			continue
		}
		b := newBudget(testLimits, time.Now())
		if err := newChecker(v, b).run(); err != errNoLibrary {
			t.Errorf("%s: check says %v, want errNoLibrary", name, err)
		}
	}
}

func TestHostileStructures(t *testing.T) {
	for name, data := range hostileCases() {
		t.Run(name, func(t *testing.T) {
			o := readAllText(t, data, testLimits)
			if o.err != nil && !errors.Is(o.err, ErrBound) {
				t.Errorf("err %v", o.err)
			}
			if o.res.Pages < 1 && o.err == nil {
				t.Errorf("result %+v", o.res)
			}
			if o.took > testLimits.Timeout+500*time.Millisecond {
				t.Errorf("took %v", o.took)
			}
			t.Logf("%s: path %v err %v result %+v in %v, %d bytes of text", name, o.how, o.err, o.res, o.took, len(o.text))
		})
	}
}

// The library builds every value of an object it parses: an object too
// large for that goes to the scan, which still counts its pages.
func TestHugeObjects(t *testing.T) {
	d := newDoc()
	p := d.textPage(show("one page, named many times"), false)
	for i := 0; i < 100000; i++ {
		d.kids = append(d.kids, p)
	}
	kids := d.bytes()
	d = newDoc()
	a := d.add("[" + strings.Repeat("0 ", 3<<20) + "]")
	d.kids = append(d.kids, d.add(fmt.Sprintf("<< /Type /Page /Parent 2 0 R /Contents %d 0 R >>", a)))
	contents := d.bytes()
	for name, c := range map[string]struct {
		data  []byte
		pages int
	}{"kids": {kids, 100001}, "contents": {contents, 1}} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		o := readAllText(t, c.data, testLimits)
		runtime.ReadMemStats(&after)
		if o.err != nil || o.how != viaScan || o.res.Pages != c.pages {
			t.Errorf("%s: err %v path %v result %+v", name, o.err, o.how, o.res)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
			t.Errorf("%s: %d-byte file allocated %d MiB", name, len(c.data), alloc>>20)
		}
	}
}

// Files the library cannot read are costed by the scan, never as nothing.

func TestFallback(t *testing.T) {
	content, text := attackContent(20 << 10)
	d := newDoc()
	d.textPage(content, true)
	d.textPage(show("second page"), true)
	good := d.bytes()

	t.Run("broken xref", func(t *testing.T) {
		data := bytes.Replace(good, []byte("0000000015 00000 n"), []byte("0000000999 00000 n"), 1)
		data = bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
		o := readAllText(t, data, testLimits)
		if o.err != nil || o.how != viaScan {
			t.Fatalf("err %v path %v", o.err, o.how)
		}
		if len(strings.Fields(o.text)) < len(strings.Fields(text)) || o.res.Pages != 2 {
			t.Errorf("read %d bytes of %d, result %+v", len(o.text), len(text), o.res)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		i := bytes.Index(good, []byte("endstream"))
		o := readAllText(t, good[:i+40], testLimits)
		if o.err != nil || o.how != viaScan {
			t.Fatalf("err %v path %v", o.err, o.how)
		}
		if len(strings.Fields(o.text)) < len(strings.Fields(text)) || o.res.Pages < 1 {
			t.Errorf("read %d bytes of %d, result %+v", len(o.text), len(text), o.res)
		}
	})
	t.Run("cut inside a stream", func(t *testing.T) {
		i := bytes.Index(good, []byte("stream\n"))
		o := readAllText(t, good[:i+400], testLimits)
		if o.err != nil || o.how != viaScan || o.res.Unread == 0 || len(o.text) < 1000 {
			t.Fatalf("err %v path %v result %+v, %d bytes of text", o.err, o.how, o.res, len(o.text))
		}
	})
	t.Run("no header, garbage around", func(t *testing.T) {
		data := append([]byte("garbage\x00\x01"), good[9:]...)
		data = append(data, "trailing junk"...)
		o := readAllText(t, data, testLimits)
		if o.err != nil || len(strings.Fields(o.text)) < len(strings.Fields(text)) {
			t.Fatalf("err %v, read %d bytes of %d", o.err, len(o.text), len(text))
		}
	})
	t.Run("encrypted", func(t *testing.T) {
		d := newDoc()
		c := d.stream("/Filter /FlateDecode", bytes.Repeat([]byte{0x5a, 0xc3, 0x91}, 300))
		d.page(c)
		enc := d.add("<< /Filter /Standard /V 2 /R 3 /Length 128 /P -4 /O (0123456789abcdef0123456789abcdef) /U (0123456789abcdef0123456789abcdef) >>")
		d.finish("")
		data := d.table(d.catalog, fmt.Sprintf("/Encrypt %d 0 R /ID [(abc) (abc)]", enc))
		o := readAllText(t, data, testLimits)
		if o.err != nil || o.how != viaScan || o.res.Unread < 900 || o.res.Pages != 1 {
			t.Fatalf("err %v path %v result %+v", o.err, o.how, o.res)
		}
	})
	t.Run("unknown filter", func(t *testing.T) {
		d := newDoc()
		c := d.stream("/Filter /BrotliDecode", bytes.Repeat([]byte("x"), 500))
		d.page(c)
		d.textPage(show("readable"), true)
		o := readAllText(t, d.bytes(), testLimits)
		if o.err != nil || o.res.Unread < 500*maxExpansion || !strings.Contains(o.text, "readable") {
			t.Fatalf("err %v path %v result %+v text %q", o.err, o.how, o.res, o.text)
		}
	})
	t.Run("claims encryption", func(t *testing.T) {
		// A comment naming /Encrypt must not turn text into a size.
		data := bytes.Replace(good, []byte("%\xe2\xe3\xcf\xd3\n"), []byte("%/Encrypt\n"), 1)
		o := readAllText(t, data, testLimits)
		if o.err != nil || len(strings.Fields(o.text)) < len(strings.Fields(text)) {
			t.Fatalf("err %v path %v, read %d bytes of %d", o.err, o.how, len(o.text), len(text))
		}
	})
	t.Run("stream hides the next", func(t *testing.T) {
		// The first stream has neither a true /Length nor an endstream;
		// the xref is broken. The second stream's text still counts.
		d := newDoc()
		d.add("<< /Length 99999 >>\nstream\nBT (first) Tj ET")
		d.textPage(content, true)
		data := d.bytes()
		data = bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
		o := readAllText(t, data, testLimits)
		if o.err != nil || o.how != viaScan || len(strings.Fields(o.text)) < len(strings.Fields(text)) {
			t.Fatalf("err %v path %v, read %d bytes of %d", o.err, o.how, len(o.text), len(text))
		}
	})
	t.Run("content dressed as an image", func(t *testing.T) {
		d := newDoc()
		c := d.flate("/Subtype /Image /Width 8 /Height 8 /BitsPerComponent 8 /ColorSpace /DeviceGray", []byte(content))
		d.page(c)
		data := d.bytes()
		for _, broken := range [][]byte{data, bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)} {
			o := readAllText(t, broken, testLimits)
			if o.err != nil || len(strings.Fields(o.text)) < len(strings.Fields(text)) {
				t.Fatalf("err %v path %v, read %d bytes of %d", o.err, o.how, len(o.text), len(text))
			}
		}
	})
	t.Run("escaped page type", func(t *testing.T) {
		d := newDoc()
		for i := 0; i < 3; i++ {
			d.textPage(show("p"), false)
		}
		data := bytes.ReplaceAll(d.bytes(), []byte("/Type /Page "), []byte("/T#79pe /P#61ge "))
		data = bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
		o := readAllText(t, data, testLimits)
		if o.err != nil || o.how != viaScan || o.res.Pages != 3 {
			t.Fatalf("err %v path %v result %+v", o.err, o.how, o.res)
		}
	})
	t.Run("not a PDF", func(t *testing.T) {
		for _, data := range [][]byte{[]byte("hello, I am not a PDF"), {}, bytes.Repeat([]byte{0xff}, 3000), []byte("%PDF-1.7\n")} {
			o := readAllText(t, data, testLimits)
			if o.err != nil || o.res != (Result{Pages: 1, Unread: int64(len(data))}) || o.text != "" {
				t.Errorf("%.20q: err %v result %+v text %q", data, o.err, o.res, o.text)
			}
		}
	})
}

func TestTimeout(t *testing.T) {
	// A page that shows the same form 200000 times, each time with text: the
	// work is legitimate but long; a 50 ms deadline cuts it.
	d := newDoc()
	f := d.flate("/Subtype /Form", []byte(show("form text")))
	d.textPage(strings.Repeat("/X Do\n", 200000), true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R >> /XObject << /X %d 0 R >> >>", d.font, f))
	lim := testLimits
	lim.Timeout = 50 * time.Millisecond
	o := readAllText(t, d.table(d.catalog, ""), lim)
	if !errors.Is(o.err, ErrBound) || o.took > 200*time.Millisecond {
		t.Fatalf("err %v after %v", o.err, o.took)
	}
}

func TestZeroLimitsTakeDefaults(t *testing.T) {
	data, _ := attackPDF()
	o := readAllText(t, data, Limits{})
	if o.err != nil || len(o.text) < 80<<10 {
		t.Fatalf("err %v, %d bytes", o.err, len(o.text))
	}
}
