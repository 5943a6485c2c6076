package pdf

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

var testLimits = Limits{MaxDecompressed: 8 << 20, Timeout: time.Second, MaxPages: 100}

type readOut struct {
	text  string
	res   Result
	how   path
	err   error
	calls int
	took  time.Duration
}

func readAllText(t testing.TB, data []byte, lim Limits) readOut {
	t.Helper()
	var o readOut
	var sb strings.Builder
	start := time.Now()
	o.res, o.how, o.err = readPath(data, lim, func(p []byte) error {
		o.calls++
		sb.Write(p)
		return nil
	})
	o.took = time.Since(start)
	o.text = sb.String()
	return o
}

func wantWords(t *testing.T, text string, words ...string) {
	t.Helper()
	last := -1
	for _, w := range words {
		i := strings.Index(text, w)
		if i < 0 {
			t.Errorf("text lacks %q; text is %.300q", w, text)
			continue
		}
		if i < last {
			t.Errorf("%q out of order in %.300q", w, text)
		}
		last = i
	}
}

// Ordinary PDFs: the library reads them, with the right text and page count.

func TestReadUncompressed(t *testing.T) {
	d := newDoc()
	d.textPage("BT /F1 12 Tf 72 720 Td (Hello) Tj [(Wor) -20 (ld) -500 (again)] TJ 0 -14 Td (next) ' ET", false)
	o := readAllText(t, d.bytes(), testLimits)
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
	wantWords(t, o.text, "Hello", "World again", "next")
	if o.res != (Result{Pages: 1}) {
		t.Errorf("result %+v", o.res)
	}
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
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
	wantWords(t, o.text, "alpha page one", "beta", "gamma page two", "delta epsilon")
	if o.res != (Result{Pages: 3}) {
		t.Errorf("result %+v", o.res)
	}
}

func TestReadObjectStreams(t *testing.T) {
	d := newDoc()
	p1 := d.textPage(show("packed first page"), true)
	p2 := d.textPage(show("packed second page", "with 'quotes' and \\(parens\\)"), true)
	d.finish("")
	d.pack(d.catalog, d.pages, d.font, p1, p2)
	data := d.xrefStream(d.catalog)
	o := readAllText(t, data, testLimits)
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
	wantWords(t, o.text, "packed first page", "packed second page")
	if o.res != (Result{Pages: 2}) {
		t.Errorf("result %+v", o.res)
	}
}

func TestReadPDF20Header(t *testing.T) {
	d := newDoc()
	d.version = "2.0"
	d.textPage(show("version two"), true)
	o := readAllText(t, d.bytes(), testLimits)
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
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
	// A simple font with a /Differences encoding.
	f3 := d.add("<< /Type /Font /Subtype /Type1 /BaseFont /Y /Encoding << /Differences [65 /eacute /germandbls] >> >>")
	d.textPage("BT /F2 12 Tf <000100020010001100120020 0021> Tj /F3 10 Tf ( AB) Tj /F1 10 Tf (caf\xe9) Tj ET", true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R /F2 %d 0 R /F3 %d 0 R >> >>", d.font, f2, f3))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
	wantWords(t, o.text, "HiABACADé漢", " éß", "café")
}

func TestReadFormXObject(t *testing.T) {
	d := newDoc()
	form := d.flate("/Type /XObject /Subtype /Form /BBox [0 0 100 100]", []byte(show("inside the form")))
	img := d.stream("/Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray /BitsPerComponent 8", []byte{0})
	d.textPage("q /Fm1 Do Q /Im1 Do BT /F1 9 Tf (after) Tj ET BI /W 2 /H 1 /BPC 8 /CS /G ID \x00(EI) EI BT (tail) Tj ET", true)
	d.finish(fmt.Sprintf("<< /Font << /F1 %d 0 R >> /XObject << /Fm1 %d 0 R /Im1 %d 0 R >> >>", d.font, form, img))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
	wantWords(t, o.text, "inside the form", "after", "tail")
	if strings.Contains(o.text, "EI") {
		t.Errorf("inline image data read as text: %q", o.text)
	}
}

func TestFormDepth(t *testing.T) {
	// Y shows text; X shows Y. X is first reached through a chain of
	// wrappers deeper than the depth bound (it shows nothing there), then
	// directly: there its text counts.
	d := newDoc()
	y := d.stream("/Subtype /Form", []byte("BT (deep text) Tj ET"))
	x := d.stream(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /Y %d 0 R >> >>", y), []byte("/Y Do"))
	prev := x
	for i := 0; i < maxFormDepth; i++ {
		prev = d.stream(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /W %d 0 R >> >>", prev), []byte("/W Do"))
	}
	d.textPage("/Wrap Do /X Do", false)
	d.finish(fmt.Sprintf("<< /XObject << /X %d 0 R /Wrap %d 0 R >> >>", x, prev))
	o := readAllText(t, d.table(d.catalog, ""), testLimits)
	if o.err != nil || strings.Count(o.text, "deep text") != 1 {
		t.Fatalf("err %v text %q", o.err, o.text)
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
	if o.err != nil {
		t.Fatal(o.err)
	}
	wantWords(t, o.text, "page0", "page1")
	if strings.Contains(o.text, "page2") || o.res.Pages != 5 {
		t.Errorf("text %q, result %+v", o.text, o.res)
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
	if o.err != nil || o.how != viaLibrary {
		t.Fatalf("err %v, path %v", o.err, o.how)
	}
	got := strings.Join(strings.Fields(o.text), " ")
	want := strings.Join(strings.Fields(text), " ")
	if got != want {
		t.Fatalf("read %d bytes of text, want %d", len(got), len(want))
	}
	if o.calls < 10 {
		t.Errorf("sink called %d times: text should come in pieces", o.calls)
	}
	t.Logf("%d-byte PDF, %d bytes of text in %d pieces", len(data), len(o.text), o.calls)
}

func TestSinkErrorStops(t *testing.T) {
	data, _ := attackPDF()
	stop := errors.New("over the cap")
	calls := 0
	res, err := Read(data, testLimits, func([]byte) error {
		calls++
		return fmt.Errorf("sink: %w", stop)
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("err %v after %d calls, want the sink's error after 1", err, calls)
	}
	_ = res
	// Also in the scan's fallback.
	broken := bytes.Replace(data, []byte("startxref"), []byte("startxreg"), 1)
	calls = 0
	_, how, err := readPath(broken, testLimits, func([]byte) error { calls++; return stop })
	if how != viaScan || !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("fallback: path %v, err %v after %d calls", how, err, calls)
	}
}

// Bombs: a stream that inflates to 1 GiB must stop at MaxDecompressed,
// quickly and with little memory, wherever it sits.
