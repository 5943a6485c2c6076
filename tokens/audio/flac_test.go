package audio

import (
	"encoding/binary"
	"testing"
	"time"
)

func TestFLAC(t *testing.T) {
	// 4096 samples at 44.1 kHz (block-size code 12, rate code 9), a
	// constant subframe's worth of payload.
	f44 := func(i int) []byte { return flacFrame(12, 0, 9, 0, uint32(i), 3) }
	d44 := at(4096, 44100)
	frames := func(n int, f func(int) []byte) []byte {
		var b []byte
		for i := range n {
			b = append(b, f(i)...)
		}
		return b
	}
	picture := make([]byte, 4+5000)
	picture[0] = 6 // PICTURE, not last
	binary.BigEndian.PutUint32(picture, 6<<24|5000)
	withPicture := func(frames []byte) []byte {
		b := flacStream(44100, 0, frames)
		b[4] &^= 0x80 // STREAMINFO is no longer last
		out := append([]byte{}, b[:4+4+34]...)
		out = append(out, picture...)
		out[len(out)-5000-4] |= 0x80
		return append(out, b[4+4+34:]...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"frames naming their rate", flacStream(44100, 100*4096, frames(100, f44)), 100 * d44},
		{"frames at STREAMINFO's rate", flacStream(16000, 0, frames(100, func(i int) []byte { return flacFrame(12, 0, 0, 0, uint32(i), 40) })), 100 * 256 * time.Millisecond},
		{"explicit block size and rate", flacStream(44100, 0, frames(10, func(i int) []byte { return flacFrame(7, 1000, 13, 22050, uint32(i), 40) })), 10 * at(1000, 22050)},
		{"rate in kHz and tens of Hz", flacStream(44100, 0, flacFrame(6, 160, 12, 16000, 0, 9), flacFrame(6, 160, 14, 16000, 1, 9)), 2 * 10 * time.Millisecond},
		{"picture block", withPicture(frames(10, f44)), 10 * d44},
		{"two-byte frame numbers", flacStream(44100, 0, frames(300, f44)), 300 * d44},
		// A lie in STREAMINFO changes nothing.
		{"STREAMINFO total lies small", flacStream(44100, 1, frames(100, f44)), 100 * d44},
		{"STREAMINFO total lies large", flacStream(44100, 1<<35, frames(100, f44)), 100 * d44},
		// Silence compresses to almost nothing: 4096 samples at 8 kHz in 9
		// bytes. 16 kbit/s would make it 1/100 of its length.
		{"silence", flacStream(8000, 0, frames(1000, func(i int) []byte { return flacFrame(12, 0, 4, 0, uint32(i), 3) })), 1000 * 512 * time.Millisecond},
		// A metadata block that claims to run over the frames.
		{"metadata length lies", func() []byte {
			b := flacStream(44100, 0, frames(100, f44))
			b[4] = 0x00 // STREAMINFO, not last, then a block of 16 MiB
			return append(b[:42:42], append([]byte{0x81, 0xFF, 0xFF, 0xFF}, b[42:]...)...)
		}(), 100 * d44},
		{"bad CRC not counted", func() []byte {
			f := f44(0)
			f[5]++
			return flacStream(44100, 0, f44(0), f, f44(1))
		}(), 2 * d44},
		// FLAC frames without the "fLaC" header are still found.
		{"raw frames", frames(1000, func(i int) []byte { return flacFrame(12, 0, 4, 0, uint32(i), 3) }), 1000 * 512 * time.Millisecond},
		{"no STREAMINFO", []byte("fLaC"), 0},
	} {
		got := measure(tc.b, 0)
		if d := got - tc.want; d < 0 || d > 1000 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if p := measure(tc.b, 3); p != got {
			t.Errorf("%s in pieces of 3: %v, whole: %v", tc.name, p, got)
		}
	}
}

func TestFLACHeader(t *testing.T) {
	for _, tc := range []struct {
		b        []byte
		bs, rate int64
	}{
		{flacFrame(1, 0, 10, 0, 0, 0), 192, 48000},
		{flacFrame(2, 0, 10, 0, 0, 0), 576, 48000},
		{flacFrame(5, 0, 1, 0, 0, 0), 4608, 88200},
		{flacFrame(8, 0, 11, 0, 0, 0), 256, 96000},
		{flacFrame(15, 0, 3, 0, 0, 0), 32768, 192000},
		{flacFrame(6, 1, 0, 0, 0, 0), 1, 0},
		{flacFrame(7, 65536, 13, 1, 0, 0), 65536, 1},
		{flacFrame(12, 0, 14, 655350, 0, 0), 4096, 655350},
		{flacFrame(12, 0, 9, 0, 1<<15, 0), 4096, 44100},
	} {
		bs, rate, ok := flacHeader(tc.b)
		if !ok || bs != tc.bs || rate != tc.rate {
			t.Errorf("% x: %d %d %v, want %d %d", tc.b, bs, rate, ok, tc.bs, tc.rate)
		}
		for n := range len(tc.b) {
			if _, _, ok := flacHeader(tc.b[:n]); ok {
				t.Errorf("% x accepted from %d bytes", tc.b, n)
			}
		}
	}
	for _, b := range [][]byte{
		flacFrame(0, 0, 9, 0, 0, 0),   // block size code 0
		flacFrame(12, 0, 15, 0, 0, 0), // rate code 15
		flacFrame(12, 0, 12, 0, 0, 0), // explicit rate 0
		func() []byte { b := flacFrame(12, 0, 9, 0, 0, 0); b[1] = 0xFA; return b }(),
	} {
		if _, _, ok := flacHeader(b); ok {
			t.Errorf("% x accepted", b)
		}
	}
	// The CRC-8 of FLAC is CRC-8/ATM: its check value.
	if c := crc8([]byte("123456789")); c != 0xF4 {
		t.Errorf("crc8 check: %#x", c)
	}
}
