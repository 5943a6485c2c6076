package tokens_test

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math/rand/v2"
	"mime/multipart"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// noiseImage is an image whose encoding is about as large as it gets.
func noiseImage(w, h int) *image.RGBA {
	r := rand.New(rand.NewPCG(uint64(w), uint64(h)))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = byte(r.Uint32())
	}
	return img
}

func noisePNG(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, noiseImage(w, h)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encoded(t testing.TB, kind string, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	var err error
	switch kind {
	case "png":
		err = png.Encode(&b, noiseImage(w, h))
	case "jpeg":
		err = jpeg.Encode(&b, noiseImage(w, h), &jpeg.Options{Quality: 95})
	case "gif":
		p := image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black, color.White, color.Gray{Y: 128}})
		for i := range p.Pix {
			p.Pix[i] = byte(i * 7 % 3)
		}
		err = gif.Encode(&b, p, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The slots an image's bytes can be sent in, for one base64 payload.
func imageDresses(b64, mediaType string) map[string]struct {
	f    tokens.Format
	body string
} {
	return map[string]struct {
		f    tokens.Format
		body string
	}{
		"chat image_url": {tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:` + mediaType + `;base64,` + b64 + `","detail":"high"}}]}]}`},
		"chat file":      {tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"x.png","file_data":"data:` + mediaType + `;base64,` + b64 + `"}}]}]}`},
		"responses":      {tokens.FormatResponses, `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_image","detail":"high","image_url":"data:` + mediaType + `;base64,` + b64 + `"}]}]}`},
		"anthropic":      {tokens.FormatMessages, `{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"` + mediaType + `","data":"` + b64 + `"}}]}]}`},
	}
}

// A real image costs its price and nothing more, however large its
// encoding: the walk accounts for every byte.
func TestImageFilesPricedBySize(t *testing.T) {
	for _, kind := range []string{"png", "jpeg", "gif"} {
		data := encoded(t, kind, 1024, 1024)
		b64 := base64.StdEncoding.EncodeToString(data)
		for name, d := range imageDresses(b64, "image/"+kind) {
			got := estimate(t, d.f, "application/json", d.body, -1).Tokens
			// 765 for the image (4 tiles on gpt-4o), a few for the message.
			if got < 765 || got > 765+20 {
				t.Errorf("%s %s (%d bytes): %d tokens, want 765 and the message's few", kind, name, len(data), got)
			}
		}
		// The same file uploaded in a multipart form.
		body, ct := multipartFile(t, "photo."+kind, "image/"+kind, data)
		if got := estimateCT(t, tokens.FormatSeedChat, ct, body); got < 765 || got > 765+80 {
			t.Errorf("%s multipart: %d tokens", kind, got)
		}
	}
}

// A file whose first bytes are an image's and whose rest is prose costs
// the prose: only the bytes of a checked structure are the image.
func TestImageSignatureDoesNotHideProse(t *testing.T) {
	prose := strings.Repeat("The quarterly report shows that revenue grew in every region we serve. ", 1300) // ~95 KB
	proseTokens := estimate(t, tokens.FormatChat, "application/json", `{"model":"gpt-4o","messages":[{"role":"user","content":"`+prose+`"}]}`, -1).Tokens
	real := encoded(t, "png", 64, 64)
	jpg := encoded(t, "jpeg", 64, 64)
	disguises := map[string][]byte{
		"png signature":           append([]byte("\x89PNG\r\n\x1a\n"), prose...),
		"png then prose":          append(append([]byte{}, real...), prose...),
		"jpeg SOI":                append([]byte("\xff\xd8\xff\xe0"), prose...),
		"jpeg then prose":         append(append([]byte{}, jpg...), prose...),
		"jpeg comment of prose":   jpegWithComments(jpg, prose),
		"gif header":              append([]byte("GIF89a\x40\x00\x40\x00\x00\x00\x00"), prose...),
		"webp header":             append([]byte("RIFF\xff\xff\xff\x7fWEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x3f\x00\x00\x3f\x00\x00"), prose...),
		"png text chunk of prose": pngWithText(real, prose),
	}
	for name, data := range disguises {
		b64 := base64.StdEncoding.EncodeToString(data)
		for slot, d := range imageDresses(b64, "image/png") {
			if got := estimate(t, d.f, "application/json", d.body, -1).Tokens; got < proseTokens*9/10 {
				t.Errorf("%s in %s: %d tokens, the prose alone is %d", name, slot, got, proseTokens)
			}
		}
		body, ct := multipartFile(t, "notes.txt", "image/png", data)
		if got := estimateCT(t, tokens.FormatSeedChat, ct, body); got < proseTokens*9/10 {
			t.Errorf("%s uploaded: %d tokens, the prose alone is %d", name, got, proseTokens)
		}
	}
}

// jpegWithComments puts text in COM segments after SOI.
func jpegWithComments(jpg []byte, text string) []byte {
	out := append([]byte{}, jpg[:2]...)
	for len(text) > 0 {
		n := min(len(text), 60000)
		out = append(out, 0xFF, 0xFE, byte((n+2)>>8), byte(n+2))
		out = append(out, text[:n]...)
		text = text[n:]
	}
	return append(out, jpg[2:]...)
}

// pngWithText puts text in a tEXt chunk after IHDR, with a right CRC.
func pngWithText(p []byte, text string) []byte {
	var chunk bytes.Buffer
	body := append([]byte("Comment\x00"), text...)
	n := len(body)
	chunk.Write([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
	typed := append([]byte("tEXt"), body...)
	chunk.Write(typed)
	c := crc32IEEE(typed)
	chunk.Write([]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)})
	ihdrEnd := 8 + 8 + 13 + 4
	out := append([]byte{}, p[:ihdrEnd]...)
	out = append(out, chunk.Bytes()...)
	return append(out, p[ihdrEnd:]...)
}

func multipartFile(t testing.TB, filename, ctype string, data []byte) (string, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.WriteField("model", "gpt-4o")
	h := make(map[string][]string)
	h["Content-Disposition"] = []string{`form-data; name="file"; filename="` + filename + `"`}
	h["Content-Type"] = []string{ctype}
	part, err := w.CreatePart(h)
	if err != nil {
		t.Fatal(err)
	}
	part.Write(data)
	w.Close()
	return b.String(), w.FormDataContentType()
}

func estimateCT(t testing.TB, f tokens.Format, ct, body string) int {
	t.Helper()
	return estimate(t, f, ct, body, -1).Tokens
}

func crc32IEEE(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

// pngWithChunk puts a chunk of type typ and data body after IHDR, with a
// right CRC.
func pngWithChunk(p []byte, typ string, body []byte) []byte {
	var chunk bytes.Buffer
	n := len(body)
	chunk.Write([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
	typed := append([]byte(typ), body...)
	chunk.Write(typed)
	c := crc32.ChecksumIEEE(typed)
	chunk.Write([]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)})
	ihdrEnd := 8 + 8 + 13 + 4
	out := append([]byte{}, p[:ihdrEnd]...)
	out = append(out, chunk.Bytes()...)
	return append(out, p[ihdrEnd:]...)
}

// Prose in any chunk of a valid PNG — a private one, or compressed text —
// costs its text in an image slot too.
func TestPNGChunksOfProse(t *testing.T) {
	prose := strings.Repeat("Ship the quarterly numbers to the board together with the risk summary. ", 400)
	want := n(t, "gpt-4o", prose) * 9 / 10
	real := encoded(t, "png", 32, 32)
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write([]byte(prose))
	zw.Close()
	cases := map[string][]byte{
		"private prVt": pngWithChunk(real, "prVt", []byte(prose)),
		"zTXt":         pngWithChunk(real, "zTXt", append([]byte("Comment\x00\x00"), z.Bytes()...)),
		"iTXt packed":  pngWithChunk(real, "iTXt", append([]byte("Comment\x00\x01\x00\x00\x00"), z.Bytes()...)),
	}
	for name, data := range cases {
		for slot, d := range imageDresses(base64.StdEncoding.EncodeToString(data), "image/png") {
			if got := estimate(t, d.f, "application/json", d.body, -1).Tokens; got < want {
				t.Errorf("%s in %s: %d tokens, the prose %d", name, slot, got, want)
			}
		}
	}
}
