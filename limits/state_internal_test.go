package limits

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var stateT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// stateStore is a store holding counters of every kind: exact windows,
// grouped slots, buckets.
func stateStore(tb testing.TB, keys int) *Memory {
	m := NewMemory(MemoryOptions{})
	rules := []*Rule{
		{Name: "chat_rpm", Algorithm: SlidingWindow, Limit: 5, Window: time.Minute},
		{Name: "tokens", Algorithm: SlidingWindow, Limit: 5000, Window: time.Hour},
		{Name: "bucket", Algorithm: TokenBucket, Limit: 10, Window: time.Minute, Burst: 4},
	}
	out := make([]Decision, 1)
	for i := range keys {
		r := rules[i%len(rules)]
		h := []Hit{{Rule: r, Key: KeyOf("caller", fmt.Sprint("ip:", i)), Cost: 1 + int64(i%3)}}
		for j := range 3 {
			if _, err := m.Decide(context.Background(), h, stateT0.Add(time.Duration(i+j*1000)*time.Millisecond), out); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return m
}

// failAfter fails every write past n bytes.
type failAfter struct {
	w io.Writer
	n int
}

var errDiskFull = errors.New("disk full")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n, _ := f.w.Write(p[:f.n])
		f.n = 0
		return n, errDiskFull
	}
	f.n -= len(p)
	return f.w.Write(p)
}

// A file saved by the first format version still loads: 12 counters (4
// windows of 3 admissions, 4 of grouped slots, 4 buckets) saved at 5 s.
func TestStateFormatV1(t *testing.T) {
	b, err := os.ReadFile("testdata/state-v1")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMemory(MemoryOptions{})
	st, err := m.ReadState(bytes.NewReader(b), stateT0.Add(5*time.Second))
	if err != nil || st.Loaded != 12 || !st.SavedAt.Equal(stateT0.Add(5*time.Second)) {
		t.Fatalf("testdata/state-v1: %+v, %v; want 12 counters saved at 5 s", st, err)
	}
	var again bytes.Buffer
	if _, err := m.WriteState(&again, stateT0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	l := NewMemory(MemoryOptions{})
	if st, err := l.ReadState(&again, stateT0.Add(5*time.Second)); err != nil || st.Loaded != 12 {
		t.Fatalf("saved again: %+v, %v", st, err)
	}
}

// A save that fails midway leaves the previous file as it was and no
// temporary file.
func TestSaveStateFileWriteFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	m := stateStore(t, 3000)
	now := stateT0.Add(5 * time.Second)
	if _, err := SaveStateFile(path, m, now); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 5, 100, len(good) / 2, len(good) - 1} {
		_, err := saveStateFile(path, stateStore(t, 4000), now, func(w io.Writer) io.Writer { return &failAfter{w: w, n: n} })
		if !errors.Is(err, errDiskFull) {
			t.Fatalf("failing after %d bytes: %v, want the write error", n, err)
		}
		if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, good) {
			t.Fatalf("failing after %d bytes: the previous file changed (%v)", n, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Fatalf("failing after %d bytes: the directory holds %d files, want 1", n, len(ents))
		}
	}
}

// FuzzLoadState: no stream makes ReadState panic or load past the
// store's bounds; what it loads is whole and can be saved and loaded
// again; a stream it refuses loads nothing. Each input is read as it is
// and with its SHA-256 appended, so that mutations reach the records
// behind the checksum (the seeds are saved streams without theirs).
func FuzzLoadState(f *testing.F) {
	var buf bytes.Buffer
	now := stateT0.Add(5 * time.Second)
	if _, err := stateStore(f, 30).WriteState(&buf, now); err != nil {
		f.Fatal(err)
	}
	body := buf.Bytes()[:buf.Len()-sha256.Size]
	f.Add(body)
	v1, err := os.ReadFile("testdata/state-v1")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(v1[:len(v1)-sha256.Size])
	f.Add(buf.Bytes())
	f.Add(body[:len(body)/2])
	f.Add(body[:len(stateMagic)+2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		sum := sha256.Sum256(b)
		checkLoad(t, b, now)
		checkLoad(t, append(b[:len(b):len(b)], sum[:]...), now)
	})
}

func checkLoad(t *testing.T, b []byte, now time.Time) {
	t.Helper()
	const maxKeys = 128
	m := NewMemory(MemoryOptions{MaxKeys: maxKeys})
	st, err := m.ReadState(bytes.NewReader(b), now)
	keys := int(m.Stats().Keys)
	if err != nil {
		if !errors.Is(err, ErrDamagedState) {
			t.Fatalf("error %v does not wrap ErrDamagedState", err)
		}
		if keys != 0 {
			t.Fatalf("a refused stream loaded %d counters", keys)
		}
		return
	}
	if keys > maxKeys || keys != st.Loaded {
		t.Fatalf("loaded %d counters (stats %+v), at most %d", keys, st, maxKeys)
	}
	for i := range m.shards {
		for k, e := range m.shards[i].m {
			if len(k.rule) > maxStateName || len(k.key) > maxStateName || e.w.size > maxSlots+1 || e.w.capacity() > maxSlots+1 || e.gen == 0 {
				t.Fatalf("counter out of bounds: rule %d bytes, key %d bytes, %d slots, gen %d", len(k.rule), len(k.key), e.w.size, e.gen)
			}
			used := int64(0)
			for j := 0; j < int(e.w.size); j++ {
				used += e.w.at(j).n
			}
			if !e.isBucket && used != e.w.used { // a bucket keeps its state in used
				t.Fatalf("window counts %d units in its slots and %d in all", used, e.w.used)
			}
			// Decide under the counter's own rule must not panic.
			r := &Rule{Name: k.rule, Algorithm: SlidingWindow, Limit: 3, Window: time.Duration(e.w.span), Burst: 3}
			if e.isBucket {
				r.Algorithm = TokenBucket
			}
			out := make([]Decision, 1)
			if _, err := m.Decide(context.Background(), []Hit{{Rule: r, Key: Key{s: k.key}, Cost: 1}}, now, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	var again bytes.Buffer
	n, err := m.WriteState(&again, now)
	if err != nil {
		t.Fatal(err)
	}
	l := NewMemory(MemoryOptions{})
	if st2, err := l.ReadState(&again, now); err != nil || st2.Loaded+st2.Expired != n {
		t.Fatalf("saving what was loaded: %d saved, reloaded %+v, %v", n, st2, err)
	}
}

// A save lets go of a shard's lock every copyBatch units of work while it
// ranges over the shard's map; counters added, restarted and dropped
// meanwhile (run with -race) leave every save whole and loadable.
func TestSaveYieldsWhileServing(t *testing.T) {
	ctx := context.Background()
	m := NewMemory(MemoryOptions{})
	full := &Rule{Name: "full", Algorithm: SlidingWindow, Limit: 1000, Window: time.Hour}
	for k := range 300 { // 1000 slots each: a shard holds several batches of work
		key := KeyOf("caller", fmt.Sprint("full-", k))
		e := &entry{w: window{span: int64(full.Window)}}
		for i := range 1000 {
			e.w.add(stateT0.Add(time.Duration(i)*time.Millisecond).UnixNano(), 1, full.Limit)
		}
		s := &m.shards[m.shardOf(full.Name, key.s)]
		e.gen = s.nextGen()
		s.m[stateKey{rule: full.Name, key: key.s}] = e
		m.keys.Add(1)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		churn := &Rule{Name: "churn", Algorithm: SlidingWindow, Limit: 5, Window: time.Hour}
		out := make([]Decision, 1)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := KeyOf("caller", fmt.Sprint("churn-", i%5000))
			m.Decide(ctx, []Hit{{Rule: churn, Key: k, Cost: 1}}, stateT0.Add(time.Second), out)
			if i%3 == 0 {
				m.Reset(ctx, full, KeyOf("caller", fmt.Sprint("full-", i%300)))
			}
			if i%5 == 0 { // restarts a counter: its rule's window changed
				changed := &Rule{Name: "full", Algorithm: SlidingWindow, Limit: 1000, Window: 2 * time.Hour}
				m.Decide(ctx, []Hit{{Rule: changed, Key: KeyOf("caller", fmt.Sprint("full-", (i+1)%300)), Cost: 1}}, stateT0.Add(time.Second), out)
			}
		}
	}()
	for range 10 {
		var buf bytes.Buffer
		n, err := m.WriteState(&buf, stateT0.Add(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		st, err := NewMemory(MemoryOptions{}).ReadState(&buf, stateT0.Add(2*time.Second))
		if err != nil || st.Loaded != n {
			t.Fatalf("save of %d counters loads %+v, %v", n, st, err)
		}
	}
	close(stop)
	<-done
}
