package pdf

import (
	"bytes"
	"encoding/ascii85"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// Encoders for the tests: each writes what the decoder of the same name
// reads.

func hexBytes(data []byte) []byte { return []byte(hex.EncodeToString(data) + ">") }

func a85Bytes(data []byte) []byte {
	out := make([]byte, ascii85.MaxEncodedLen(len(data)))
	n := ascii85.Encode(out, data)
	return append(out[:n], "~>"...)
}

func runLengthBytes(data []byte) []byte {
	var out []byte
	for len(data) > 0 {
		n := min(len(data), 128)
		out = append(out, byte(n-1))
		out = append(out, data[:n]...)
		data = data[n:]
	}
	return append(out, 128)
}

// lzwBytes encodes data as PDF LZW with the given /EarlyChange.
func lzwBytes(data []byte, early int) []byte {
	var w msbWriter
	var dict map[string]int
	var next, dn, emitted, width int
	reset := func() {
		dict = map[string]int{}
		for i := 0; i < 256; i++ {
			dict[string([]byte{byte(i)})] = i
		}
		next, dn, emitted, width = 258, 258, 0, 9
	}
	emit := func(code int) {
		w.write(code, width)
		if emitted > 0 {
			dn++
			if k := dn + early; k&(k-1) == 0 {
				width = min(bits.Len(uint(k)), 12)
			}
		}
		emitted++
	}
	reset()
	w.write(256, 9)
	var cur []byte
	for _, c := range data {
		s := append(append([]byte(nil), cur...), c)
		if _, ok := dict[string(s)]; ok {
			cur = s
			continue
		}
		emit(dict[string(cur)])
		if next < 4000 {
			dict[string(s)] = next
			next++
		} else {
			w.write(256, width)
			reset()
		}
		cur = []byte{c}
	}
	if len(cur) > 0 {
		emit(dict[string(cur)])
	}
	w.write(257, width)
	return w.flush()
}

// lzwZeros is LZW data of gens tables' worth of zero bytes: each code the
// one being defined, a string one longer than the last (some 7 MB a table,
// from 5 KB).
func lzwZeros(gens int) []byte {
	var w msbWriter
	width := 9
	for g := 0; g < gens; g++ {
		w.write(256, width)
		width = 9
		dn := 258
		w.write(0, width) // the first code of a table defines nothing
		for code := 258; code < 4000; code++ {
			w.write(code, width)
			dn++
			if k := dn + 1; k&(k-1) == 0 {
				width = min(bits.Len(uint(k)), 12)
			}
		}
	}
	w.write(257, width)
	return w.flush()
}

type msbWriter struct {
	buf   []byte
	acc   uint64
	nbits uint
}

func (w *msbWriter) write(v, n int) {
	w.acc = w.acc<<uint(n) | uint64(v)
	w.nbits += uint(n)
	for w.nbits >= 8 {
		w.buf = append(w.buf, byte(w.acc>>(w.nbits-8)))
		w.nbits -= 8
	}
}

func (w *msbWriter) flush() []byte {
	if w.nbits > 0 {
		w.buf = append(w.buf, byte(w.acc<<(8-w.nbits)))
	}
	return w.buf
}

// pngPredict encodes data in rows of cols bytes, each row with the PNG
// filter type typ (0 to 4), one byte a pixel.
func pngPredict(data []byte, cols int, typ byte) []byte {
	var out []byte
	prev := make([]byte, cols)
	for len(data) > 0 {
		row := make([]byte, cols)
		copy(row, data)
		data = data[min(cols, len(data)):]
		out = append(out, typ)
		for i := range row {
			var left, up, upLeft int
			if i > 0 {
				left, upLeft = int(row[i-1]), int(prev[i-1])
			}
			up = int(prev[i])
			var pred int
			switch typ {
			case 1:
				pred = left
			case 2:
				pred = up
			case 3:
				pred = (left + up) >> 1
			case 4:
				p := left + up - upLeft
				pa, pb, pc := abs(p-left), abs(p-up), abs(p-upLeft)
				switch {
				case pa <= pb && pa <= pc:
					pred = left
				case pb <= pc:
					pred = up
				default:
					pred = upLeft
				}
			}
			out = append(out, row[i]-byte(pred))
		}
		prev = row
	}
	return out
}

// tiffPredict encodes data with TIFF predictor 2, 8 bits, one color.
func tiffPredict(data []byte, cols int) []byte {
	out := make([]byte, len(data))
	for i := range data {
		if i%cols == 0 {
			out[i] = data[i]
		} else {
			out[i] = data[i] - data[i-1]
		}
	}
	return out
}

// bigTextContent is 240,000 characters of text (some 44k tokens) in a
// content stream.
func bigTextContent() (content, text string) { return attackContent(240_000) }

// filterCases are one-page PDFs whose page content is the big text under
// each filter chain a reader decodes, the file of a kilobyte or a few.
func filterCases() map[string][]byte {
	content, _ := bigTextContent()
	shortContent, _ := attackContent(20_000)
	return filterCasesOf(content, shortContent)
}

func filterCasesOf(content, shortContent string) map[string][]byte {
	c := []byte(content)
	z := zlibBytes(c)
	cases := map[string]struct {
		dict string
		data []byte
	}{
		"Fl":                 {"/Filter /Fl", z},
		"Flate Flate":        {"/Filter [/FlateDecode /FlateDecode]", zlibBytes(z)},
		"AHx Flate":          {"/Filter [/ASCIIHexDecode /FlateDecode]", hexBytes(z)},
		"RL Flate":           {"/Filter [/RunLengthDecode /FlateDecode]", runLengthBytes(z)},
		"LZW Flate":          {"/Filter [/LZWDecode /FlateDecode]", lzwBytes(z, 1)},
		"LZW early 0":        {"/Filter [/LZW /Fl] /DecodeParms [<< /EarlyChange 0 >> null]", lzwBytes(z, 0)},
		"Crypt Flate":        {"/Filter [/Crypt /FlateDecode] /DecodeParms [<< /Type /CryptFilterDecodeParms /Name /Identity >> null]", z},
		"A85 AHx Fl":         {"/Filter [/A85 /AHx /Fl]", a85Bytes(hexBytes(z))},
		"LZW alone":          {"/Filter /LZWDecode", lzwBytes([]byte(shortContent), 1)},
		"PNG Sub predictor":  {"/Filter /FlateDecode /DecodeParms << /Predictor 15 /Columns 64 >>", zlibBytes(pngPredict(c, 64, 1))},
		"PNG Paeth":          {"/Filter /FlateDecode /DecodeParms << /Predictor 10 /Columns 32 >>", zlibBytes(pngPredict(c, 32, 4))},
		"PNG Average":        {"/Filter /FlateDecode /DecodeParms << /Predictor 13 /Columns 50 >>", zlibBytes(pngPredict(c, 50, 3))},
		"TIFF predictor":     {"/Filter /FlateDecode /DecodeParms << /Predictor 2 /Columns 40 >>", zlibBytes(tiffPredict(c, 40))},
		"F key, no Filter":   {"/F /FlateDecode", z},
		"DP beside Parms":    {"/Filter /FlateDecode /DP << /Predictor 12 /Columns 64 >> /DecodeParms << >>", zlibBytes(pngPredict(c, 64, 2))},
		"short Length":       {"/Filter /FlateDecode", z}, // /Length is set to 1 below
		"Length 0":           {"/Filter /FlateDecode", z},
		"raw deflate":        {"/Filter /FlateDecode", z[2 : len(z)-4]},
		"indirect parms":     {"/Filter /FlateDecode /DecodeParms @PARMS@", zlibBytes(pngPredict(c, 64, 1))},
		"Flate Flate Flate":  {"/Filter [/Fl /Fl /Fl]", zlibBytes(zlibBytes(z))},
		"RL AHx Flate":       {"/Filter [/RL /AHx /FlateDecode]", runLengthBytes(hexBytes(z))},
		"AHx LZW Flate":      {"/Filter [/AHx /LZW /Fl]", hexBytes(lzwBytes(z, 1))},
		"Identity then Fl":   {"/Filter [/Identity /Fl]", z},
		"names by reference": {"/Filter [@FL@ /FlateDecode]", zlibBytes(z)},
	}
	out := map[string][]byte{}
	for name, k := range cases {
		d := newDoc()
		dict := k.dict
		if strings.Contains(dict, "@PARMS@") {
			p := d.add("<< /Predictor 15 /Columns 64 >>")
			dict = strings.ReplaceAll(dict, "@PARMS@", fmt.Sprintf("%d 0 R", p))
		}
		if strings.Contains(dict, "@FL@") {
			p := d.add("/FlateDecode")
			dict = strings.ReplaceAll(dict, "@FL@", fmt.Sprintf("%d 0 R", p))
		}
		body := streamBody(dict, k.data)
		switch name {
		case "short Length":
			body = strings.Replace(body, fmt.Sprintf("/Length %d", len(k.data)), "/Length 1", 1)
		case "Length 0":
			body = strings.Replace(body, fmt.Sprintf("/Length %d", len(k.data)), "/Length 0", 1)
		}
		c := d.add(body)
		d.page(c)
		out[name] = d.bytes()
	}
	return out
}

// TestFilterChains: every filter chain pdf.js decodes is decoded, on the
// library path and on the scan's: all 240,000 characters reach the sink.
func TestFilterChains(t *testing.T) {
	_, text := bigTextContent()
	want := strings.Join(strings.Fields(text), " ")
	_, short := attackContent(20_000)
	wantShort := strings.Join(strings.Fields(short), " ")
	for name, data := range filterCases() {
		t.Run(name, func(t *testing.T) {
			if len(data) > 8<<10 && !strings.Contains(name, "PNG") && !strings.Contains(name, "TIFF") && name != "LZW alone" {
				t.Errorf("%d-byte file", len(data))
			}
			broken := bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
			for _, c := range []struct {
				data []byte
				how  path
			}{{data, viaLibrary}, {broken, viaScan}} {
				o := readAllText(t, c.data, testLimits)
				if errors.Is(o.err, ErrBound) {
					t.Errorf("path %v: ErrBound; the chain should be read", c.how)
					continue
				}
				if o.err != nil || o.how != c.how {
					t.Fatalf("err %v path %v, want path %v", o.err, o.how, c.how)
				}
				got := strings.Join(strings.Fields(o.text), " ")
				w := want
				if name == "LZW alone" {
					w = wantShort
				}
				if !strings.Contains(got, w[:len(w)-200]) {
					t.Errorf("path %v: read %d bytes of text, want %d (result %+v): %.200q", c.how, len(got), len(w), o.res, got)
				}
				t.Logf("%d-byte file, path %v: %d bytes of text, result %+v", len(c.data), c.how, len(got), o.res)
			}
		})
	}
}

// TestUndecodableFilter: a content stream under a filter this package
// cannot decode costs its worst expansion, or the bound, never its size.
func TestUndecodableFilter(t *testing.T) {
	content, _ := bigTextContent()
	z := zlibBytes([]byte(content))
	for _, f := range []string{"/BrotliDecode", "/Unknown", "[/FlateDecode /Br]", "/DCTDecode", "[7 /FlateDecode]"} {
		for _, size := range []int{64, len(z)} {
			d := newDoc()
			c := d.stream("/Filter "+f, z[:size])
			d.page(c)
			data := d.bytes()
			broken := bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
			for _, in := range [][]byte{data, broken} {
				o := readAllText(t, in, testLimits)
				if errors.Is(o.err, ErrBound) {
					continue
				}
				least := int64(size) * maxExpansion
				if strings.Contains(f, "/Br") {
					least = 10 * maxExpansion // the Flate step's output, after its damage
				}
				if f == "/DCTDecode" && o.how == viaScan {
					least = int64(size) // a page content dressed as an image: read as it decodes
				}
				if o.err != nil || o.res.Unread < least {
					t.Errorf("%s, %d bytes, path %v: err %v result %+v", f, size, o.how, o.err, o.res)
				}
			}
		}
	}
	// Past the budget: the bound.
	d := newDoc()
	d.page(d.stream("/Filter /BrotliDecode", bytes.Repeat([]byte{0x8b}, 16<<10)))
	if o := readAllText(t, d.bytes(), testLimits); !errors.Is(o.err, ErrBound) {
		t.Errorf("16 KB of Brotli: err %v result %+v, want ErrBound", o.err, o.res)
	}
}

// TestDamagedStream: what a damaged stream yields is read; what follows the
// damage is priced at its worst expansion.
func TestDamagedStream(t *testing.T) {
	content, _ := bigTextContent()
	z := zlibBytes([]byte(content))
	// Truncated: all of it was read up to the cut.
	d := newDoc()
	d.page(d.flate("", []byte(show("intact page"))))
	d.page(d.stream("/Filter /FlateDecode", z[:len(z)/2]))
	o := readAllText(t, d.bytes(), testLimits)
	if o.err != nil || o.res.Unread < int64(len(z)/2) || len(o.text) < 1000 {
		t.Errorf("truncated: err %v result %+v, %d bytes of text", o.err, o.res, len(o.text))
	}
	// Broken in the middle (a 'z' inside an ASCII85 group), data after
	// the damage.
	a := a85Bytes(z)
	bad := append(append(append([]byte(nil), a[:len(a)/2+2]...), 'z'), a[len(a)/2+2:]...)
	d = newDoc()
	d.page(d.stream("/Filter [/A85 /FlateDecode]", bad))
	for _, in := range [][]byte{d.bytes(), bytes.Replace(d.bytes(), []byte("startxref\n"), []byte("startxref\n9"), 1)} {
		o = readAllText(t, in, testLimits)
		if !errors.Is(o.err, ErrBound) && o.res.Unread < int64(len(a)/2-1024)*maxExpansion {
			t.Errorf("broken: err %v path %v result %+v", o.err, o.how, o.res)
		}
	}
}

func TestLZW(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	inputs := [][]byte{nil, []byte("a"), []byte("abababababababab"), bytes.Repeat([]byte("x"), 100000)}
	for i := 0; i < 20; i++ {
		b := make([]byte, rng.Intn(20000))
		for j := range b {
			b[j] = byte('a' + rng.Intn(3+i))
		}
		inputs = append(inputs, b)
	}
	for _, in := range inputs {
		for _, early := range []int{0, 1} {
			enc := lzwBytes(in, early)
			b := newBudget(testLimits.withDefaults(), time.Now())
			v, err := lenientChain(enc, []filter{{name: "LZWDecode", parms: dict{"EarlyChange": int64(early)}}}, b, &inflaters{})
			if err != nil || v.result != decoded || !bytes.Equal(v.data, in) {
				t.Fatalf("%d bytes, early %d: err %v result %v, %d bytes back", len(in), early, err, v.result, len(v.data))
			}
		}
	}
	// A bomb: every code a string one longer than the last; the budget
	// stops it.
	b := newBudget(testLimits.withDefaults(), time.Now())
	v, err := lenientChain(lzwZeros(1), []filter{{name: "LZW"}}, b, &inflaters{})
	if err != nil || v.result != decoded || len(v.data) != 3743*3744/2 || bytes.Count(v.data, []byte{0}) != len(v.data) {
		t.Fatalf("one table of zeros: err %v, %d bytes", err, len(v.data))
	}
	lim := testLimits
	lim.MaxDecompressed = 1 << 20
	b = newBudget(lim.withDefaults(), time.Now())
	enc := lzwZeros(3)
	if _, err := lenientChain(enc, []filter{{name: "LZW"}}, b, &inflaters{}); !errors.Is(err, errOver) {
		t.Fatalf("%d-byte LZW bomb: err %v", len(enc), err)
	}
}

func TestStreamExtent(t *testing.T) {
	data := []byte("stream\nABCDEF\n% c\n endstream xx endsteam \n")
	for _, c := range []struct {
		length int64
		want   int
	}{{6, 13}, {7, 14}, {2, 19}, {-1, 19}, {999, 19}} {
		if got := streamExtent(data, 7, c.length); got != c.want {
			t.Errorf("length %d: end %d, want %d", c.length, got, c.want)
		}
	}
	data = []byte("stream\nABC endsteam \n")
	if got := streamExtent(data, 7, 1); got != 11 {
		t.Errorf("endsteam: %d", got)
	}
}

// TestPredictorParams runs the predictors over every parameter shape:
// nothing panics, no row grows.
func TestPredictorParams(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	data := make([]byte, 5000)
	rng.Read(data)
	for _, pred := range []int64{2, 10, 11, 12, 13, 14, 15} {
		for _, bpc := range []int64{1, 2, 4, 5, 8, 12, 16} {
			for _, colors := range []int64{1, 3, 4} {
				for _, cols := range []int64{1, 5, 17, 100} {
					parms := dict{"Predictor": pred, "BitsPerComponent": bpc, "Colors": colors, "Columns": cols}
					b := newBudget(testLimits.withDefaults(), time.Now())
					v, err := lenientChain(zlibBytes(data), []filter{{name: "FlateDecode", parms: parms}}, b, &inflaters{})
					if err != nil || len(v.data) > len(data) {
						t.Fatalf("%v: err %v, %d bytes out of %d", parms, err, len(v.data), len(data))
					}
				}
			}
		}
	}
	// TIFF, 8 bits, three colors: a round trip.
	in := make([]byte, 3*40*10)
	rng.Read(in)
	enc := make([]byte, len(in))
	for i := range in {
		if i%120 < 3 {
			enc[i] = in[i]
		} else {
			enc[i] = in[i] - in[i-3]
		}
	}
	b := newBudget(testLimits.withDefaults(), time.Now())
	v, err := lenientChain(zlibBytes(enc), []filter{{name: "Fl", parms: dict{"Predictor": int64(2), "Colors": int64(3), "Columns": int64(40)}}}, b, &inflaters{})
	if err != nil || !bytes.Equal(v.data, in) {
		t.Fatalf("TIFF round trip: err %v, %d bytes", err, len(v.data))
	}
	// Parameters pdf.js refuses, or rows too long: not decoded.
	for _, parms := range []dict{{"Predictor": int64(5)}, {"Predictor": int64(12), "Columns": int64(1 << 40)}, {"Predictor": int64(12), "Colors": int64(-1)}} {
		v, _ := lenientChain(zlibBytes(data), []filter{{name: "FlateDecode", parms: parms}}, newBudget(testLimits.withDefaults(), time.Now()), &inflaters{})
		if v.result != undecoded {
			t.Errorf("%v: %v", parms, v.result)
		}
	}
}
