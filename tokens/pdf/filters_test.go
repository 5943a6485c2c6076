package pdf

import (
	"bytes"
	"encoding/ascii85"
	"encoding/hex"
	"fmt"
	"math/bits"
	"math/rand"
	"strings"
	"testing"
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

// TestFilterChains: every filter chain is decoded, and its text read whole,
// every byte of the file accounted for.
func TestFilterChains(t *testing.T) {
	content, text := attackContent(60_000)
	short, shortText := attackContent(20_000)
	for name, data := range filterCasesOf(content, short) {
		t.Run(name, func(t *testing.T) {
			o := readAllText(t, data, testLimits)
			if o.err != nil {
				t.Fatal(o.err)
			}
			w := text
			if name == "LZW alone" {
				w = shortText
			}
			got := strings.Join(strings.Fields(o.text), " ")
			w = strings.Join(strings.Fields(w), " ")
			if !strings.Contains(got, w[:len(w)-200]) {
				t.Errorf("read %d bytes of text, want %d: %.200q", len(got), len(w), got)
			}
			if o.raw != 0 && name != "short Length" && name != "Length 0" && name != "raw deflate" {
				t.Errorf("%d bytes costed as text", o.raw)
			}
		})
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
			r := newReader(nil, testLimits, nil)
			out, st := r.apply(lzwBytes(in, early), []filter{{"LZWDecode", dict{"EarlyChange": int64(early)}}})
			if st != decoded || !bytes.Equal(out, in) {
				t.Fatalf("%d bytes, early %d: %v, %d bytes back", len(in), early, st, len(out))
			}
		}
	}
	// A bomb: the budget stops it.
	r := newReader(nil, Limits{MaxDecoded: 1 << 20, MaxSteps: 1000}, nil)
	if _, st := r.apply(lzwZeros(3), []filter{{name: "LZW"}}); st != failed || !r.b.over {
		t.Fatalf("LZW bomb: %v, over %v", st, r.b.over)
	}
}

func TestPredictors(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	data := make([]byte, 5000)
	rng.Read(data)
	for typ := byte(0); typ <= 4; typ++ {
		for _, cols := range []int{1, 5, 17, 100} {
			r := newReader(nil, testLimits, nil)
			out, st := r.apply(zlibBytes(pngPredict(data, cols, typ)), []filter{{"FlateDecode", dict{"Predictor": int64(10 + typ), "Columns": int64(cols)}}})
			if st != decoded || !bytes.Equal(out[:min(len(out), len(data))], data) {
				t.Fatalf("PNG %d, %d columns: %v, %d bytes", typ, cols, st, len(out))
			}
		}
	}
	r := newReader(nil, testLimits, nil)
	out, st := r.apply(zlibBytes(tiffPredict(data, 40)), []filter{{"Fl", dict{"Predictor": int64(2), "Columns": int64(40)}}})
	if st != decoded || !bytes.Equal(out, data) {
		t.Fatalf("TIFF: %v, %d bytes", st, len(out))
	}
	// Every parameter shape: nothing panics, nothing grows.
	for _, pred := range []int64{2, 5, 10, 12, 15, 99} {
		for _, bpc := range []int64{-1, 1, 4, 8, 16, 1 << 40} {
			for _, cols := range []int64{-5, 1, 17, 1 << 40} {
				r := newReader(nil, testLimits, nil)
				out, _ := r.apply(zlibBytes(data), []filter{{"FlateDecode", dict{"Predictor": pred, "BitsPerComponent": bpc, "Columns": cols, "Colors": int64(3)}}})
				if len(out) > len(data) {
					t.Fatalf("%d %d %d: %d bytes", pred, bpc, cols, len(out))
				}
			}
		}
	}
}
