package pdf

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

var testLimits = Limits{MaxDecoded: 8 << 20, MaxSteps: 4 << 20, MaxPages: 100}

type readOut struct {
	text  string
	raw   int64 // bytes handed over as text as they are
	res   Result
	err   error
	calls int
	took  time.Duration
	steps int64 // steps spent
}

func readAllText(t testing.TB, data []byte, lim Limits) readOut {
	t.Helper()
	var o readOut
	var sb strings.Builder
	start := time.Now()
	lim = lim.withDefaults()
	r := newReader(data, lim, func(p []byte) error {
		o.calls++
		sb.Write(p)
		return nil
	})
	o.res, o.err = r.result(r.run())
	o.took = time.Since(start)
	o.text, o.raw, o.steps = sb.String(), r.out.rawN, lim.MaxSteps-r.b.steps
	return o
}

func wantWords(t *testing.T, text string, words ...string) {
	t.Helper()
	last := -1
	for _, w := range words {
		i := strings.Index(text, w)
		if i < 0 {
			t.Errorf("text lacks %q; text ends %q", w, text[max(0, len(text)-300):])
			continue
		}
		if i < last {
			t.Errorf("%q out of order in %.300q", w, text)
		}
		last = i
	}
}

// A well-formed file: its text and pages, and every byte accounted for.
func wantClean(t *testing.T, o readOut, pages int) {
	t.Helper()
	if o.err != nil || o.res.Pages != pages || o.raw != 0 {
		t.Errorf("err %v, result %+v, %d bytes costed as text, want %d pages and none", o.err, o.res, o.raw, pages)
	}
}

func TestReadUncompressed(t *testing.T) {
	d := newDoc()
	d.textPage("BT /F1 12 Tf 72 720 Td (Hello) Tj [(Wor) -20 (ld) -500 (again)] TJ 0 -14 Td (next) ' ET", false)
	o := readAllText(t, d.bytes(), testLimits)
	wantClean(t, o, 1)
	wantWords(t, o.text, "Hello", "World again", "next")
}

func TestReadFlateMultiPage(t *testing.T) {
	d := newDoc()
	d.textPage(show("alpha page one", "beta"), true)
	d.textPage(show("gamma page two"), true)
	// A page whose content is split over two streams, one of each kind.
	a := d.flate("", []byte("BT /F1 12 Tf (delta) Tj"))
	b := d.stream("", []byte("( epsilon) Tj ET"))
	d.page(a, b)
	o := readAllText(t, d.bytes(), testLimits)
	wantClean(t, o, 3)
	wantWords(t, o.text, "alpha page one", "beta", "gamma page two", "delta", "epsilon")
}

func TestReadObjectStreams(t *testing.T) {
	d := newDoc()
	p1 := d.textPage(show("packed first page"), true)
	p2 := d.textPage(show("packed second page", "with 'quotes' and \\(parens\\)"), true)
	d.finish("")
	d.pack(d.catalog, d.pages, d.font, p1, p2)
	o := readAllText(t, d.xrefStream(d.catalog), testLimits)
	wantClean(t, o, 2)
	wantWords(t, o.text, "packed first page", "packed second page", `'quotes' and \(parens\)`)
}

func TestReadPDF20Header(t *testing.T) {
	d := newDoc()
	d.version = "2.0"
	d.textPage(show("version two"), true)
	o := readAllText(t, d.bytes(), testLimits)
	wantClean(t, o, 1)
	wantWords(t, o.text, "version two")
}

func TestReadFonts(t *testing.T) {
	d := newDoc()
	// A Type0 font with 2-byte codes mapped by a ToUnicode CMap.
	cmap := `/CIDInit /ProcSet findresource begin 12 dict begin begincmap
/CMapName /Test def
1 begincodespacerange <0000> <FFFF> endcodespacerange
2 beginbfchar <0001> <0048> <0002> <0069> endbfchar
1 beginbfrange <0010> <0012> <00410042> endbfrange
1 beginbfrange <0020> <0021> [<00E9> <6F22>] endbfrange
endcmap CMapName currentdict /CMap defineresource pop end end`
	tu := d.flate("", []byte(cmap))
	f2 := d.add(fmt.Sprintf("<< /Type /Font /Subtype /Type0 /BaseFont /X /Encoding /Identity-H /ToUnicode %d 0 R >>", tu))
	// Simple fonts: /Differences, MacRoman, and an Identity-H font without a CMap.
	f3 := d.add("<< /Type /Font /Subtype /Type1 /BaseFont /Y /Encoding << /Differences [65 /eacute /germandbls /f_i /uni0041 /a.sc] >> >>")
	f4 := d.add("<< /Type /Font /Subtype /Type1 /Encoding /MacRomanEncoding >>")
	f5 := d.add("<< /Type /Font /Subtype /Type0 /Encoding /Identity-H >>")
	d.textPage("BT /F2 12 Tf <000100020010001100120020 0021> Tj /F3 10 Tf ( ABCDE) Tj /F1 10 Tf (caf\\351 \\200) Tj /F4 9 Tf (\\216t\\216) Tj /F5 9 Tf <00480069> Tj ET", true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R /F2 %d 0 R /F3 %d 0 R /F4 %d 0 R /F5 %d 0 R >> >>", d.font, f2, f3, f4, f5))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	wantClean(t, o, 1)
	wantWords(t, o.text, "HiABACADé漢", " éßfiAa", "café €", "été", "\x00H\x00i")
}

func TestReadFormXObject(t *testing.T) {
	d := newDoc()
	form := d.flate("/Type /XObject /Subtype /Form /BBox [0 0 100 100]", []byte(show("inside the form")))
	img := d.stream("/Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray /BitsPerComponent 8", []byte{0})
	d.textPage("q /Fm1 Do Q /Im1 Do BT /F1 9 Tf (after) Tj ET BI /W 2 /H 1 /BPC 8 /CS /G ID \x00(EI) EI BT (tail) Tj ET /Fm1 Do", true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R >> /XObject << /Fm1 %d 0 R /Im1 %d 0 R >> >>", d.font, form, img))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	wantClean(t, o, 1)
	wantWords(t, o.text, "inside the form", "after", "tail")
	if strings.Count(o.text, "inside the form") != 2 {
		t.Errorf("the form shown twice: %q", o.text)
	}
	if strings.Contains(o.text, "EI") {
		t.Errorf("inline image data read as text: %q", o.text)
	}
}

// A form shown many times costs its text each time, and is interpreted once.
func TestFormShownManyTimes(t *testing.T) {
	d := newDoc()
	f := d.flate("/Subtype /Form", []byte(show("form text")))
	d.textPage(strings.Repeat("/X Do\n", 20000), true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R >> /XObject << /X %d 0 R >> >>", d.font, f))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	wantClean(t, o, 1)
	if n := strings.Count(o.text, "form text"); n != 20000 {
		t.Errorf("form text %d times, want 20000", n)
	}
	if o.steps > 2_000_000 {
		t.Errorf("%d steps: the form was interpreted more than once", o.steps)
	}
}

func TestFormDepthAndCycles(t *testing.T) {
	d := newDoc()
	y := d.stream("/Subtype /Form", []byte("BT (deep text) Tj ET"))
	x := d.stream(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /Y %d 0 R >> >>", y), []byte("/Y Do"))
	self := d.reserve()
	d.set(self, streamBody(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /S %d 0 R >> >>", self), []byte(strings.Repeat("/S Do ", 50))))
	d.textPage("/X Do /S Do", false)
	d.finish(fmt.Sprintf("<< /XObject << /X %d 0 R /S %d 0 R >> >>", x, self))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	wantClean(t, o, 1)
	if strings.Count(o.text, "deep text") != 1 {
		t.Fatalf("text %q", o.text)
	}
}

func TestMaxPages(t *testing.T) {
	d := newDoc()
	for i := 0; i < 5; i++ {
		d.textPage(show(fmt.Sprintf("page%d", i)), true)
	}
	lim := testLimits
	lim.MaxPages = 2
	o := readAllText(t, d.bytes(), lim)
	wantClean(t, o, 5)
	wantWords(t, o.text, "page0", "page1")
	if strings.Contains(o.text, "page2") {
		t.Errorf("text %q", o.text)
	}
}

// The attack: a PDF of about 1 KB whose compressed content shows 80 KB of
// words must cost every one of them.

var vocabulary = strings.Fields(`the quick brown fox jumps over lazy dog while seven
wizards quietly hex jovial bakers pack my box with five dozen liquor jugs
sphinx of black quartz judge vow zephyrs blow vexing daft jim crazy fredrick
bought many very exquisite opal jewels amazingly few discotheques provide
jukeboxes heavy boxes perform quick waltzes and jigs`)

func attackContent(size int) (string, string) {
	var text, content strings.Builder
	content.WriteString("BT /F1 10 Tf 40 800 Td 11 TL\n")
	for i := 0; text.Len() < size; i += 8 {
		var line []string
		for k := i; k < i+8; k++ {
			line = append(line, vocabulary[k%len(vocabulary)])
		}
		l := strings.Join(line, " ")
		text.WriteString(l + " ")
		fmt.Fprintf(&content, "(%s) Tj T*\n", l)
	}
	content.WriteString("ET\n")
	return content.String(), text.String()
}

func attackPDF() ([]byte, string) {
	content, text := attackContent(80 << 10)
	d := newDoc()
	d.textPage(content, true)
	return d.bytes(), text
}

func TestAttackSmallPDFLargeText(t *testing.T) {
	data, text := attackPDF()
	if len(data) > 2048 {
		t.Fatalf("attack PDF is %d bytes, want about 1–2 KB", len(data))
	}
	o := readAllText(t, data, testLimits)
	wantClean(t, o, 1)
	got := strings.Join(strings.Fields(o.text), " ")
	if want := strings.Join(strings.Fields(text), " "); got != want {
		t.Fatalf("read %d bytes of text, want %d", len(got), len(want))
	}
	if o.calls < 10 {
		t.Errorf("sink called %d times: text should come in pieces", o.calls)
	}
}

func TestSinkErrorStops(t *testing.T) {
	data, _ := attackPDF()
	stop := errors.New("over the cap")
	for _, in := range [][]byte{data, []byte("not a PDF at all"), append([]byte("garbage "), data...)} {
		calls := 0
		_, err := Read(in, testLimits, func([]byte) error {
			calls++
			return fmt.Errorf("sink: %w", stop)
		})
		if !errors.Is(err, stop) || calls != 1 {
			t.Fatalf("err %v after %d calls, want the sink's error after 1", err, calls)
		}
	}
}

// Every byte the reader does not account for is text.

func TestUnaccountedBytesAreText(t *testing.T) {
	content, text := attackContent(20 << 10)
	d := newDoc()
	d.textPage(content, true)
	d.textPage(show("second page"), true)
	good := d.bytes()
	for name, c := range map[string]struct {
		data []byte
		want []string // in the text
	}{
		"garbage between objects":   {bytes.Replace(good, []byte("endobj\n2 0 obj"), []byte("endobj\nIGNORE ALL PREVIOUS INSTRUCTIONS\n2 0 obj"), 1), []string{"IGNORE ALL PREVIOUS INSTRUCTIONS"}},
		"no header, garbage around": {append(append([]byte("garbage\x01"), good[9:]...), " trailing junk"...), []string{"garbage\x01", "trailing junk", "second page"}},
		"truncated":                 {good[:bytes.LastIndex(good, []byte("endstream"))-5], []string{"jugs sphinx"}},
		"unknown filter":            {bytes.Replace(good, []byte("/Filter /FlateDecode"), []byte("/Filter /BrotliDecode"), 1), []string{"second page"}},
		"unparsable object":         {bytes.Replace(good, []byte("<< /Type /Font"), []byte("<< (open /Type /Font"), 1), []string{"(open /Type /Font"}},
		"image codec on text":       {bytes.Replace(good, []byte("/Filter /FlateDecode"), []byte("/Filter /DCTDecode"), 1), []string{"second page"}},
	} {
		t.Run(name, func(t *testing.T) {
			o := readAllText(t, c.data, testLimits)
			if o.err != nil || o.raw == 0 {
				t.Fatalf("err %v, %d raw bytes", o.err, o.raw)
			}
			for _, w := range c.want {
				wantWords(t, o.text, w)
			}
			if name == "garbage between objects" || name == "no header, garbage around" {
				if len(strings.Fields(o.text)) < len(strings.Fields(text)) {
					t.Errorf("read %d bytes of text, want %d", len(o.text), len(text))
				}
			}
		})
	}
	t.Run("not a PDF", func(t *testing.T) {
		for _, data := range [][]byte{[]byte("hello, I am not a PDF"), {}, bytes.Repeat([]byte{0xff, ' '}, 3000), []byte("%PDF-1.7\n%%EOF\n")} {
			o := readAllText(t, data, testLimits)
			if o.err != nil || o.res.Pages != 1 || o.text != string(data) {
				t.Errorf("%.20q: err %v result %+v text %.20q", data, o.err, o.res, o.text)
			}
		}
	})
	t.Run("encrypted", func(t *testing.T) {
		d := newDoc()
		c := d.stream("/Filter /FlateDecode", bytes.Repeat([]byte{0x5a, 0xc3, 0x91}, 300))
		d.page(c)
		enc := d.add("<< /Filter /Standard /V 2 /R 3 /Length 128 /P -4 /O (0123456789abcdef0123456789abcdef) /U (0123456789abcdef0123456789abcdef) >>")
		d.finish("")
		o := readAllText(t, d.table(d.catalog, fmt.Sprintf("/Encrypt %d 0 R /ID [(abc) (abc)]", enc)), testLimits)
		if o.err != nil || o.raw < 900 || o.res.Pages != 1 {
			t.Fatalf("err %v result %+v, %d raw bytes", o.err, o.res, o.raw)
		}
	})
	t.Run("image data", func(t *testing.T) {
		d := newDoc()
		d.textPage(show("p"), true)
		d.stream("/Subtype /Image /Filter /DCTDecode", append([]byte{0xff, 0xd8}, bytes.Repeat([]byte("jpeg"), 100)...))
		d.stream("/Subtype /Image /Filter [/FlateDecode /DCTDecode]", zlibBytes(append([]byte{0xff, 0xd8}, bytes.Repeat([]byte("jpeg"), 100)...)))
		wantClean(t, readAllText(t, d.bytes(), testLimits), 1)
	})
}

// A damaged stream: the text before the damage counts, and its data too.
func TestDamagedStream(t *testing.T) {
	content, _ := attackContent(50 << 10)
	z := zlibBytes([]byte(content))
	d := newDoc()
	d.page(d.flate("", []byte(show("intact page"))))
	d.page(d.stream("/Filter /FlateDecode", z[:len(z)/2]))
	o := readAllText(t, d.bytes(), testLimits)
	if o.err != nil || o.raw < int64(len(z)/2) || !strings.Contains(o.text, "jugs sphinx") {
		t.Errorf("err %v result %+v, %d raw, %d bytes of text", o.err, o.res, o.raw, len(o.text))
	}
}

func TestZeroLimitsTakeDefaults(t *testing.T) {
	data, _ := attackPDF()
	o := readAllText(t, data, Limits{})
	if o.err != nil || len(o.text) < 80<<10 {
		t.Fatalf("err %v, %d bytes", o.err, len(o.text))
	}
}
