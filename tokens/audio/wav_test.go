package audio

import (
	"testing"
	"time"
)

func TestWAV(t *testing.T) {
	pcm16 := wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16} // 32000 B/s
	m128 := mpeg{ver: 3, layer: 3, kbps: 128, rate: 44100}
	m8 := mpeg{ver: 0, layer: 3, kbps: 8, rate: 8000}
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"pcm16 mono", riff("RIFF", ck("fmt ", pcm16.body()), ck("data", pcm(48000))), 1500 * time.Millisecond},
		{"44.1 kHz stereo", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 2, rate: 44100, bits: 16}.body()), ck("data", pcm(176400))), time.Second},
		{"24-bit", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 2, rate: 48000, bits: 24}.body()), ck("data", pcm(2880))), 10 * time.Millisecond},
		{"float extensible", riff("RIFF", ck("fmt ", wavFmt{tag: 0xFFFE, ch: 2, rate: 48000, bits: 32, sub: 3}.body()), ck("data", pcm(38400))), 100 * time.Millisecond},
		{"pcm extensible", riff("RIFF", ck("fmt ", wavFmt{tag: 0xFFFE, ch: 1, rate: 24000, bits: 16, sub: 1}.body()), ck("data", pcm(4800))), 100 * time.Millisecond},
		{"µ-law", riff("RIFF", ck("fmt ", wavFmt{tag: 7, ch: 1, rate: 8000, bits: 8}.body()), ck("data", pcm(8000))), time.Second},
		{"odd data, padded", riff("RIFF", ck("fmt ", pcm16.body()), ck("data", pcm(31999))), time.Second},
		{"fmt after other chunks",
			riff("RIFF", ck("JUNK", pcm(27)), ck("fmt ", pcm16.body()), ck("data", pcm(32000))),
			at(28+32000, 32000)},
		{"trailing chunk counts as data",
			riff("RIFF", ck("fmt ", pcm16.body()), ck("data", pcm(32000)), ck("LIST", pcm(3200))),
			at(32000+8+3200, 32000)},
		{"RF64",
			riff("RF64", ck("ds64", make([]byte, 28)), ck("fmt ", pcm16.body()), chunk{"data", pcm(64000), 0xFFFFFFFF}),
			2 * time.Second},
		{"BW64", riff("BW64", ck("ds64", make([]byte, 28)), ck("fmt ", pcm16.body()), chunk{"data", pcm(3200), 0xFFFFFFFF}), 100 * time.Millisecond},

		// Lies about sizes: only the bytes present count.
		{"data size lies small", riff("RIFF", ck("fmt ", pcm16.body()), chunk{"data", pcm(320000), 32}), 10 * time.Second},
		{"data size lies large", riff("RIFF", ck("fmt ", pcm16.body()), chunk{"data", pcm(3200), 1 << 31}), 100 * time.Millisecond},
		{"data size 0 (streaming)", riff("RIFF", ck("fmt ", pcm16.body()), chunk{"data", pcm(3200), 0}), 100 * time.Millisecond},
		{"data size 0xFFFFFFFF", riff("RIFF", ck("fmt ", pcm16.body()), chunk{"data", pcm(3200), 0xFFFFFFFF}), 100 * time.Millisecond},
		{"second data chunk", riff("RIFF", ck("fmt ", pcm16.body()), ck("data", pcm(1600)), ck("data", pcm(1592))), 100 * time.Millisecond},
		{"chunk swallowing the data costs as data",
			riff("RIFF", ck("fmt ", pcm16.body()), chunk{"LIST", nil, 1 << 30}, ck("data", pcm(32000))),
			at(32008, 32000)},
		{"chunk before fmt, compressed: 16 kbit/s",
			riff("RIFF", ck("LIST", pcm(100)), ck("fmt ", wavFmt{tag: 0x11, ch: 1, rate: 8000, bits: 4, align: 256}.body()), ck("data", pcm(4000))),
			fallback(4100)},
		{"chunk before fmt, slow PCM: at its rate",
			riff("RIFF", ck("LIST", pcm(1000)), ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 1000, bits: 8}.body()), ck("data", pcm(1000))),
			2 * time.Second},

		// Lies about the format.
		{"byte rate lies high", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16, byteRate: 1 << 30}.body()), ck("data", pcm(32000))), time.Second},
		{"block align lies high", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16, align: 4000}.body()), ck("data", pcm(32000))), time.Second},
		{"byte rate lies low", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16, byteRate: 16000}.body()), ck("data", pcm(32000))), 2 * time.Second},
		{"two fmt chunks: the slower", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 2, rate: 48000, bits: 32}.body()), ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 8000, bits: 8}.body()), ck("data", pcm(8000))), time.Second},
		{"sample rate 0", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 0, bits: 16, byteRate: 32000}.body()), ck("data", pcm(32000))), fallback(32000)},
		{"block align 0", riff("RIFF", ck("fmt ", zeroAlign(pcm16.body())), ck("data", pcm(32000))), fallback(32000)},
		{"channels 0", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 0, rate: 16000, bits: 16, align: 2}.body()), ck("data", pcm(32000))), fallback(32000)},
		{"sample rate absurd", riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 4_000_000_000, bits: 16}.body()), ck("data", pcm(32000))), fallback(32000)},
		{"fmt too short", riff("RIFF", ck("fmt ", pcm16.body()[:14]), ck("data", pcm(32000))), fallback(32000 + 14)},
		{"fmt too short, then a good one", riff("RIFF", ck("fmt ", pcm16.body()[:14]), ck("fmt ", pcm16.body()), ck("data", pcm(32000))), fallback(32000 + 14)},
		{"no fmt", riff("RIFF", ck("data", pcm(32000))), fallback(32000)},
		{"compressed (IMA ADPCM)", riff("RIFF", ck("fmt ", wavFmt{tag: 0x11, ch: 1, rate: 8000, bits: 4, align: 256}.body()), ck("data", pcm(4000))), fallback(4000)},
		{"extensible, unknown subtype", riff("RIFF", ck("fmt ", wavFmt{tag: 0xFFFE, ch: 1, rate: 16000, bits: 16, sub: 0x11}.body()), ck("data", pcm(4000))), fallback(4000)},
		{"extensible without its extension", riff("RIFF", ck("fmt ", wavFmt{tag: 0xFFFE, ch: 1, rate: 16000, bits: 16, sub: 1}.body()[:18]), ck("data", pcm(4000))), fallback(4000)},

		// Compressed data is read like bytes of an unknown format: frames
		// it can find still count.
		{"FLAC in WAV (0xF1AC), silence",
			riff("RIFF", ck("fmt ", wavFmt{tag: 0xF1AC, ch: 1, rate: 8000, bits: 16, align: 1}.body()), ck("data", silentFLAC(1000))),
			1000 * 512 * time.Millisecond},
		{"compressed, then PCM fmt: the slower",
			riff("RIFF", ck("fmt ", wavFmt{tag: 0x11, ch: 1, rate: 8000, bits: 4, align: 256}.body()), ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 1000, bits: 8}.body()), ck("data", pcm(4000))),
			4 * time.Second},

		// MPEG audio in WAV is walked like an MP3.
		{"MPEG layer III in WAV",
			riff("RIFF", ck("fmt ", wavFmt{tag: 0x55, ch: 1, rate: 44100, align: 1, byteRate: 16000}.body()), ck("data", cat(m128.frames(10), m8.frames(10)))),
			10*m128.dur() + 10*m8.dur()},
		{"MPEG in WAV, PCM fmt too: the slower",
			riff("RIFF", ck("fmt ", wavFmt{tag: 0x55, ch: 1, rate: 44100, align: 1, byteRate: 16000}.body()), ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 8000, bits: 8}.body()), ck("data", m128.frames(10))),
			at(int64(10*m128.size()), 8000)},
	} {
		got := measure(tc.b, 0)
		// MPEG durations are summed per frame, each rounded up.
		if d := got - tc.want; d < 0 || d > 100 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if p := measure(tc.b, 7); p != got {
			t.Errorf("%s in pieces of 7: %v, whole: %v", tc.name, p, got)
		}
	}
}

// TestWAVHeaderOnly: a WAV with no data still costs something.
func TestWAVHeaderOnly(t *testing.T) {
	b := riff("RIFF", ck("fmt ", wavFmt{tag: 1, ch: 1, rate: 16000, bits: 16}.body()))
	if d := measure(b, 0); d <= 0 || Tokens(d) != 1 {
		t.Errorf("header only: %v", d)
	}
}

func zeroAlign(b []byte) []byte {
	b[12], b[13] = 0, 0
	return b
}

// silentFLAC is n FLAC frames of 4096 samples at 8 kHz, of 9 bytes each.
func silentFLAC(n int) []byte {
	var b []byte
	for i := range n {
		b = append(b, flacFrame(12, 0, 4, 0, uint32(i), 3)...)
	}
	return b
}
