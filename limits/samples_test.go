package limits_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

func samples(client redis.UniversalClient, window, names int) *limits.SharedSamples {
	return limits.NewSharedSamples(limits.SharedSamplesOptions{Client: client, Prefix: "smp:", Name: "learned", Window: window, Names: names})
}

func syncOK(t *testing.T, s *limits.SharedSamples) map[string][]int64 {
	t.Helper()
	got, err := s.Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Two instances see each other's values, in the order they were sent,
// each name keeping its last Window; a name past Names is not kept.
func TestSharedSamples(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	a, b := samples(client, 4, 2), samples(client, 4, 2)
	for _, v := range []int64{1, 2, 3} {
		a.Add("m", v)
	}
	if got := syncOK(t, a); !reflect.DeepEqual(got, map[string][]int64{"m": {1, 2, 3}}) {
		t.Fatalf("a: %v", got)
	}
	b.Add("m", 4)
	b.Add("m", 5)
	b.Add("n", 7)
	b.Add("o", 9) // a third name: over Names
	want := map[string][]int64{"m": {2, 3, 4, 5}, "n": {7}}
	if got := syncOK(t, b); !reflect.DeepEqual(got, want) {
		t.Fatalf("b: %v, want %v", got, want)
	}
	if got := syncOK(t, a); !reflect.DeepEqual(got, want) {
		t.Fatalf("a again: %v, want %v", got, want)
	}
	// Redis holds no more than it answers: Window values a name.
	if n := client.LLen(context.Background(), "smp:{learned}:names:m").Val(); n != 4 {
		t.Fatalf("m's list holds %d values, want 4", n)
	}
	// A buffer past Window keeps its newest.
	for v := range int64(10) {
		a.Add("n", 100+v)
	}
	if got := syncOK(t, a)["n"]; !reflect.DeepEqual(got, []int64{106, 107, 108, 109}) {
		t.Fatalf("n after 10 buffered: %v", got)
	}
}

// Values added while Redis is away are sent by the first Sync that
// reaches it.
func TestSharedSamplesKeptOverAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := samples(client, 10, 5)
	s.Add("m", 1)
	syncOK(t, s)
	srv.Stop()
	s.Add("m", 2)
	if _, err := s.Sync(context.Background()); err == nil {
		t.Fatal("Sync with Redis stopped: no error")
	}
	s.Add("m", 3)
	srv.Restart(t)
	if got := syncOK(t, s)["m"]; !reflect.DeepEqual(got, []int64{1, 2, 3}) && !reflect.DeepEqual(got, []int64{2, 3}) {
		t.Fatalf("after the outage: %v, want [1 2 3] (or [2 3]: a server without persistence restarts empty)", got)
	}
}

// On a Cluster the names and every list share one slot: one script call.
func TestSharedSamplesOnCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { client.Close() })
	a, b := samples(client, 3, 4), samples(client, 3, 4)
	a.Add("gpt-4o", 5)
	a.Add("{odd}name", 6)
	syncOK(t, a)
	b.Add("gpt-4o", 7)
	want := map[string][]int64{"gpt-4o": {5, 7}, "{odd}name": {6}}
	if got := syncOK(t, b); !reflect.DeepEqual(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}
