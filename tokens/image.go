package tokens

import (
	"bytes"
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
// low detail costs the base; an image whose size is unknown (a remote URL,
// a format not read here) costs a 2048×2048 one; otherwise the image is
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
	if img.detail == "low" {
		return base
	}
	w, h := float64(img.width), float64(img.height)
	if img.width <= 0 || img.height <= 0 {
		w, h = 2048, 2048 // a size the proxy cannot read: the largest an image is sent at
	}
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
