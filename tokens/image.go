package tokens

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math"
	"strings"
)

// imageHead is how much of an image's data URL or base64 data is kept to
// read its dimensions: enough for a PNG or GIF header and for the frame
// header of most JPEGs (behind their EXIF block).
const imageHead = 64 << 10

// imageRef is an image part of a request: its detail and, when its data
// is inline, its dimensions.
type imageRef struct {
	present bool
	detail  string
	width   int
	height  int
}

// imageURL reads an OpenAI image_url: a URL string, or {"url","detail"}.
func (w *walker) imageURL(img *imageRef) error {
	img.present = true
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		return w.imageData(img, "")
	case '{':
		return w.j.object(func(key []byte) error {
			switch string(key) {
			case "url":
				return w.imageData(img, "")
			case "detail":
				s, err := w.stringOrSkip()
				img.detail = s
				return err
			}
			return w.j.skip()
		})
	}
	return w.j.skip()
}

// imageSource reads an Anthropic image source: {"type":"base64",
// "media_type","data"} or {"type":"url","url"}.
func (w *walker) imageSource(img *imageRef) error {
	img.present = true
	if ok, err := w.is('{'); !ok {
		return err
	}
	mediaType := ""
	return w.j.object(func(key []byte) error {
		switch string(key) {
		case "media_type":
			s, err := w.stringOrSkip()
			mediaType = s
			return err
		case "data":
			return w.imageData(img, mediaType)
		}
		return w.j.skip()
	})
}

// imageData reads a string holding a data URL (or, with mediaType, bare
// base64) and records the image's dimensions when its header decodes.
func (w *walker) imageData(img *imageRef, mediaType string) error {
	if ok, err := w.is('"'); !ok {
		return err
	}
	var head []byte
	err := w.j.str(func(p []byte) error {
		if room := imageHead - len(head); room > 0 {
			head = append(head, p[:min(room, len(p))]...)
		}
		return nil
	})
	if err != nil {
		return err
	}
	data := string(head)
	if mediaType == "" {
		// data:image/png;base64,....
		meta, rest, ok := strings.Cut(data, ",")
		if !ok || !strings.HasPrefix(meta, "data:") || !strings.HasSuffix(meta, ";base64") {
			return nil // a remote URL: dimensions unknown
		}
		mediaType, data = strings.TrimSuffix(strings.TrimPrefix(meta, "data:"), ";base64"), rest
	}
	img.width, img.height = imageSize(mediaType, data)
	return nil
}

// imageSize decodes the dimensions from the start of base64 image data;
// zero when they cannot be read.
func imageSize(mediaType, b64 string) (int, int) {
	b64 = strings.TrimRight(b64[:len(b64)/4*4], "=")
	raw, err := base64.RawStdEncoding.DecodeString(b64)
	if err != nil {
		return 0, 0
	}
	return imageSizeRaw(mediaType, raw)
}

// imageSizeRaw reads the dimensions from the start of a PNG, JPEG or GIF.
func imageSizeRaw(mediaType string, raw []byte) (int, int) {
	var cfg image.Config
	var err error
	r := bytes.NewReader(raw)
	switch mediaType {
	case "image/png":
		cfg, err = png.DecodeConfig(r)
	case "image/jpeg", "image/jpg":
		cfg, err = jpeg.DecodeConfig(r)
	case "image/gif":
		cfg, err = gif.DecodeConfig(r)
	default:
		return 0, 0
	}
	if err != nil {
		return 0, 0
	}
	return cfg.Width, cfg.Height
}

// openAITokens is OpenAI's published vision cost for tile-based models:
// low detail, or unknown dimensions, cost the base; otherwise the image is
// fitted in 2048×2048, its short side brought down to 768, and each 512 px
// tile costs the tile price on top of the base. "auto" is counted as high,
// the upper bound.
func (img imageRef) openAITokens(model string) int {
	base, tile := 85, 170
	m := strings.ToLower(model)
	switch {
	case strings.HasPrefix(m, "gpt-4o-mini"):
		base, tile = 2833, 5667
	case strings.HasPrefix(m, "gpt-5") && !strings.Contains(m, "mini") && !strings.Contains(m, "nano"):
		base, tile = 70, 140
	case strings.HasPrefix(m, "o1") || strings.HasPrefix(m, "o3"):
		base, tile = 75, 150
	}
	if img.detail == "low" || img.width <= 0 || img.height <= 0 {
		return base
	}
	w, h := float64(img.width), float64(img.height)
	if long := math.Max(w, h); long > 2048 {
		w, h = math.Floor(w*2048/long), math.Floor(h*2048/long)
	}
	if short := math.Min(w, h); short > 768 {
		w, h = math.Floor(w*768/short), math.Floor(h*768/short)
	}
	tiles := int(math.Ceil(w/512) * math.Ceil(h/512))
	return base + tile*tiles
}

// anthropicTokens is Anthropic's published estimate, width×height/750,
// after scaling the long edge down to 1568 px, at most ~1600 tokens; an
// image whose size is unknown is counted at that maximum.
func (img imageRef) anthropicTokens() int {
	const maxTokens = 1600
	if img.width <= 0 || img.height <= 0 {
		return maxTokens
	}
	w, h := float64(img.width), float64(img.height)
	if long := math.Max(w, h); long > 1568 {
		w, h = w*1568/long, h*1568/long
	}
	return min(int(math.Ceil(w*h/750)), maxTokens)
}
