package audio

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// BenchmarkWrite writes 1 MiB of a stream per operation to one meter.
func BenchmarkWrite(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	random := make([]byte, 1<<20)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	mp3 := m128.frames(1 << 20 / m128.size())
	// Real MP3 payloads look random: fill the frames' payloads.
	mp3Random := append([]byte{}, mp3...)
	for i := 0; i < len(mp3Random); i += m128.size() {
		copy(mp3Random[i+4:i+m128.size()], random[i:])
	}
	// The attacker's choice: every frame followed by a stray byte (so its
	// payload is searched), payloads and garbage of 0xFF.
	ff := mpeg{ver: 0, layer: 3, kbps: 8, rate: 8000, payloadByte: 0xFF}
	var unconfirmed []byte
	for len(unconfirmed) < 1<<20 {
		unconfirmed = append(unconfirmed, ff.bytes()...)
		unconfirmed = append(unconfirmed, 0xFF)
	}
	allFF := bytes.Repeat([]byte{0xFF}, 1<<20)
	ff00 := bytes.Repeat([]byte{0xFF, 0x00}, 1<<19)
	headers := bytes.Repeat([]byte{0xFF, 0xFB, 0x90, 0x00}, 1<<18)
	for _, bc := range []struct {
		name       string
		head, body []byte
		piece      int
	}{
		{"mp3/zero-payload/32KiB", nil, mp3, 32 << 10},
		{"mp3/random-payload/32KiB", nil, mp3Random, 32 << 10},
		{"mp3/random-payload/1MiB", nil, mp3Random, 1 << 20},
		{"mp3/random-payload/512B", nil, mp3Random, 512},
		{"wav/32KiB", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16}.body()), chunk{"data", nil, 0}), random, 32 << 10},
		{"flac/32KiB", flacStream(44100, 0), random, 32 << 10},
		{"unknown/32KiB", []byte{0}, random, 32 << 10},
		{"adversarial/mp3-unconfirmed-0xFF/32KiB", nil, unconfirmed, 32 << 10},
		{"adversarial/unknown-0xFF/32KiB", []byte{0}, allFF, 32 << 10},
		{"adversarial/flac-0xFF/32KiB", flacStream(44100, 0), allFF, 32 << 10},
		{"adversarial/id3-0xFF/32KiB", id3(nil, 1<<28-1), allFF, 32 << 10},
		{"adversarial/unknown-0xFF00/32KiB", []byte{0}, ff00, 32 << 10},
		{"adversarial/id3-headers/32KiB", id3(nil, 1<<28-1), headers, 32 << 10},
		{"ogg-opus/32KiB", opusStream(1, nil), oggBody(random), 32 << 10},
		{"mp4-mdat/32KiB", cat(ftyp, append(u32(0), "mdat"...)), random, 32 << 10},
		{"webm-opus/32KiB", webmHead(), webmBody(random), 32 << 10},
		// Capture patterns everywhere: each is read as a page.
		{"adversarial/ogg-captures/32KiB", opusStream(1, nil), oggCaptures(), 32 << 10},
		{"adversarial/ogg-O/32KiB", opusStream(1, nil), oggInPage(bytes.Repeat([]byte("O"), 1<<20)), 32 << 10},
		{"adversarial/webm-resync/32KiB", cat(ebmlHead, []byte{0}), bytes.Repeat([]byte{0x1F, 0x43, 0xB6}, 1<<18), 32 << 10},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := NewMeter("")
			m.Write(bc.head)
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				for p := bc.body; len(p) > 0; {
					k := min(bc.piece, len(p))
					m.Write(p[:k])
					p = p[k:]
				}
			}
			if m.Duration() <= 0 {
				b.Fatal("no duration")
			}
		})
	}
}

// BenchmarkMeter measures a whole 1 MiB MP3 per operation, from a new
// meter to its duration.
func BenchmarkMeter(b *testing.B) {
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	mp3 := m128.frames(1 << 20 / m128.size())
	b.SetBytes(int64(len(mp3)))
	b.ReportAllocs()
	for b.Loop() {
		m := NewMeter("mp3")
		m.Write(mp3)
		if m.Duration() <= 0 {
			b.Fatal("no duration")
		}
	}
}

// oggCaptures is 1 MiB of page headers of 255 lacing values inside a page
// that runs over them.
func oggCaptures() []byte {
	inner := oggPage(1, 9, 0, 5, bytes.Repeat([]byte{255}, 255), nil)
	return oggInPage(bytes.Repeat(inner[:27+255], (1<<20)/(27+255)))
}

// oggInPage wraps b in pages of the largest size.
func oggInPage(b []byte) []byte {
	var out []byte
	for len(b) > 0 {
		n := min(len(b), 255*255)
		lace := bytes.Repeat([]byte{255}, n/255)
		lace = append(lace, byte(n%255))
		if len(lace) > 255 {
			n = 255 * 255
			lace = lace[:255]
		}
		out = append(out, oggPage(1, 9, 0, -1, lace, b[:n])...)
		b = b[n:]
	}
	return out
}
