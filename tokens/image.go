package tokens

import (
	"bytes"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
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
