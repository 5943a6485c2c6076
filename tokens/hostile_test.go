package tokens_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"image/png"
	"mime/multipart"
	"runtime"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
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

// pdfBomb is one page whose content inflates to size bytes, through
// depth Flate filters.
func pdfBomb(size, depth int) []byte {
	data := bytes.Repeat([]byte("0 0 m "), size/6)
	filters := ""
	for range depth {
		data = testpdf.Zlib(data)
		filters += "/FlateDecode "
	}
	return testpdf.File([]string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>",
		testpdf.Stream("/Filter ["+filters+"]", data),
	})
}

// pdfManyStreams is n tiny unreferenced streams that each inflate 1000×.
func pdfManyStreams(n int) []byte {
	z := testpdf.Zlib(make([]byte, 64<<10))
	objs := []string{"<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [] /Count 0 >>"}
	for range n {
		objs = append(objs, testpdf.Stream("/Filter /FlateDecode", z))
	}
	return testpdf.File(objs)
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
	add("pdf objstm 2000 fonts", tokens.FormatChat, js, chatFile("a.pdf", testpdf.ObjStmFonts(2000, 0)))
	add("pdf 6000 pages", tokens.FormatChat, js, chatFile("a.pdf", testpdf.ManyPages(6000)))
	add("pdf bomb 30 MiB", tokens.FormatChat, js, chatFile("a.pdf", testpdf.Inflating(30<<20)))
	add("pdf bomb chained x3", tokens.FormatChat, js, chatFile("a.pdf", pdfBomb(64<<20, 3)))
	add("pdf 2000 inflating streams", tokens.FormatChat, js, chatFile("a.pdf", pdfManyStreams(2000)))
	mp, ct := multipartOf(0, testpdf.ObjStmFonts(2000, 0), "a.pdf", "application/pdf")
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
				tk.Estimate(tokens.Request{Format: h.format, ContentType: h.ct, Body: []byte(h.body)}, 100000)
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
		est, err := tk.Estimate(tokens.Request{Format: h.format, ContentType: h.ct, Body: []byte(h.body)}, 100000)
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
