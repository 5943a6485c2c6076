package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	var s *redistest.SentinelSet
	t.Cleanup(func() {
		if s != nil {
			checkGone(t, append(s.Nodes(), s.Sentinels()...))
		}
	})
	s = redistest.StartSentinel(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 3})

	want := "redis+sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/mymaster"
	if s.URL() != want || len(s.SentinelAddrs()) != 3 || s.MasterName() != "mymaster" {
		t.Fatalf("URL() = %q, want %q", s.URL(), want)
	}
	old := s.Master()
	if old != s.Nodes()[0] {
		t.Fatalf("Master() = %s, want the first master %s", old, s.Nodes()[0])
	}

	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: s.MasterName(), SentinelAddrs: s.SentinelAddrs(),
	})
	defer fc.Close()
	if err := fc.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: %v", err)
	}
	if n, err := fc.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	killed := time.Now()
	s.Kill(old)
	if redistest.Alive(old.PID) {
		t.Fatalf("%s: pid %d alive after Kill", old, old.PID)
	}
	promoted, at, err := s.WaitFailover(old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sentinels failed over to %s %v after %s was killed (all sentinels agreed %v after the kill)",
		promoted, at.Sub(killed).Round(time.Millisecond), old, time.Since(killed).Round(time.Millisecond))
	if promoted == old || s.Master() != promoted {
		t.Fatalf("WaitFailover = %s, Master() = %s; want the replica", promoted, s.Master())
	}

	// The same client, and a fresh one, write to the new master.
	start := time.Now()
	for {
		err := fc.Set(ctx, "k", "after", 0).Err()
		if err == nil {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("failover client SET still failing 5s after the failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the failover client wrote again %v after WaitFailover returned", time.Since(start).Round(time.Millisecond))
	fresh := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: s.MasterName(), SentinelAddrs: s.SentinelAddrs(),
	})
	defer fresh.Close()
	if got, err := fresh.Get(ctx, "k").Result(); err != nil || got != "after" {
		t.Fatalf("fresh client GET = %q, %v", got, err)
	}
}
