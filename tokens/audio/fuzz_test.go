package audio

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// FuzzMeter feeds random bytes in random pieces: the meter must not panic,
// must give the same duration however the bytes are cut (also for every
// prefix, asked for on the way), must cost every non-empty input something,
// and never less than 16 kbit/s for the bytes it did not read as audio.
func FuzzMeter(f *testing.F) {
	names := make([]string, 0)
	c := corpus()
	for name := range c {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		// Small inputs fuzz faster; a cut stream is a good input too.
		b := c[name]
		f.Add(b[:min(len(b), 1200)], uint64(i))
	}
	real := make([]string, 0, len(realFiles))
	for name := range realFiles {
		real = append(real, name)
	}
	sort.Strings(real)
	for i, name := range real {
		b, err := os.ReadFile(filepath.Join("testdata", "real", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 1200)], uint64(len(names)+i))
	}
	f.Fuzz(func(t *testing.T, b []byte, seed uint64) {
		whole := NewMeter("")
		whole.Write(b)
		want := whole.Duration()
		if len(b) > 0 && want <= 0 || want < 0 {
			t.Fatalf("duration %v for %d bytes", want, len(b))
		}
		if low := unread(whole); want < low {
			t.Fatalf("duration %v, less than the bytes not read as audio at 16 kbit/s: %v", want, low)
		}

		rng := rand.New(rand.NewPCG(seed, uint64(len(b))))
		m := NewMeter("")
		prefixes := 0
		for rest, n := b, 0; len(rest) > 0; {
			k := 1 + rng.IntN(min(len(rest), 1+rng.IntN(600)))
			m.Write(rest[:k])
			rest, n = rest[k:], n+k
			if checks := n * 4 / len(b); checks > prefixes { // about 4 prefixes
				prefixes = checks
				got := m.Duration()
				p := NewMeter("")
				p.Write(b[:n])
				if w := p.Duration(); got != w {
					t.Fatalf("after %d bytes in pieces: %v, in one piece: %v", n, got, w)
				}
			}
		}
		if got := m.Duration(); got != want {
			t.Fatalf("in pieces: %v, in one piece: %v", got, want)
		}
		if len(b) <= 256 {
			if got := measure(b, 1); got != want {
				t.Fatalf("byte by byte: %v, in one piece: %v", got, want)
			}
		}
	})
}

// unread is what the bytes a meter did not read as audio cost at
// 16 kbit/s (WAV chunks before the data: at the file's rate).
func unread(m *Meter) time.Duration {
	c := *m
	c.run(true)
	d := bytesNs(c.garbage, fallbackRate)
	if c.unknown {
		d = max(d, bytesNs(c.n-c.unknownFrom, fallbackRate))
	}
	if c.wav.seen {
		d = addSat(d, bytesNs(c.wav.junk, c.wav.junkRate()))
	}
	return time.Duration(d)
}
