package tokens

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
)

// The structure of an image file, as far as it checks out.
//
// An image is priced by its size (vision.go), but only the bytes of a
// structure this walk has checked are the image: a file whose first bytes
// look like a PNG signature and whose rest is prose is not an image of
// prose, it is prose. So a walk reports where the checked structure ends,
// and which ranges inside it are free text a format carries (comments,
// text chunks, EXIF) or pixel data that could be any bytes; the caller
// costs the rest, the free text, and pixel data that is text, as text.
//
// Each walk is one pass over the bytes, a step per chunk, segment or
// block, with no allocation sized by a number in the file.

// span is a byte range [from, to) of a file.
type span struct{ from, to int }

// imageLayout is what a walk of an image file found.
type imageLayout struct {
	width, height int
	end           int    // [0, end) is checked structure; what follows is not the image
	text          []span // free text inside the structure: costed as text
	data          []span // pixel data: costed as text too when its bytes are text
	packed        []span // zlib-compressed free text (PNG zTXt, iTXt): costed as the text it inflates to
}

// readImage walks data as a PNG, JPEG, GIF or WebP file, by its
// signature; ok is false when it is none of them (end is then 0: no byte
// is the image).
func readImage(data []byte) (l imageLayout, ok bool) {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		l = walkPNG(data)
	case bytes.HasPrefix(data, []byte("\xff\xd8")):
		l = walkJPEG(data)
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		l = walkGIF(data)
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		l = walkWebP(data)
	default:
		return imageLayout{}, false
	}
	return l, l.end > 0 && l.width > 0 && l.height > 0
}

// walkPNG checks chunk by chunk (length, type, CRC) up to IEND; the size
// is IHDR's, which must come first.
func walkPNG(data []byte) imageLayout {
	l := imageLayout{}
	for off := 8; off+12 <= len(data); {
		n := int(binary.BigEndian.Uint32(data[off:]))
		typ := data[off+4 : off+8]
		body := off + 8
		if n > len(data)-body-4 || !isChunkType(typ) ||
			crc32.ChecksumIEEE(data[off+4:body+n]) != binary.BigEndian.Uint32(data[body+n:]) {
			break
		}
		switch t := string(typ); {
		case off == 8 && (t != "IHDR" || n != 13):
			return imageLayout{}
		case t == "IHDR":
			l.width = int(binary.BigEndian.Uint32(data[body:]))
			l.height = int(binary.BigEndian.Uint32(data[body+4:]))
		case t == "IDAT" || t == "fdAT":
			l.data = append(l.data, span{body, body + n})
		case t == "PLTE" || t == "IEND":
		default:
			// Every other chunk (text, EXIF, private ones) may carry
			// text; compressed text is read as what it inflates to.
			l.text = append(l.text, span{body, body + n})
			if t == "zTXt" || t == "iTXt" {
				if z := zlibStart(data[body : body+n]); z >= 0 {
					l.packed = append(l.packed, span{body + z, body + n})
				}
			}
		}
		off = body + n + 4
		l.end = off
		if string(typ) == "IEND" {
			break
		}
	}
	return l
}

// zlibStart is where a zlib stream starts in a zTXt or iTXt chunk's data:
// the first zlib header after the keyword's NUL, within the few short
// fields (flags, language tag, translated keyword) that may come between
// (-1: none).
func zlibStart(b []byte) int {
	k := bytes.IndexByte(b, 0)
	for i := k + 1; k >= 0 && i+1 < len(b) && i <= k+260; i++ {
		if b[i] == 0x78 && (uint16(b[i])<<8|uint16(b[i+1]))%31 == 0 {
			return i
		}
	}
	return -1
}

func isChunkType(t []byte) bool {
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// walkJPEG checks marker by marker: segments by their length, the
// entropy-coded data after a scan header up to the next marker, to EOI.
// The size is the first frame header's.
func walkJPEG(data []byte) imageLayout {
	l := imageLayout{end: 2}
	off := 2
	for off+2 <= len(data) {
		if data[off] != 0xFF {
			break
		}
		m := data[off+1]
		switch {
		case m == 0xFF: // fill byte
			off++
			continue
		case m == 0xD9: // EOI
			l.end = off + 2
			return l
		case m >= 0xD0 && m <= 0xD7 || m == 0x01: // no length
			off += 2
			l.end = off
			continue
		case m == 0x00 || m == 0xD8:
			return l
		}
		if off+4 > len(data) {
			break
		}
		n := int(binary.BigEndian.Uint16(data[off+2:]))
		body, next := off+4, off+2+n
		if n < 2 || next > len(data) {
			break
		}
		switch {
		case isSOF(m) && l.width == 0 && n >= 7:
			l.height = int(binary.BigEndian.Uint16(data[body+1:]))
			l.width = int(binary.BigEndian.Uint16(data[body+3:]))
		case m == 0xFE || m >= 0xE0 && m <= 0xEF: // COM, APPn
			l.text = append(l.text, span{body, next})
		}
		off = next
		l.end = off
		if m == 0xDA { // SOS: entropy-coded data to the next marker
			end := scanEnd(data, off)
			l.data = append(l.data, span{off, end})
			off = end
			l.end = off
		}
	}
	return l
}

// isSOF reports a start-of-frame marker (not DHT, JPG or DAC).
func isSOF(m byte) bool {
	return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC
}

// scanEnd is where the entropy-coded data from off ends: at a 0xFF that
// is neither stuffed (FF 00) nor a restart marker.
func scanEnd(data []byte, off int) int {
	for {
		i := bytes.IndexByte(data[off:], 0xFF)
		if i < 0 || off+i+1 >= len(data) {
			return len(data)
		}
		off += i
		if m := data[off+1]; m != 0x00 && !(m >= 0xD0 && m <= 0xD7) {
			return off
		}
		off += 2
	}
}

// walkGIF checks the header, the color tables and every block to the
// trailer; image data and extensions are sub-block chains.
func walkGIF(data []byte) imageLayout {
	if len(data) < 13 {
		return imageLayout{}
	}
	l := imageLayout{
		width:  int(binary.LittleEndian.Uint16(data[6:])),
		height: int(binary.LittleEndian.Uint16(data[8:])),
	}
	off := 13 + colorTable(data[10])
	for off < len(data) {
		switch data[off] {
		case 0x3B: // trailer
			l.end = off + 1
			return l
		case 0x21: // extension: label, sub-blocks
			if off+2 > len(data) {
				return l
			}
			end, ok := subBlocks(data, off+2)
			if !ok {
				return l
			}
			if label := data[off+1]; label == 0xFE || label == 0x01 || label == 0xFF {
				l.text = append(l.text, span{off + 2, end})
			}
			off = end
		case 0x2C: // image descriptor, local color table, LZW size, sub-blocks
			if off+10 > len(data) {
				return l
			}
			start := off + 10 + colorTable(data[off+9]) + 1
			end, ok := subBlocks(data, start)
			if !ok {
				return l
			}
			l.data = append(l.data, span{start, end})
			off = end
		default:
			return l
		}
		l.end = off
	}
	return l
}

// colorTable is the size of the color table a packed-fields byte declares.
func colorTable(flags byte) int {
	if flags&0x80 == 0 {
		return 0
	}
	return 3 << (flags&7 + 1)
}

// subBlocks walks a chain of sub-blocks from off to its empty block and
// returns the offset after it.
func subBlocks(data []byte, off int) (int, bool) {
	for off < len(data) {
		n := int(data[off])
		off += 1 + n
		if n == 0 {
			return off, off <= len(data)
		}
	}
	return 0, false
}

// walkWebP checks the RIFF chunks; the size is VP8X's canvas, or the
// first VP8 or VP8L bitstream's.
func walkWebP(data []byte) imageLayout {
	l := imageLayout{}
	limit := min(len(data), 8+int(binary.LittleEndian.Uint32(data[4:])))
	for off := 12; off+8 <= limit; {
		n := int(binary.LittleEndian.Uint32(data[off+4:]))
		body := off + 8
		if n > limit-body {
			break
		}
		chunk := data[body : body+n]
		switch string(data[off : off+4]) {
		case "VP8X":
			if len(chunk) >= 10 && l.width == 0 {
				l.width = 1 + int(chunk[4]) | int(chunk[5])<<8 | int(chunk[6])<<16
				l.height = 1 + int(chunk[7]) | int(chunk[8])<<8 | int(chunk[9])<<16
			}
		case "VP8 ":
			if len(chunk) >= 10 && l.width == 0 && chunk[3] == 0x9d && chunk[4] == 0x01 && chunk[5] == 0x2a {
				l.width = int(binary.LittleEndian.Uint16(chunk[6:]) & 0x3fff)
				l.height = int(binary.LittleEndian.Uint16(chunk[8:]) & 0x3fff)
			}
			l.data = append(l.data, span{body, body + n})
		case "VP8L":
			if len(chunk) >= 5 && l.width == 0 && chunk[0] == 0x2f {
				b := binary.LittleEndian.Uint32(chunk[1:])
				l.width, l.height = 1+int(b&0x3fff), 1+int(b>>14&0x3fff)
			}
			l.data = append(l.data, span{body, body + n})
		case "EXIF", "XMP ", "ICCP":
			l.text = append(l.text, span{body, body + n})
		default:
			l.data = append(l.data, span{body, body + n})
		}
		off = body + n + n&1
		l.end = min(off, limit)
	}
	return l
}
