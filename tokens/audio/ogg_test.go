package audio

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// Opus packets: 20 ms of CELT (code 0), 120 ms as six empty 20 ms frames
// (code 3), 60 ms of SILK, 2.5 ms of CELT.
var (
	opus20    = []byte{31 << 3, 1, 2, 3, 4, 5, 6, 7, 8}
	opus120   = []byte{31<<3 | 3, 6}
	opus60    = []byte{3 << 3, 9, 9}
	opus2p5   = []byte{16 << 3, 1}
	opusHour  = opusStream(1, nil, repeat(opus120, 30000)...)
	opusSmall = opusStream(7, func(int64) int64 { return 3600*48000 + 312 }, repeat(opus20, 20)...)
)

// within checks that got is want or a little more (end trimming, a first
// Vorbis packet): never less.
func within(t *testing.T, name string, got, want, slack time.Duration) {
	t.Helper()
	if got < want || got > want+slack {
		t.Errorf("%s: %v, want %v (up to %v more)", name, got, want, slack)
	}
}

func TestOggOpus(t *testing.T) {
	// The review's file: an hour of 120 ms packets of empty frames, in
	// about 93 KB, granule positions and all.
	if n := len(opusHour); n > 95000 {
		t.Fatalf("the hour is %d bytes", n)
	}
	within(t, "an hour of empty frames", measure(opusHour, 0), time.Hour, 0)
	if got := Tokens(measure(opusHour, 0)); got != 36000 {
		t.Errorf("an hour of empty frames: %d tokens", got)
	}
	// A few pages declaring an hour in about 1 KB: the granule says so.
	if n := len(opusSmall); n > 1100 {
		t.Fatalf("the small hour is %d bytes", n)
	}
	within(t, "an hour declared", measure(opusSmall, 0), time.Hour, 0)

	mixed := [][]byte{opus20, opus60, opus2p5, opus120, opus20}
	mixedDur := (20 + 60 + 120 + 20) * time.Millisecond
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"packets of several sizes", opusStream(1, nil, mixed...), mixedDur + 2500*time.Microsecond},
		// Granule positions that lie small, or are not there: the
		// packets count.
		{"granules all -1", opusStream(1, func(int64) int64 { return -1 }, repeat(opus120, 3000)...), 360 * time.Second},
		{"granules 0", opusStream(1, func(int64) int64 { return 0 }, repeat(opus120, 3000)...), 360 * time.Second},
		{"granules negative", opusStream(1, func(int64) int64 { return -12345 }, repeat(opus20, 100)...), 2 * time.Second},
		// A large granule on a page that is not the last still counts.
		{"largest granule not last", func() []byte {
			b := opusStream(1, nil, repeat(opus20, 600)...)
			// The first audio page ends 255 packets in; make it claim an hour.
			i := bytes.Index(b[100:], []byte("OggS")) + 100
			i += bytes.Index(b[i+4:], []byte("OggS")) + 4
			binary.LittleEndian.PutUint64(b[i+6:], 3600*48000+312)
			return b
		}(), time.Hour},
	} {
		within(t, tc.name, measure(tc.b, 0), tc.want-6500*time.Microsecond, 6500*time.Microsecond)
	}
}

func TestOggPieces(t *testing.T) {
	// Small Ogg files, in pieces of every size.
	for name, b := range map[string][]byte{
		"opus":   opusSmall,
		"vorbis": vorbisStream(3, 44100, 8, 11, vorbisSetupHeader(1, vorbisSetupOpts{rich: true, modes: []bool{false, true}}), 7, func(int) int64 { return -1 }, repeat([]byte{0x00, 1, 2}, 40)...),
		"nested": nestedOgg(),
	} {
		whole := measure(b, 0)
		for p := 1; p <= len(b); p++ {
			if got := measure(b, p); got != whole {
				t.Fatalf("%s in pieces of %d: %v, whole %v", name, p, got, whole)
			}
		}
	}
}

// nestedOgg hides pages of a stream inside the body of a page whose CRC
// is wrong: a decoder drops the outer page and finds the inner ones.
func nestedOgg() []byte {
	head := opusStream(5, nil) // headers only
	inner := (&oggWriter{serial: 5, seq: 2, done: 2}).write(0, 4, 255, func(done int) int64 { return int64(done-2)*5760 + 312 }, repeat(opus120, 500)...)
	lace := bytes.Repeat([]byte{255}, len(inner)/255)
	lace = append(lace, byte(len(inner)%255))
	outer := oggPage(9, 0, 0, -1, lace, inner)
	outer[22]++ // a bad CRC
	return cat(head, outer)
}

func TestOggLies(t *testing.T) {
	hidden := 500 * 120 * time.Millisecond
	for _, tc := range []struct {
		name string
		b    []byte
		min  time.Duration
	}{
		// Pages inside a page with a wrong CRC cost at least what they hold.
		{"pages inside a bad page", nestedOgg(), hidden},
		// A page whose CRC is wrong still counts: it can only cost more.
		{"bad CRC, huge granule", func() []byte {
			b := opusStream(1, func(int64) int64 { return 7200*48000 + 312 }, repeat(opus20, 10)...)
			b[len(b)-1] ^= 0xFF
			return b
		}(), 2 * time.Hour},
		// Bytes between pages cost 16 kbit/s, on top of the audio.
		{"garbage between pages", func() []byte {
			b := opusStream(1, nil, repeat(opus20, 50)...)
			i := bytes.LastIndex(b, []byte("OggS"))
			return cat(b[:i], pcm(20000), b[i:])
		}(), time.Second + fallback(20000)},
		{"garbage after the pages", cat(opusStream(1, nil, repeat(opus20, 50)...), pcm(20000)), time.Second + fallback(20000)},
		// Streams one after the other (chained) and side by side
		// (multiplexed) add up.
		{"chained", cat(opusStream(1, nil, repeat(opus120, 100)...), opusStream(2, nil, repeat(opus120, 100)...)), 24 * time.Second},
		{"multiplexed", func() []byte {
			a := opusStream(1, nil, repeat(opus120, 300)...)
			b := opusStream(2, nil, repeat(opus120, 300)...)
			// Pages alternate: each stream's BOS first.
			pa, pb := splitPages(a), splitPages(b)
			out := cat(pa[0], pb[0])
			for i := 1; i < max(len(pa), len(pb)); i++ {
				if i < len(pa) {
					out = append(out, pa[i]...)
				}
				if i < len(pb) {
					out = append(out, pb[i]...)
				}
			}
			return out
		}(), 72 * time.Second},
		// A serial reused by a new stream (BOS again): both count.
		{"serial reused", cat(opusStream(1, nil, repeat(opus120, 100)...), opusStream(1, nil, repeat(opus120, 100)...)), 24 * time.Second},
		// More streams at once than the meter follows: the rest cost the
		// longest packet each.
		{"many streams", func() []byte {
			var heads, bodies []byte
			for s := range uint32(12) {
				p := splitPages(opusStream(100+s, nil, repeat(opus120, 50)...))
				heads = append(heads, p[0]...)
				for _, q := range p[1:] {
					bodies = append(bodies, q...)
				}
			}
			return cat(heads, bodies)
		}(), 12 * 6 * time.Second},
		// The table of streams overflows with streams that ended, then a
		// stream whose pages come after its EOS.
		{"pages after EOS", func() []byte {
			var out []byte
			for s := range uint32(10) {
				out = append(out, opusStream(200+s, nil, repeat(opus120, 10)...)...)
			}
			first := splitPages(opusStream(200, nil, repeat(opus120, 100)...))
			return append(out, first[len(first)-1]...) // more of stream 200
		}(), 10*1200*time.Millisecond + 100*120*time.Millisecond},
		// A page cut short.
		{"cut", func() []byte {
			b := opusStream(1, nil, repeat(opus120, 1000)...)
			return b[:len(b)-300]
		}(), time.Minute},
	} {
		got := measure(tc.b, 0)
		if got < tc.min {
			t.Errorf("%s: %v, want at least %v", tc.name, got, tc.min)
		}
		if p := measure(tc.b, 5); p != got {
			t.Errorf("%s in pieces of 5: %v, whole %v", tc.name, p, got)
		}
	}
	// What a decoder skips costs nothing: the header packets.
	within(t, "headers only", measure(opusStream(1, nil), 0), 0, fallback(len(opusStream(1, nil))))
}

// splitPages cuts an Ogg file into its pages.
func splitPages(b []byte) [][]byte {
	var pages [][]byte
	for len(b) >= 27 {
		n := 27 + int(b[26])
		for _, v := range b[27:n] {
			n += int(v)
		}
		pages = append(pages, b[:n])
		b = b[n:]
	}
	return pages
}

func TestOggVorbis(t *testing.T) {
	// Block sizes 256 and 2048 (exponents 8 and 11) at 44.1 kHz; packets
	// whose first byte is 0 use mode 0, 2 mode 1.
	short, long := []byte{0x00, 0xAA}, []byte{0x02, 0xAA, 0xBB}
	none := func(int) int64 { return -1 }
	d := func(samples int) time.Duration { return at(int64(samples), 44100) }
	mixed := append(repeat(long, 100), repeat(short, 8)...)
	mixed = append(mixed, repeat(long, 100)...)
	// long→long 1024, long→short 576, short→short 128, short→long 576.
	mixedSamples := 1024 + 99*1024 + 576 + 7*128 + 576 + 99*1024
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"modes read", vorbisStream(1, 44100, 8, 11, vorbisSetupHeader(1, vorbisSetupOpts{modes: []bool{false, true}}), 255, none, mixed...), d(mixedSamples)},
		{"rich setup header", vorbisStream(1, 44100, 8, 11, vorbisSetupHeader(1, vorbisSetupOpts{rich: true, modes: []bool{false, true}}), 255, none, mixed...), d(mixedSamples)},
		{"setup header over many pages", vorbisStream(1, 44100, 8, 11, vorbisSetupHeader(1, vorbisSetupOpts{rich: true, modes: []bool{false, true}}), 1, none, mixed...), d(mixedSamples)},
		// Modes hidden after the framing bit fool a reader that looks
		// from the end (every mode short); a decoder reads the real one.
		{"fake modes after the framing bit", vorbisStream(1, 44100, 6, 13,
			vorbisSetupHeader(1, vorbisSetupOpts{modes: []bool{true}, trailing: []byte{0x00, 0x00, 0x00, 0x00, 0x00, 0x02}}), 255, none,
			repeat([]byte{0x00}, 1000)...), d(1000 * 4096)},
		// A setup header that cannot be read: every block is long.
		{"broken setup header", vorbisStream(1, 44100, 8, 11, []byte("\x05vorbis\x00\x00\x00"), 255, none, repeat(short, 100)...), d(100 * 1024)},
		{"no setup header", vorbisStream(1, 44100, 8, 11, vorbisComment(), 255, none, repeat(short, 100)...), d(100 * 1024)},
		// Granule positions count when they say more.
		{"granule says more", vorbisStream(1, 44100, 8, 11, vorbisSetupHeader(1, vorbisSetupOpts{modes: []bool{false, true}}), 255, func(int) int64 { return 44100 * 3600 }, repeat(short, 10)...), time.Hour},
	} {
		within(t, tc.name, measure(tc.b, 0), tc.want, at(1024, 44100))
		if p := measure(tc.b, 3); p != measure(tc.b, 0) {
			t.Errorf("%s in pieces of 3: %v", tc.name, p)
		}
	}
}

func TestVorbisSetup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b     []byte
		ok    bool
		modes uint64
		n     uint8
	}{
		{"plain", vorbisSetupHeader(1, vorbisSetupOpts{modes: []bool{false, true}}), true, 2, 2},
		{"rich, stereo", vorbisSetupHeader(2, vorbisSetupOpts{rich: true, modes: []bool{true, false, true}}), true, 5, 3},
		{"rich, 6 channels", vorbisSetupHeader(6, vorbisSetupOpts{rich: true, modes: []bool{true}}), true, 1, 1},
		{"trailing bytes", vorbisSetupHeader(1, vorbisSetupOpts{modes: []bool{true}, trailing: []byte{0xFF, 0xFF}}), true, 1, 1},
		{"cut", vorbisSetupHeader(1, vorbisSetupOpts{modes: []bool{true}})[:30], false, 0, 0},
	} {
		for _, piece := range []int{1, 2, 7, 1 << 20} {
			var v vorbisSetup
			ch := uint8(1)
			if tc.name == "rich, stereo" {
				ch = 2
			}
			if tc.name == "rich, 6 channels" {
				ch = 6
			}
			v.start(ch)
			for b := tc.b; len(b) > 0; {
				k := min(piece, len(b))
				v.feed(b[:k])
				b = b[k:]
			}
			if v.ok != tc.ok || v.ok && (v.modes != tc.modes || v.nmodes != tc.n) {
				t.Errorf("%s in pieces of %d: ok %v modes %b of %d", tc.name, piece, v.ok, v.modes, v.nmodes)
			}
		}
	}
	for _, tc := range []struct{ entries, dims, want uint32 }{
		{81, 4, 3}, {80, 4, 2}, {1, 1, 1}, {1<<24 - 1, 1, 1<<24 - 1}, {1000, 3, 10}, {999, 3, 9}, {5, 30, 1},
	} {
		if got := lookup1Values(tc.entries, tc.dims); got != uint64(tc.want) {
			t.Errorf("lookup1Values(%d, %d) = %d, want %d", tc.entries, tc.dims, got, tc.want)
		}
	}
}

func TestOggFLACAndSpeex(t *testing.T) {
	none := func(int) int64 { return -1 }
	// FLAC in Ogg: each packet a frame of 4096 samples at 44.1 kHz.
	w := &oggWriter{serial: 4}
	var frames [][]byte
	for i := range 50 {
		frames = append(frames, flacFrame(12, 0, 9, 0, uint32(i), 20))
	}
	flac := w.write(2, 0, 255, func(int) int64 { return 0 }, flacOggHeader(44100))
	flac = append(flac, w.write(0, 4, 255, none, frames...)...)
	within(t, "FLAC frames", measure(flac, 0), 50*at(4096, 44100), time.Millisecond)
	// Frames at STREAMINFO's rate.
	w = &oggWriter{serial: 4}
	frames = frames[:0]
	for i := range 10 {
		frames = append(frames, flacFrame(12, 0, 0, 0, uint32(i), 20))
	}
	flac = w.write(2, 0, 255, func(int) int64 { return 0 }, flacOggHeader(8000))
	flac = append(flac, w.write(0, 4, 255, none, frames...)...)
	within(t, "FLAC frames at STREAMINFO's rate", measure(flac, 0), 10*512*time.Millisecond, time.Millisecond)

	// Speex: 2 frames of 320 samples a packet at 16 kHz, 40 ms.
	w = &oggWriter{serial: 6}
	spx := w.write(2, 0, 255, func(int) int64 { return 0 }, speexHeader(16000, 320, 2))
	spx = append(spx, w.write(0, 0, 255, func(int) int64 { return 0 }, []byte("comments"))...)
	spx = append(spx, w.write(0, 4, 255, none, repeat([]byte{1, 2, 3}, 100)...)...)
	within(t, "Speex", measure(spx, 0), 4*time.Second, time.Millisecond)
}

// TestOggNotOgg: bytes that start like Ogg but are no page cost 16 kbit/s.
func TestOggNotOgg(t *testing.T) {
	for _, b := range [][]byte{
		[]byte("OggS\x00\x02 this is not parsed"),
		append([]byte("OggS\x00\x02"), pcm(5000)...),
		oggPage(1, 0, 2, 0, []byte{5}, []byte("hello")), // a stream of no known codec
	} {
		if got, want := measure(b, 0), fallback(len(b)); got != want {
			t.Errorf("%.12q: %v, want %v", b, got, want)
		}
	}
}
