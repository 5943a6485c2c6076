package audio

import (
	"bytes"
	"testing"
	"time"
)

func TestMPEG(t *testing.T) {
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	m128p := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100, pad: true}
	m320 := mpeg{ver: 3, layer: 3, kbps: 320, rate: 32000}
	m8 := mpeg{ver: 0, layer: 3, kbps: 8, rate: 8000}
	free := mpeg{ver: 3, layer: 3, kbps: 0, rate: 48000}
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"CBR 128 kbit/s", m128.frames(100), 100 * m128.dur()},
		{"padding", cat(m128.bytes(), m128p.bytes(), m128.bytes(), m128p.bytes()), 4 * m128.dur()},
		{"MPEG-2 layer III", mpeg{ver: 2, layer: 3, kbps: 64, rate: 24000}.frames(50), 50 * 24 * time.Millisecond},
		{"MPEG-2.5 8 kbit/s", m8.frames(50), 50 * 72 * time.Millisecond},
		{"MPEG-1 layer II", mpeg{ver: 3, layer: 2, kbps: 192, rate: 48000}.frames(50), 50 * 24 * time.Millisecond},
		{"MPEG-1 layer I", mpeg{ver: 3, layer: 1, kbps: 32, rate: 32000}.frames(50), 50 * 12 * time.Millisecond},
		{"ID3v2 tag skipped", cat(id3(pcm(5000), -1), m128.frames(10)), 10 * m128.dur()},
		{"ID3v2 with footer", cat(id3(pcm(500), -1)[:5], []byte{0x10}, id3(pcm(500), -1)[6:], []byte("3DI\x04\x00\x10\x00\x00\x03\x74"), m128.frames(10)), 10 * m128.dur()},
		{"ID3v1 tag at the end", cat(m128.frames(10), []byte("TAG"), pcm(125)), 10 * m128.dur()},
		{"320 kbit/s first, then 8 kbit/s", cat(m320.bytes(), m8.frames(100)), 36*time.Millisecond + 100*72*time.Millisecond},
		{"garbage between frames", cat(m128.frames(5), pcm(1000), m8.frames(5)), 5*m128.dur() + fallback(1000) + 5*m8.dur()},
		{"garbage after frames", cat(m128.frames(5), pcm(4001)), 5*m128.dur() + fallback(4001)},
		{"truncated last frame", m128.frames(5)[:4*m128.size()+10], 5 * m128.dur()},
		{"free format", cat(m128.frames(2), free.header(), pcm(200)), 2*m128.dur() + free.dur() + fallback(4+200)},
		{"free format first", cat(free.header(), pcm(200)), free.dur() + fallback(4+200)},

		// A tag that lies large cannot hide the frames in it.
		{"ID3v2 size lies large", cat(id3(nil, 1<<27), m128.frames(10)), 10 * m128.dur()},
		{"ID3v2 size lies small", cat(id3(pcm(1000), 10), m128.frames(10)), fallback(990 + 10*m128.size())},
		{"ID3v2 size lies small, 8 kbit/s", cat(id3(pcm(1000), 10), m8.frames(10)), fallback(990) + 10*m8.dur()},
		// A false header swallowing real frames: it is not followed by a
		// frame, so the frames inside it count too.
		{"false frame hiding frames",
			cat(m320.header(), m8.frames(19), make([]byte, 68), []byte("xyz"), m8.frames(10)),
			36*time.Millisecond + 29*72*time.Millisecond + fallback(3)},
		// Bytes that are not a recognised format: the more of 16 kbit/s
		// and the frames found.
		{"unrecognised start, 8 kbit/s frames", cat([]byte("junk"), m8.frames(100)), fallback(4) + 100*m8.dur()},
		{"unrecognised start, 128 kbit/s frames", cat([]byte("junk"), m128.frames(100)), fallback(4 + 100*m128.size())},
	} {
		got := measure(tc.b, 0)
		// Each frame is rounded up to the nanosecond.
		if d := got - tc.want; d < 0 || d > 1000 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if p := measure(tc.b, 5); p != got {
			t.Errorf("%s in pieces of 5: %v, whole: %v", tc.name, p, got)
		}
	}
}

// TestMPEGHeader checks the frame lengths against the tables of the
// standards, for every valid header.
func TestMPEGHeader(t *testing.T) {
	n := 0
	for _, ver := range []int{3, 2, 0} {
		for layer := 1; layer <= 3; layer++ {
			family := 2
			if ver == 3 {
				family = 1
			}
			for _, kbps := range testKbps[[2]int{family, layer}] {
				for _, rate := range testRates[ver] {
					for _, pad := range []bool{false, true} {
						f := mpeg{ver: ver, layer: layer, kbps: kbps, rate: rate, pad: pad}
						h, ok := mpegHeader(f.header())
						if !ok || h.size != f.size() || time.Duration(h.ns)-f.dur() > 1 || time.Duration(h.ns) < f.dur() {
							t.Errorf("%+v: %+v %v, want size %d, %v", f, h, ok, f.size(), f.dur())
						}
						if h.size > 2881 {
							t.Errorf("%+v: frame of %d bytes", f, h.size)
						}
						n++
					}
				}
			}
		}
	}
	if n != 3*3*14*3*2 {
		t.Errorf("%d headers", n)
	}
	for _, b := range [][]byte{
		{0xFF, 0xEB, 0x90, 0}, // version 01
		{0xFF, 0xF9, 0x90, 0}, // layer 00
		{0xFF, 0xFB, 0xF0, 0}, // bitrate 15
		{0xFF, 0xFB, 0x9C, 0}, // sample rate 3
		{0xFF, 0x1B, 0x90, 0}, // no sync
	} {
		if _, ok := mpegHeader(b); ok {
			t.Errorf("% x accepted", b)
		}
	}
}

// TestMPEGConfirmedFrames: frames followed by frames are taken as read, so
// their payload is not searched (a real MP3's payload is full of byte
// patterns that look like headers).
func TestMPEGConfirmedFrames(t *testing.T) {
	f := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100, payloadByte: 0xFF}
	b := cat(f.frames(20), mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}.bytes())
	// 0xFF 0xFF 0xFF 0xFF is not a header; put header-like bytes inside.
	for i := 0; i < 20; i++ {
		copy(b[i*f.size()+100:], mpeg{ver: 0, layer: 3, kbps: 8, rate: 8000}.header())
	}
	if got, want := measure(b, 0), 21*f.dur(); got-want < 0 || got-want > 100 {
		t.Errorf("%v, want %v", got, want)
	}
}

func TestID3Len(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want int64
		ok   bool
	}{
		{[]byte("ID3\x04\x00\x00\x00\x00\x00\x00"), 10, true},
		{[]byte("ID3\x03\x00\x00\x00\x00\x02\x01"), 10 + 257, true},
		{[]byte("ID3\x04\x00\x10\x7f\x7f\x7f\x7f"), 20 + 1<<28 - 1, true},
		{[]byte("ID3\xff\x00\x00\x00\x00\x00\x00"), 0, false},
		{[]byte("ID3\x04\x00\x00\x80\x00\x00\x00"), 0, false},
		{[]byte("ID4\x04\x00\x00\x00\x00\x00\x00"), 0, false},
	} {
		n, ok := id3Len(tc.b)
		if n != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.b, n, ok, tc.want, tc.ok)
		}
	}
	_ = bytes.MinRead
}
