package limits_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

var (
	stChat   = &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: 5, Window: time.Minute}
	stTokens = &limits.Rule{Name: "tokens", Algorithm: limits.SlidingWindow, Limit: 5000, Window: time.Minute, Settles: true}
	stDaily  = &limits.Rule{Name: "daily", Algorithm: limits.SlidingWindow, Limit: 3, Window: 24 * time.Hour}
	stBucket = &limits.Rule{Name: "bucket", Algorithm: limits.TokenBucket, Limit: 10, Window: time.Minute, Burst: 4}
)

// stateHits are the counters the round-trip tests fill: exact windows,
// grouped slots (limit > 1000), a daily window, token buckets with the
// rule's and their own limits.
func stateHits() []limits.Hit {
	var hs []limits.Hit
	for i := range 6 {
		k := limits.KeyOf("caller", fmt.Sprintf("ip:192.0.2.%d", i))
		hs = append(hs,
			limits.Hit{Rule: stChat, Key: k, Cost: 1},
			limits.Hit{Rule: stTokens, Key: k, Cost: 700},
			limits.Hit{Rule: stDaily, Key: k, Cost: 1},
			limits.Hit{Rule: stBucket, Key: k, Cost: 1},
			limits.Hit{Rule: stBucket, Key: limits.NewKey(limits.Part{Name: "caller", Value: k.String()}, limits.Part{Name: "tier", Value: "pro"}),
				Cost: 1, Own: true, Limit: 2, Burst: 3},
		)
	}
	return hs
}

// fillState decides the hits over 40 s of a fake clock (some admitted, some
// refused) and settles a few token charges, one of them over its
// reservation (a bucket in debt).
func fillState(t testing.TB, m *limits.Memory) time.Time {
	ctx := context.Background()
	hs := stateHits()
	out := make([]limits.Decision, 1)
	now := t0
	for round := range 8 {
		for i := range hs {
			if (i+round)%3 == 0 {
				continue
			}
			now = now.Add(137 * time.Millisecond)
			h := hs[i]
			if _, err := m.Decide(ctx, []limits.Hit{h}, now, out); err != nil {
				t.Fatal(err)
			}
			if round == 1 && out[0].Allowed && (h.Rule == stTokens || h.Rule == stBucket) {
				actual := h.Cost / 2
				if i%2 == 0 {
					actual = h.Cost + 3
				}
				if err := m.Settle(ctx, []limits.Settlement{{Hit: h, Ticket: out[0].Ticket, Actual: actual}}, now.Add(time.Second)); err != nil {
					t.Fatal(err)
				}
			}
		}
		now = now.Add(4 * time.Second)
	}
	return now
}

// sameAnswers drives a and b with the same Peeks and Decides at each time
// and fails on the first decision that differs.
func sameAnswers(t *testing.T, a, b *limits.Memory, hs []limits.Hit, times []time.Time) {
	t.Helper()
	ctx := context.Background()
	oa, ob := make([]limits.Decision, 1), make([]limits.Decision, 1)
	for _, now := range times {
		for _, h := range hs {
			for _, c := range []struct {
				peek bool
				cost int64
			}{{true, 0}, {true, 2}, {false, h.Cost}} {
				h := h
				h.Cost = c.cost
				op := a.Decide
				opb := b.Decide
				if c.peek {
					op, opb = a.Peek, b.Peek
				}
				ka, err := op(ctx, []limits.Hit{h}, now, oa)
				if err != nil {
					t.Fatal(err)
				}
				kb, err := opb(ctx, []limits.Hit{h}, now, ob)
				if err != nil {
					t.Fatal(err)
				}
				oa[0].Ticket, ob[0].Ticket = limits.Ticket{}, limits.Ticket{}
				if ka != kb || oa[0] != ob[0] {
					t.Fatalf("at %v, %s %q cost %d (peek %v): before the save %v %+v, after the load %v %+v",
						now.Sub(t0), h.Rule.Name, h.Key, h.Cost, c.peek, ka, oa[0], kb, ob[0])
				}
			}
		}
	}
}

// After a save and a load, possibly some time later, the restored store
// answers every Peek and Decide exactly as the original does.
func TestStateRoundTrip(t *testing.T) {
	for _, delay := range []time.Duration{0, 3 * time.Second, 50 * time.Second} {
		t.Run(fmt.Sprint("load after ", delay), func(t *testing.T) {
			orig := limits.NewMemory(limits.MemoryOptions{})
			saved := fillState(t, orig)
			var buf bytes.Buffer
			n, err := orig.WriteState(&buf, saved)
			if err != nil {
				t.Fatal(err)
			}
			orig.Sweep(saved) // what the save leaves out: counters with nothing left
			if keys := orig.Stats().Keys; int64(n) != keys || n < 20 {
				t.Fatalf("saved %d counters, the store holds %d", n, keys)
			}
			loaded := limits.NewMemory(limits.MemoryOptions{})
			st, err := loaded.ReadState(&buf, saved.Add(delay))
			if err != nil {
				t.Fatal(err)
			}
			if st.Loaded+st.Expired != n || st.Loaded == 0 || st.Kept != 0 || st.Dropped != 0 || !st.SavedAt.Equal(saved) {
				t.Fatalf("load stats %+v, want %d counters saved at %v", st, n, saved)
			}
			var times []time.Time
			for _, s := range []float64{0, 0.5, 1, 7, 19, 31, 44, 59, 61, 90, 130, 3600, 86400} {
				times = append(times, saved.Add(delay+time.Duration(s*float64(time.Second))))
			}
			sameAnswers(t, orig, loaded, stateHits(), times)
		})
	}
}

func TestStateDropsExpired(t *testing.T) {
	m := limits.NewMemory(limits.MemoryOptions{})
	saved := fillState(t, m)
	m.Sweep(saved)
	var buf bytes.Buffer
	n, err := m.WriteState(&buf, saved)
	if err != nil {
		t.Fatal(err)
	}
	// An hour later every 1 min window has emptied and every bucket has
	// refilled; the daily windows are left.
	l := limits.NewMemory(limits.MemoryOptions{})
	st, err := l.ReadState(&buf, saved.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if st.Loaded != 6 || st.Expired != n-6 || l.Stats().Keys != 6 {
		t.Fatalf("load stats %+v, %d keys; want the 6 daily windows of %d counters", st, l.Stats().Keys, n)
	}
	out := make([]limits.Decision, 1)
	for _, h := range stateHits() {
		h.Cost = 0
		l.Peek(context.Background(), []limits.Hit{h}, saved.Add(time.Hour), out)
		if h.Rule == stDaily && out[0].Remaining >= stDaily.Limit {
			t.Errorf("%s: daily window restored with nothing counted", h.Key)
		}
	}
}

func TestStateRuleChangedIsNew(t *testing.T) {
	ctx := context.Background()
	m := limits.NewMemory(limits.MemoryOptions{})
	key := limits.KeyOf("caller", "ip:192.0.2.1")
	for range 5 {
		allow(t, m, stChat, "ip:192.0.2.1", 1, t0)
	}
	var buf bytes.Buffer
	if _, err := m.WriteState(&buf, t0); err != nil {
		t.Fatal(err)
	}
	l := limits.NewMemory(limits.MemoryOptions{})
	if _, err := l.ReadState(&buf, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	out := make([]limits.Decision, 1)
	changed := []*limits.Rule{
		{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: 5, Window: 2 * time.Minute},
		{Name: "chat_rpm", Algorithm: limits.TokenBucket, Limit: 5, Window: time.Minute, Burst: 5},
	}
	for _, r := range changed {
		l.Peek(ctx, []limits.Hit{{Rule: r, Key: key, Cost: 1}}, t0.Add(time.Second), out)
		if !out[0].Allowed || out[0].Remaining != 4 {
			t.Errorf("%s %v: %+v, want a fresh counter", r.Algorithm, r.Window, out[0])
		}
	}
	// The rule as it was still refuses; a changed rule restarts the counter.
	if d := allow(t, l, stChat, "ip:192.0.2.1", 1, t0.Add(time.Second)); d.Allowed || d.RetryAfter != 59*time.Second {
		t.Errorf("unchanged rule: %+v, want refused for 59s", d)
	}
	if d := allow(t, l, changed[0], "ip:192.0.2.1", 1, t0.Add(2*time.Second)); !d.Allowed || d.Remaining != 4 {
		t.Errorf("changed window: %+v, want a fresh counter", d)
	}
}

// A counter the store already holds is kept; the file does not overwrite it.
func TestStateLoadKeepsExisting(t *testing.T) {
	m := limits.NewMemory(limits.MemoryOptions{})
	for range 4 {
		allow(t, m, stChat, "a", 1, t0)
	}
	allow(t, m, stChat, "b", 1, t0)
	var buf bytes.Buffer
	if _, err := m.WriteState(&buf, t0); err != nil {
		t.Fatal(err)
	}
	l := limits.NewMemory(limits.MemoryOptions{})
	allow(t, l, stChat, "a", 1, t0)
	st, err := l.ReadState(&buf, t0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Loaded != 1 || st.Kept != 1 {
		t.Fatalf("load stats %+v, want 1 loaded, 1 kept", st)
	}
	if d := allow(t, l, stChat, "a", 0, t0); d.Remaining != 4 {
		t.Errorf("existing counter: remaining %d, want 4 (not overwritten by the file's 1)", d.Remaining)
	}
	if d := allow(t, l, stChat, "b", 0, t0); d.Remaining != 4 {
		t.Errorf("loaded counter: remaining %d, want 4", d.Remaining)
	}
}

func TestStateRespectsMaxKeys(t *testing.T) {
	m := limits.NewMemory(limits.MemoryOptions{})
	for i := range 1000 {
		allow(t, m, stChat, fmt.Sprint("k", i), 1, t0)
	}
	var buf bytes.Buffer
	if _, err := m.WriteState(&buf, t0); err != nil {
		t.Fatal(err)
	}
	l := limits.NewMemory(limits.MemoryOptions{MaxKeys: 64})
	st, err := l.ReadState(&buf, t0)
	if err != nil {
		t.Fatal(err)
	}
	if keys := l.Stats().Keys; keys > 64 || int64(st.Loaded) != keys || st.Loaded+st.Dropped != 1000 || st.Dropped == 0 {
		t.Fatalf("load stats %+v, %d keys, want at most 64 loaded and the rest dropped", st, keys)
	}
}

// A ticket issued before the save names another counter than the
// restored one: its refund is not given to the restored counter.
func TestStateRestoredCounterIsNew(t *testing.T) {
	ctx := context.Background()
	m := limits.NewMemory(limits.MemoryOptions{})
	key := limits.KeyOf("caller", "a")
	h := limits.Hit{Rule: stTokens, Key: key, Cost: 3000}
	out := make([]limits.Decision, 1)
	m.Decide(ctx, []limits.Hit{h}, t0, out)
	ticket := out[0].Ticket
	var buf bytes.Buffer
	if _, err := m.WriteState(&buf, t0); err != nil {
		t.Fatal(err)
	}
	if err := m.Reset(ctx, stTokens, key); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadState(&buf, t0); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle(ctx, []limits.Settlement{{Hit: h, Ticket: ticket, Actual: 0}}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, m, stTokens, "a", 0, t0.Add(time.Second)); d.Remaining != 2000 {
		t.Errorf("remaining %d after settling an old ticket, want 2000 (the restored charge kept)", d.Remaining)
	}
}

// smallState is a saved store of a few counters of each kind.
func smallState(t testing.TB) []byte {
	m := limits.NewMemory(limits.MemoryOptions{})
	allow(t, m, stChat, "a", 1, t0)
	allow(t, m, stChat, "a", 1, t0.Add(time.Second))
	allow(t, m, stDaily, "b", 2, t0)
	allow(t, m, stBucket, "c", 3, t0)
	var buf bytes.Buffer
	if _, err := m.WriteState(&buf, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func wantDamaged(t *testing.T, b []byte, what string) error {
	t.Helper()
	m := limits.NewMemory(limits.MemoryOptions{})
	st, err := m.ReadState(bytes.NewReader(b), t0.Add(2*time.Second))
	if !errors.Is(err, limits.ErrDamagedState) {
		t.Fatalf("%s: err %v, want ErrDamagedState", what, err)
	}
	if keys := m.Stats().Keys; keys != 0 || st != (limits.LoadStats{}) {
		t.Fatalf("%s: %d counters loaded (%+v) from a damaged stream", what, keys, st)
	}
	return err
}

func TestStateDamaged(t *testing.T) {
	good := smallState(t)
	m := limits.NewMemory(limits.MemoryOptions{})
	if st, err := m.ReadState(bytes.NewReader(good), t0.Add(2*time.Second)); err != nil || st.Loaded != 3 {
		t.Fatalf("intact stream: %+v, %v", st, err)
	}
	for n := range len(good) {
		wantDamaged(t, good[:n], fmt.Sprintf("truncated to %d of %d bytes", n, len(good)))
	}
	for i := range len(good) {
		for _, bit := range []byte{0x01, 0x80} {
			b := bytes.Clone(good)
			b[i] ^= bit
			wantDamaged(t, b, fmt.Sprintf("byte %d xor %#x", i, bit))
		}
	}
	wantDamaged(t, append(bytes.Clone(good), 0), "a byte after the checksum")
	wantDamaged(t, nil, "empty")
	wantDamaged(t, []byte("garbage that is not a state file at all\n"), "garbage")

	b := bytes.Clone(good)
	b[len("RLPSTATE")] = 2 // the version
	if err := wantDamaged(t, b, "version 2"); !strings.Contains(err.Error(), "version 2") {
		t.Errorf("wrong version: %v, want the version named", err)
	}
}

func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	m := limits.NewMemory(limits.MemoryOptions{})
	fillState(t, m)

	l := limits.NewMemory(limits.MemoryOptions{})
	if st, err := limits.LoadStateFile(path, l, t0); err != nil || st != (limits.LoadStats{}) {
		t.Fatalf("missing file: %+v, %v; want nothing and no error", st, err)
	}
	now := t0.Add(time.Minute)
	n, err := limits.SaveStateFile(path, m, now)
	if err != nil || n == 0 {
		t.Fatalf("SaveStateFile: %d, %v", n, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if n2, err := limits.SaveStateFile(path, m, now); err != nil || n2 != n {
		t.Fatalf("second save over the first: %d, %v", n2, err)
	}
	if names := dirNames(t, dir); len(names) != 1 {
		t.Errorf("directory holds %v, want only the state file", names)
	}
	st, err := limits.LoadStateFile(path, l, now)
	if err != nil || st.Loaded == 0 || st.Loaded+st.Expired != n {
		t.Fatalf("LoadStateFile: %+v, %v; want %d counters", st, err, n)
	}

	// A save killed midway leaves a temporary file; the next load removes it.
	stale := path + ".tmp-123"
	if err := os.WriteFile(stale, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := limits.LoadStateFile(path, limits.NewMemory(limits.MemoryOptions{}), now); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); len(names) != 1 {
		t.Errorf("after a load the directory holds %v, want only the state file", names)
	}

	// A damaged file is reported as such.
	if err := os.WriteFile(path, []byte("RLPSTATE garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := limits.LoadStateFile(path, l, now); !errors.Is(err, limits.ErrDamagedState) {
		t.Errorf("damaged file: %v, want ErrDamagedState", err)
	}
	// Not a file at all: an error, but not damage.
	if _, err := limits.LoadStateFile(dir, l, now); err == nil || errors.Is(err, limits.ErrDamagedState) {
		t.Errorf("a directory as the state file: %v, want a read error", err)
	}
}

func TestSaveStateFileFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "missing", "state")
	if _, err := limits.SaveStateFile(path, limits.NewMemory(limits.MemoryOptions{}), t0); err == nil {
		t.Fatal("saving into a directory that does not exist succeeded")
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("a failed save left %v", names)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A save runs while requests are decided (run with -race): it sees each
// counter whole, and the loaded store never holds more than was admitted.
func TestSaveWhileServing(t *testing.T) {
	ctx := context.Background()
	m := limits.NewMemory(limits.MemoryOptions{})
	r := &limits.Rule{Name: "r", Algorithm: limits.SlidingWindow, Limit: 1_000_000, Window: time.Hour}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]limits.Decision, 1)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				h := limits.Hit{Rule: r, Key: limits.KeyOf("caller", fmt.Sprint(g, "-", i%500)), Cost: 1}
				m.Decide(ctx, []limits.Hit{h}, t0.Add(time.Duration(i)*time.Microsecond), out)
			}
		}()
	}
	for range 20 {
		var buf bytes.Buffer
		if _, err := m.WriteState(&buf, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := limits.NewMemory(limits.MemoryOptions{}).ReadState(&buf, t0); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
