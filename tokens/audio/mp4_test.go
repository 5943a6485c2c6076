package audio

import (
	"testing"
	"time"
)

var (
	lc44 = asc(2, 4, 0, 1, false) // AAC LC, 44.1 kHz
	// m4aHour declares an hour in mvhd and mdhd, after an mdat of 100 KB:
	// 44100 Hz, 155039 frames of 1024 samples.
	m4aHour = cat(ftyp, mdat(100000, false), box("moov",
		timeBox("mvhd", 0, 1000, 3600000),
		aacTrack(1, 44100, 3600*44100, lc44, 155039, 155039, 1024),
	))
	// m4aSmall is the same in about 1 KB.
	m4aSmall = cat(ftyp, box("moov",
		timeBox("mvhd", 0, 1000, 3600000),
		aacTrack(1, 44100, 3600*44100, lc44, 10, 10, 1024),
	), mdat(200, false))
)

func TestMP4(t *testing.T) {
	hour := time.Hour
	frames := func(n int64, rate int64) time.Duration { return at(n*1024, rate) }
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"moov after a large mdat", m4aHour, hour},
		{"moov first, small", m4aSmall, hour},
		{"64-bit mdat", cat(ftyp, mdat(50000, true), box("moov", timeBox("mvhd", 0, 1000, 3600000))), hour},
		{"mdat to the end of the file", cat(ftyp, box("moov", timeBox("mvhd", 0, 600, 600*3600)), append(u32(0), append([]byte("mdat"), make([]byte, 30000)...)...)), hour},
		{"version 1 headers", cat(ftyp, box("moov", timeBox("mvhd", 1, 90000, 90000*3600*2), box("trak", box("mdia", timeBox("mdhd", 1, 48000, 48000*3600*3))))), 3 * hour},
		{"mdhd says more than mvhd", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1000), aacTrack(1, 48000, 48000*60, lc44, 0))), time.Minute},
		{"stts says more", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1000), aacTrack(1, 48000, 48000, lc44, 0, 1000, 48000, 200, 48000*3))), 1600 * time.Second},
		// Every AAC frame decodes to 1024 samples, whatever the tables say.
		{"headers and stts lie small", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1), aacTrack(1, 44100, 1, lc44, 155039, 155039, 0)), mdat(155039*6, false)), frames(155039, 44100)},
		{"explicit SBR", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1), aacTrack(1, 48000, 1, asc(2, 6, 0, 2, true), 1000, 1000, 0))), frames(1000, 24000)},
		{"explicit rate", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1), aacTrack(1, 8000, 1, asc(2, 15, 8000, 1, false), 1000, 1000, 0))), frames(1000, 8000)},
		{"unknown duration", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 0xFFFFFFFF)), mdat(20000, false)), fallback(len(ftyp) + 8 + 108 + 20008)},
		{"no moov: its size", cat(ftyp, mdat(20000, false)), fallback(len(ftyp) + 20008)},
		{"timescale 0", cat(ftyp, box("moov", timeBox("mvhd", 0, 0, 1000)), mdat(2000, false)), fallback(len(ftyp) + 116 + 2008)},
		// Top-level boxes of no known type: their size at 16 kbit/s when
		// that is more.
		{"unknown box", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1000)), box("junk", pcm(100000))), fallback(100008)},
		{"bad box size", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 1000)), u32(3), pcm(50000)), fallback(50004)},
		// A movie without ftyp (QuickTime).
		{"no ftyp", cat(box("wide"), mdat(1000, false), box("moov", timeBox("mvhd", 0, 600, 600*90))), 90 * time.Second},
	} {
		got := measure(tc.b, 0)
		within(t, tc.name, got, tc.want, time.Millisecond)
		for _, p := range []int{1, 3, 7, 4096} {
			if q := measure(tc.b, p); q != got {
				t.Errorf("%s in pieces of %d: %v, whole %v", tc.name, p, q, got)
			}
		}
	}
}

// TestMP4Fragments: a fragmented file declares nothing in moov; its
// fragments' durations count, and AAC's samples.
func TestMP4Fragments(t *testing.T) {
	init := cat(ftyp, box("moov",
		timeBox("mvhd", 0, 1000, 0),
		aacTrack(1, 48000, 0, asc(2, 3, 0, 1, false), 0),
		box("mvex", fullBox("trex", 0, 0, u32(1), u32(1), u32(1024), u32(0), u32(0))),
	))
	frag := func(flags uint32, n int, tfhdDur uint32, dur uint32) []byte {
		tf := fullBox("tfhd", 0, 0, u32(1))
		if tfhdDur > 0 {
			tf = fullBox("tfhd", 0, 8, u32(1), u32(tfhdDur))
		}
		entries := []byte{}
		for range n {
			if flags&0x100 != 0 {
				entries = append(entries, u32(dur)...)
			}
			if flags&0x200 != 0 {
				entries = append(entries, u32(6)...)
			}
		}
		trun := fullBox("trun", 0, flags|1, u32(uint32(n)), u32(0), entries)
		return cat(box("moof", fullBox("mfhd", 0, 0, u32(1)), box("traf", tf, trun)), mdat(6*n, false))
	}
	frames := func(n int64) time.Duration { return at(n*1024, 48000) }
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"trex durations", cat(init, frag(0x200, 100, 0, 0), frag(0x200, 100, 0, 0)), frames(200)},
		{"tfhd durations", cat(init, frag(0x200, 100, 2048, 0)), frames(200)},
		{"trun durations", cat(init, frag(0x300, 100, 0, 4096)), frames(400)},
		{"durations lie small", cat(init, frag(0x300, 1000, 0, 1)), frames(1000)},
		{"mehd", cat(ftyp, box("moov", timeBox("mvhd", 0, 1000, 0), box("mvex", fullBox("mehd", 0, 0, u32(90000))))), 90 * time.Second},
	} {
		got := measure(tc.b, 0)
		within(t, tc.name, got, tc.want, time.Millisecond)
		if q := measure(tc.b, 5); q != got {
			t.Errorf("%s in pieces of 5: %v, whole %v", tc.name, q, got)
		}
	}
}

func TestMP4Pieces(t *testing.T) {
	whole := measure(m4aSmall, 0)
	for p := 1; p <= len(m4aSmall); p++ {
		if got := measure(m4aSmall, p); got != whole {
			t.Fatalf("in pieces of %d: %v, whole %v", p, got, whole)
		}
	}
}

func TestASC(t *testing.T) {
	for _, tc := range []struct {
		b           []byte
		rate, frame int64
	}{
		{lc44, 44100, 1024},
		{asc(2, 3, 0, 2, false), 48000, 1024},
		{asc(1, 11, 0, 1, false), 8000, 1024},
		{asc(2, 6, 0, 2, true), 24000, 1024},
		{asc(2, 15, 12345, 1, false), 12345, 1024},
		{[]byte{0x12, 0x0C}, 44100, 960}, // frameLengthFlag
		{asc(23, 3, 0, 1, false), 0, 0},  // AAC LD: not counted
		{asc(2, 13, 0, 1, false), 0, 0},  // reserved rate
		{[]byte{0x12}, 0, 0},
	} {
		rate, frame := ascAAC(tc.b)
		if rate != tc.rate || frame != tc.frame {
			t.Errorf("% x: %d %d, want %d %d", tc.b, rate, frame, tc.rate, tc.frame)
		}
	}
	if rate, _ := esdsAAC(esds(0x40, lc44)[8:]); rate != 44100 {
		t.Errorf("esds: %d", rate)
	}
	if rate, _ := esdsAAC(esds(0x6B, lc44)[8:]); rate != 0 {
		t.Errorf("esds of MP3: %d", rate)
	}
}
