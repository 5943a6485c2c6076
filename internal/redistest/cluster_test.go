package redistest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

func TestSlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3 % 16384}, // the CRC-16/XMODEM check value
		{"foo", 12182},
		{"bar", 5061},
		{"{user1000}.following", redistest.Slot("user1000")},
		{"foo{bar}{zap}", redistest.Slot("bar")},
		{"foo{{bar}}zap", redistest.Slot("{bar")},
		{"foo{}{bar}", redistest.Slot("foo{}{bar}")}, // empty tag: the whole key
		{"", 0},
	} {
		if got := redistest.Slot(tc.key); got != tc.want {
			t.Errorf("Slot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

func TestCluster(t *testing.T) {
	ctx := context.Background()
	c := startCluster(t)

	masters := c.Masters()
	if len(masters) != 3 {
		t.Fatalf("Masters() = %v, want 3", masters)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	any := redis.NewClient(&redis.Options{Addr: masters[0].Addr})
	defer any.Close()

	// Write keys until every master holds one, checking on the way that
	// Slot agrees with CLUSTER KEYSLOT and MasterOf with CLUSTER SLOTS.
	seen := map[*redistest.Node]string{}
	for i := 0; len(seen) < len(masters); i++ {
		if i == 100 {
			t.Fatalf("100 keys reached only %d masters", len(seen))
		}
		key := fmt.Sprintf("k:%d", i)
		if i%2 == 1 {
			key = fmt.Sprintf("{tag%d}.suffix", i) // hash tags too
		}
		slot, err := any.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if int(slot) != redistest.Slot(key) {
			t.Fatalf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", key, redistest.Slot(key), slot)
		}
		m := c.MasterOf(key)
		if owner := slotOwner(t, any, int(slot)); owner != m.Addr {
			t.Fatalf("MasterOf(%q) = %s, CLUSTER SLOTS says %s", key, m.Addr, owner)
		}
		if err := cc.Set(ctx, key, key, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s through the cluster client: %v", key, err)
		}
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != key {
			t.Fatalf("GET %s through the cluster client = %q, %v", key, got, err)
		}
		// The key lives on MasterOf's node itself: a plain client gets it
		// there, with no MOVED.
		direct := redis.NewClient(&redis.Options{Addr: m.Addr})
		got, err := direct.Get(ctx, key).Result()
		direct.Close()
		if err != nil || got != key {
			t.Fatalf("GET %s on %s directly = %q, %v", key, m, got, err)
		}
		seen[m] = key
	}
	for m, key := range seen {
		t.Logf("%s serves %q (slot %d)", m, key, redistest.Slot(key))
	}
}

func TestClusterFailover(t *testing.T) {
	ctx := context.Background()
	c := startCluster(t)

	const key = "failover:{a}"
	old := c.MasterOf(key)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	if err := cc.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Make sure the replica has the key before the master dies.
	direct := redis.NewClient(&redis.Options{Addr: old.Addr})
	n, err := direct.Wait(ctx, 1, time.Second).Result()
	direct.Close()
	if err != nil || n != 1 {
		t.Fatalf("WAIT 1 on %s = %d, %v", old, n, err)
	}

	killed := time.Now()
	c.Kill(old)
	if redistest.Alive(old.PID) {
		t.Fatalf("%s: pid %d alive after Kill", old, old.PID)
	}
	promoted, at, err := c.WaitPromoted(old, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s promoted %v after %s was killed (settled %v after the kill)",
		promoted, at.Sub(killed).Round(time.Millisecond), old, time.Since(killed).Round(time.Millisecond))
	if promoted == old {
		t.Fatal("the dead master was reported promoted")
	}
	if m := c.MasterOf(key); m != promoted {
		t.Fatalf("MasterOf(%q) = %s after the failover, want %s", key, m, promoted)
	}
	if len(c.Masters()) != 3 {
		t.Fatalf("Masters() = %v after the failover, want 3", c.Masters())
	}

	// A fresh client writes at once.
	fresh := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer fresh.Close()
	if got, err := fresh.Get(ctx, key).Result(); err != nil || got != "before" {
		t.Fatalf("GET %s after the failover = %q, %v (want the replicated value)", key, got, err)
	}
	if err := fresh.Set(ctx, key, "fresh", 0).Err(); err != nil {
		t.Fatalf("fresh client SET after the failover: %v", err)
	}
	// The old client, told to reload, writes again within a bound.
	cc.ReloadState(ctx)
	start := time.Now()
	var failures []string
	for {
		err := cc.Set(ctx, key, "reloaded", 0).Err()
		if err == nil {
			break
		}
		failures = append(failures, err.Error())
		if time.Since(start) > 3*time.Second {
			t.Fatalf("old client SET after ReloadState still failing after 3s: %v", failures)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// go-redis keeps dialling the dead master (DialerRetries × 100 ms)
	// until its lazy reload lands, so this is slow but succeeds.
	t.Logf("old client wrote again %v after ReloadState (failed attempts before: %q)",
		time.Since(start).Round(time.Millisecond), failures)

	// The old master comes back as a replica of its successor.
	start = time.Now()
	c.Restart(old)
	if err := c.WaitOK(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	direct = redis.NewClient(&redis.Options{Addr: old.Addr})
	role, err := direct.Do(ctx, "ROLE").Slice()
	direct.Close()
	if err != nil || role[0] != "slave" || fmt.Sprint(role[2]) != portOf(promoted.Addr) {
		t.Fatalf("ROLE of restarted %s = %v, %v; want a replica of %s", old, role, err, promoted)
	}
	t.Logf("restarted %s rejoined as a replica in %v", old, time.Since(start).Round(time.Millisecond))
}

// startCluster starts a 3×2 cluster and checks, after everything the test
// registered has run, that none of its processes outlived it.
func startCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	var c *redistest.Cluster
	t.Cleanup(func() {
		if c != nil {
			checkGone(t, c.Nodes())
		}
	})
	c = redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1})
	return c
}

// slotOwner is the master CLUSTER SLOTS names for slot.
func slotOwner(t *testing.T, c *redis.Client, slot int) string {
	t.Helper()
	slots, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End {
			return s.Nodes[0].Addr
		}
	}
	t.Fatalf("CLUSTER SLOTS names no owner for slot %d", slot)
	return ""
}
