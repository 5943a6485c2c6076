package tokens

import (
	"bytes"
	"image"
	"image/png"
	"testing"
)

// FuzzReadImage: the walk never panics, its spans lie inside the file and
// inside the checked structure, and a file it does not recognise has no
// byte of structure.
func FuzzReadImage(f *testing.F) {
	var b bytes.Buffer
	png.Encode(&b, image.NewGray(image.Rect(0, 0, 40, 30)))
	f.Add(b.Bytes())
	f.Add([]byte("\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xc0\x00\x0b\x08\x00\x10\x00\x20\x01\x01\x11\x00\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00\xd2\xcf\x20\xff\xd9"))
	f.Add([]byte("GIF89a\x02\x00\x02\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xfe\x03abc\x00,\x00\x00\x00\x00\x02\x00\x02\x00\x00\x02\x02D\x01\x00;"))
	f.Add([]byte("RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00\x2f\x07\xc0\x01\x00\x07\x10\x11\x11\x88\x88\xfe\x07\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, ok := readImage(data)
		if l.end < 0 || l.end > len(data) {
			t.Fatalf("end %d of %d bytes", l.end, len(data))
		}
		for _, s := range append(l.text, l.data...) {
			if s.from < 0 || s.from > s.to || s.to > l.end {
				t.Fatalf("span %v outside [0,%d)", s, l.end)
			}
		}
		if ok && (l.width <= 0 || l.height <= 0) {
			t.Fatalf("ok without a size: %+v", l)
		}
	})
}

// Each format's walk reads the size and accounts for the whole file.
func TestReadImageFormats(t *testing.T) {
	cases := map[string]struct {
		data []byte
		w, h int
	}{}
	var b bytes.Buffer
	png.Encode(&b, image.NewGray(image.Rect(0, 0, 40, 30)))
	cases["png"] = struct {
		data []byte
		w, h int
	}{b.Bytes(), 40, 30}
	cases["webp lossless"] = struct {
		data []byte
		w, h int
	}{[]byte("RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00\x2f\x07\xc0\x01\x00\x07\x10\x11\x11\x88\x88\xfe\x07\x00"), 8, 8}
	for name, c := range cases {
		l, ok := readImage(c.data)
		if !ok || l.width != c.w || l.height != c.h || l.end != len(c.data) {
			t.Errorf("%s: %+v ok=%v, want %dx%d to byte %d", name, l, ok, c.w, c.h, len(c.data))
		}
	}
}
