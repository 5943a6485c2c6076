package limits

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// busyStore holds keys counters as a busy proxy does: each key's sliding
// window (CHAT_RPM = 20) holds 10 admissions spread over the last minute;
// every tenth key is a token bucket instead.
func busyStore(b *testing.B, keys int) (*Memory, time.Time) {
	m := NewMemory(MemoryOptions{})
	win := &Rule{Name: "chat_rpm", Algorithm: SlidingWindow, Limit: 20, Window: time.Minute}
	tb := &Rule{Name: "chat-per-user", Algorithm: TokenBucket, Limit: 20, Window: time.Minute, Burst: 20}
	out := make([]Decision, 1)
	hits := make([]Hit, 1)
	for j := range 10 {
		now := stateT0.Add(time.Duration(j) * 5 * time.Second)
		for i := range keys {
			hits[0] = Hit{Rule: win, Key: KeyOf("caller", fmt.Sprintf("key:%016x", i)), Cost: 1}
			if i%10 == 0 {
				hits[0].Rule = tb
			}
			if _, err := m.Decide(context.Background(), hits, now.Add(time.Duration(i)*time.Microsecond), out); err != nil {
				b.Fatal(err)
			}
		}
	}
	return m, stateT0.Add(46 * time.Second)
}

// BenchmarkSaveState saves 100k live counters: the encoding alone
// (WriteState to io.Discard), with the stream's size and the longest a
// shard stays locked while its counters are copied, and SaveStateFile.
func BenchmarkSaveState(b *testing.B) {
	const keys = 100_000
	m, now := busyStore(b, keys)
	var buf bytes.Buffer
	n, err := m.WriteState(&buf, now)
	if err != nil || n != keys {
		b.Fatalf("saved %d counters, %v", n, err)
	}
	size := buf.Len()

	b.Run("stream", func(b *testing.B) {
		// Requests go on while the state is saved: their latency shows how
		// long a save holds a shard's lock, against a baseline without.
		stop := peekWhile(m, now)
		time.Sleep(200 * time.Millisecond)
		idle999, idleMax := stop()
		stop = peekWhile(m, now)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.WriteState(io.Discard, now); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		p999, slowest := stop()
		b.ReportMetric(float64(size), "file-bytes")
		b.ReportMetric(float64(size)/keys, "bytes/key")
		b.ReportMetric(float64(p999)/1e3, "peek-p99.9-µs")
		b.ReportMetric(float64(slowest)/1e3, "peek-max-µs")
		b.ReportMetric(float64(idle999)/1e3, "idle-peek-p99.9-µs")
		b.ReportMetric(float64(idleMax)/1e3, "idle-peek-max-µs")
	})
	b.Run("file", func(b *testing.B) { // SaveStateFile: temp file, fsync, rename
		path := filepath.Join(b.TempDir(), "state")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := SaveStateFile(path, m, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// peekWhile peeks at m's keys in a loop until the returned stop is
// called, which returns the 99.9th percentile and the slowest of the
// peeks' latencies.
func peekWhile(m *Memory, now time.Time) (stop func() (p999, slowest time.Duration)) {
	win := &Rule{Name: "chat_rpm", Algorithm: SlidingWindow, Limit: 20, Window: time.Minute}
	hits := make([][]Hit, 1024)
	for i := range hits {
		hits[i] = []Hit{{Rule: win, Key: KeyOf("caller", fmt.Sprintf("key:%016x", i*97+1)), Cost: 0}}
	}
	done := make(chan struct{})
	result := make(chan []time.Duration)
	go func() {
		out := make([]Decision, 1)
		lat := make([]time.Duration, 0, 1<<20)
		for i := 0; ; i++ {
			select {
			case <-done:
				result <- lat
				return
			default:
			}
			start := time.Now()
			m.Peek(context.Background(), hits[i%len(hits)], now, out)
			if len(lat) < cap(lat) {
				lat = append(lat, time.Since(start))
			}
		}
	}()
	return func() (time.Duration, time.Duration) {
		close(done)
		lat := <-result
		slices.Sort(lat)
		return lat[len(lat)*999/1000], lat[len(lat)-1]
	}
}

// BenchmarkLoadState reads the 100k counters of BenchmarkSaveState back
// into an empty store.
func BenchmarkLoadState(b *testing.B) {
	const keys = 100_000
	m, now := busyStore(b, keys)
	var buf bytes.Buffer
	if _, err := m.WriteState(&buf, now); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		l := NewMemory(MemoryOptions{})
		st, err := l.ReadState(bytes.NewReader(buf.Bytes()), now)
		if err != nil || st.Loaded != keys {
			b.Fatalf("loaded %+v, %v", st, err)
		}
	}
}
