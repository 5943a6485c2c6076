package tokens_test

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"image/png"
	"mime/multipart"
	"runtime"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// The hostile corpus: request bodies built to make costing slow or large,
// each within the default caps (10 MiB a file, 11 MiB a body). Costing
// must stay within 5 ms of CPU plus 25 ms per MiB of body and 64 MiB of
// memory beyond the body (BenchmarkHostile shows the time; the tests
// below check the memory and the verdict).

type hostile struct {
	name   string
	format tokens.Format
	ct     string
	body   []byte
}

func zlibBytes(b []byte) []byte {
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	zw.Write(b)
	zw.Close()
	return z.Bytes()
}

// pdfOf lays objs out as a PDF (object i+1 is objs[i], 1 the catalog)
// with a classic xref table.
func pdfOf(objs []string) []byte {
	var out bytes.Buffer
	out.WriteString("%PDF-1.7\n")
	offs := make([]int, len(objs))
	for i, o := range objs {
		offs[i] = out.Len()
		fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\n", i+1, o)
	}
	x := out.Len()
	fmt.Fprintf(&out, "xref\n0 %d\n0000000000 65535 f \n", len(objs)+1)
	for _, o := range offs {
		fmt.Fprintf(&out, "%010d 00000 n \n", o)
	}
	fmt.Fprintf(&out, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(objs)+1, x)
	return out.Bytes()
}

func stream(dict string, data []byte) string {
	return fmt.Sprintf("<< %s /Length %d >>\nstream\n%s\nendstream", dict, len(data), data)
}

// pdfObjStmFonts is one page using n fonts that all live in one object
// stream, each with a ToUnicode CMap: a reader that decodes the object
// stream again for every object it takes from it does n² work.
func pdfObjStmFonts(n int) []byte {
	// 1 catalog, 2 pages, 3 page, 4 content, 5 cmap, 6 objstm (fonts 7…)
	var fonts, content strings.Builder
	var index, objs strings.Builder
	content.WriteString("BT 12 TL 72 720 Td\n")
	for i := 0; i < n; i++ {
		id := 7 + i
		fmt.Fprintf(&fonts, "/F%d %d 0 R ", i, id)
		fmt.Fprintf(&content, "/F%d 12 Tf (font %d) Tj T*\n", i, i)
		fmt.Fprintf(&index, "%d %d ", id, objs.Len())
		objs.WriteString("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /ToUnicode 5 0 R >> ")
	}
	content.WriteString("ET\n")
	cmap := "/CIDInit /ProcSet findresource begin 12 dict begin begincmap 1 begincodespacerange <00> <FF> endcodespacerange 1 beginbfrange <20> <7E> <0020> endbfrange endcmap end end"
	objstm := index.String() + objs.String()
	return pdfOf([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << " + fonts.String() + ">> >> /Contents 4 0 R >>",
		stream("/Filter /FlateDecode", zlibBytes([]byte(content.String()))),
		stream("/Filter /FlateDecode", zlibBytes([]byte(cmap))),
		stream(fmt.Sprintf("/Type /ObjStm /N %d /First %d /Filter /FlateDecode", n, len(index.String())), zlibBytes([]byte(objstm))),
	})
}

// pdfPages is n pages sharing one content stream.
func pdfPages(n int) []byte {
	objs := []string{"<< /Type /Catalog /Pages 2 0 R >>", "", stream("", []byte("BT /F1 12 Tf (x) Tj ET")),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"}
	var kids strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&kids, "%d 0 R ", 5+i)
		objs = append(objs, "<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 4 0 R >> >> /Contents 3 0 R >>")
	}
	objs[1] = fmt.Sprintf("<< /Type /Pages /Kids [%s] /Count %d >>", kids.String(), n)
	return pdfOf(objs)
}

// pdfBomb is one page whose content inflates to size bytes, through
// depth Flate filters.
func pdfBomb(size, depth int) []byte {
	data := bytes.Repeat([]byte("0 0 m "), size/6)
	filters := ""
	for range depth {
		data = zlibBytes(data)
		filters += "/FlateDecode "
	}
	return pdfOf([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>",
		stream("/Filter ["+filters+"]", data),
	})
}

// pdfManyStreams is n tiny unreferenced streams that each inflate 1000×.
func pdfManyStreams(n int) []byte {
	z := zlibBytes(make([]byte, 64<<10))
	objs := []string{"<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [] /Count 0 >>"}
	for range n {
		objs = append(objs, stream("/Filter /FlateDecode", z))
	}
	return pdfOf(objs)
}

func chatFile(filename string, data []byte) []byte {
	return []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"` + filename +
		`","file_data":"data:application/octet-stream;base64,` + base64.StdEncoding.EncodeToString(data) + `"}}]}]}`)
}

func multipartOf(fields int, file []byte, filename, ctype string) ([]byte, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i := 0; i < fields; i++ {
		w.WriteField(fmt.Sprintf("f%d", i), "x")
	}
	if file != nil {
		h := map[string][]string{"Content-Disposition": {`form-data; name="file"; filename="` + filename + `"`}, "Content-Type": {ctype}}
		p, _ := w.CreatePart(h)
		p.Write(file)
	}
	w.Close()
	return b.Bytes(), w.FormDataContentType()
}

// wavOf is a PCM WAV header claiming a huge data chunk, then n bytes.
func wavOf(n int) []byte {
	var b bytes.Buffer
	b.WriteString("RIFF\xff\xff\xff\xffWAVEfmt ")
	binary.Write(&b, binary.LittleEndian, []uint32{16})
	binary.Write(&b, binary.LittleEndian, []uint16{1, 1})
	binary.Write(&b, binary.LittleEndian, []uint32{8000, 16000})
	binary.Write(&b, binary.LittleEndian, []uint16{2, 16})
	b.WriteString("data\xff\xff\xff\xff")
	b.Write(make([]byte, n))
	return b.Bytes()
}

// mp3Frames is n of the smallest MPEG audio frames.
func mp3Frames(n int) []byte {
	// MPEG-2.5 layer III, 8 kbit/s, 8 kHz: 72*8000/8000 = 72 bytes a frame.
	frame := make([]byte, 72)
	copy(frame, []byte{0xFF, 0xE3, 0x18, 0xC4})
	return bytes.Repeat(frame, n)
}

func hostileCorpus() []hostile {
	var c []hostile
	add := func(name string, f tokens.Format, ct string, body []byte) {
		c = append(c, hostile{name, f, ct, body})
	}
	js := "application/json"
	add("pdf objstm 2000 fonts", tokens.FormatChat, js, chatFile("a.pdf", pdfObjStmFonts(2000)))
	add("pdf 6000 pages", tokens.FormatChat, js, chatFile("a.pdf", pdfPages(6000)))
	add("pdf bomb 30 MiB", tokens.FormatChat, js, chatFile("a.pdf", pdfBomb(30<<20, 1)))
	add("pdf bomb chained x3", tokens.FormatChat, js, chatFile("a.pdf", pdfBomb(64<<20, 3)))
	add("pdf 2000 inflating streams", tokens.FormatChat, js, chatFile("a.pdf", pdfManyStreams(2000)))
	mp, ct := multipartOf(0, pdfObjStmFonts(2000), "a.pdf", "application/pdf")
	add("multipart pdf objstm", tokens.FormatSeedChat, ct, mp)
	mp, ct = multipartOf(200000, nil, "", "")
	add("multipart 200k tiny fields", tokens.FormatSeedChat, ct, mp)
	mp, ct = multipartOf(0, wavOf(8<<20), "a.wav", "audio/wav")
	add("wav 8 MiB", tokens.FormatSeedChat, ct, mp)
	mp, ct = multipartOf(0, mp3Frames(100000), "a.mp3", "audio/mpeg")
	add("mp3 100k tiny frames", tokens.FormatSeedChat, ct, mp)
	add("json deep", tokens.FormatChat, js, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"x","meta":`+strings.Repeat(`[`, 250)+strings.Repeat(`]`, 250)+`}]}`))
	add("json 500k members", tokens.FormatChat, js, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"metadata":{`+strings.TrimSuffix(strings.Repeat(`"a":1,`, 500000), ",")+`}}`))
	add("json escapes", tokens.FormatChat, js, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"`+strings.Repeat(`\u00e9`, 1<<20)+`"}]}`))
	add("json 100k remote images", tokens.FormatChat, js, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[`+
		strings.TrimSuffix(strings.Repeat(`{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}},`, 100000), ",")+`]}]}`))
	var big bytes.Buffer
	png.Encode(&big, noiseImage(1500, 1500))
	add("png 9 MB", tokens.FormatChat, js, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+base64.StdEncoding.EncodeToString(big.Bytes())+`"}}]}]}`))
	return c
}

// BenchmarkHostile reports each hostile body's costing time per MiB of
// body (ms/MiB; the bound is 25 plus 5 ms a request) and its allocation.
func BenchmarkHostile(b *testing.B) {
	tk := tokens.New()
	tk.Preload()
	for _, h := range hostileCorpus() {
		b.Run(h.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(h.body)))
			for b.Loop() {
				tk.Estimate(tokens.Request{Format: h.format, ContentType: h.ct, Body: bytes.NewReader(h.body), Size: int64(len(h.body))}, 100000)
			}
			mib := float64(len(h.body)) / (1 << 20)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6/mib, "ms/MiB")
		})
	}
}

// TestHostileBounded: every hostile body is costed (or refused as over the
// cap) with at most 64 MiB allocated beyond the body, never an error but
// a 400's.
func TestHostileBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a corpus of large bodies")
	}
	tk := tokens.New()
	tk.Preload()
	for _, h := range hostileCorpus() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		est, err := tk.Estimate(tokens.Request{Format: h.format, ContentType: h.ct, Body: bytes.NewReader(h.body), Size: int64(len(h.body))}, 100000)
		runtime.ReadMemStats(&after)
		alloc := int64(after.TotalAlloc - before.TotalAlloc)
		t.Logf("%-28s %8.2f MiB body, %7.2f MiB allocated, %d tokens, stopped %v, err %v",
			h.name, float64(len(h.body))/(1<<20), float64(alloc)/(1<<20), est.Tokens, est.Stopped, err)
		if err != nil && !strings.Contains(err.Error(), "invalid") {
			t.Errorf("%s: %v", h.name, err)
		}
		// Under the race detector sync.Pool keeps nothing, so what the
		// standard library allocates is not what the program does.
		if limit := int64(64<<20) + int64(len(h.body)); alloc > limit && !raceOn {
			t.Errorf("%s: %d MiB allocated costing a %d MiB body", h.name, alloc>>20, len(h.body)>>20)
		}
	}
}
