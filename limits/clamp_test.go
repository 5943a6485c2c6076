package limits_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// clampHit is a clamping hit: base + per·output, asking for max output.
func clampHit(r *limits.Rule, key string, base int64, per float64, maxOut, minOut int64) limits.Hit {
	c := limits.Clamp{Base: base, Per: per, Max: maxOut, Min: minOut}
	return limits.Hit{Rule: r, Key: limits.KeyOf("caller", key), Cost: c.Base + int64(float64(maxOut)*per+0.999999), Clamp: c}
}

func calDay(name string, limit int64) *limits.Rule { return cal(name, limit, limits.Day, time.UTC) }

// A clamping hit that does not fit is lowered, in the decision, to what
// remains: charged exactly that, its output the largest that fits; a
// request that fits keeps its cost; below the minimum it is refused at
// its full cost and nothing changes.
func TestClampLowersToWhatRemains(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for _, r := range []*limits.Rule{sw("w", 100, time.Hour), tb("b", 1, time.Hour, 100), calDay("c", 100)} {
			t.Run(string(r.Algorithm), func(t *testing.T) {
				s := newStore()
				now := at(0)
				if d := allow(t, s, r, "k", 40, now); !d.Allowed {
					t.Fatalf("%+v", d)
				}
				out := make([]limits.Decision, 1)
				fits := []limits.Hit{clampHit(r, "k", 10, 1, 20, 5)}
				if ok, err := s.Decide(context.Background(), fits, now, out); !ok || err != nil || fits[0].Cost != 30 || out[0].Output != 20 {
					t.Fatalf("a request that fits: %v %v cost %d %+v", ok, err, fits[0].Cost, out[0])
				}
				hits := []limits.Hit{clampHit(r, "k", 10, 1, 50, 5)} // 60 asked, 30 left
				peek := append([]limits.Hit(nil), hits...)
				if ok, err := s.Peek(context.Background(), peek, now, out); !ok || err != nil || out[0].Output != 20 || peek[0].Cost != 60 {
					t.Fatalf("peek: %v %v %+v (cost %d: a peek changes no hit)", ok, err, out[0], peek[0].Cost)
				}
				ok, err := s.Decide(context.Background(), hits, now, out)
				if !ok || err != nil {
					t.Fatalf("refused: %v %v %+v", ok, err, out[0])
				}
				if hits[0].Cost != 30 || out[0].Output != 20 || out[0].Remaining != 0 {
					t.Fatalf("charged %d for output %d, %d left; want 30, 20, 0", hits[0].Cost, out[0].Output, out[0].Remaining)
				}
				if rem := read(t, s, hits, now)[0]; rem != 0 {
					t.Fatalf("%d left", rem)
				}
				// Settled to what it used (the whole output): nothing moves.
				err = s.Settle(context.Background(), []limits.Settlement{{Hit: hits[0], Ticket: out[0].Ticket, Actual: 30}}, now)
				if err != nil {
					t.Fatal(err)
				}
				more := []limits.Hit{clampHit(r, "k", 10, 1, 50, 5)}
				if ok, err := s.Decide(context.Background(), more, now, out); ok || err != nil || more[0].Cost != 60 {
					t.Fatalf("nothing left, yet %v %v cost %d %+v", ok, err, more[0].Cost, out[0])
				}
			})
		}
	})
}

// With several clamping hits, the smallest remaining (in output) wins and
// every one of them is charged for that output; a minimum above it
// refuses the batch.
func TestClampSmallestWins(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		tokens, money := sw("tokens", 100, time.Hour), sw("money", 1000, time.Hour)
		now := at(0)
		batch := func(minOut int64) []limits.Hit {
			return []limits.Hit{clampHit(tokens, "k", 10, 1, 500, minOut), clampHit(money, "k", 7, 3.5, 500, minOut)}
		}
		out := make([]limits.Decision, 2)
		hits := batch(91)
		if ok, err := s.Decide(context.Background(), hits, now, out); ok || err != nil {
			t.Fatalf("min 91 above the 90 that fits, yet %v %v %+v", ok, err, out)
		}
		hits = batch(16)
		if ok, err := s.Decide(context.Background(), hits, now, out); !ok || err != nil {
			t.Fatalf("%v %v %+v", ok, err, out)
		}
		// tokens: 10 + 90 = 100; money: 7 + ⌈90·3.5⌉ = 322.
		if hits[0].Cost != 100 || hits[1].Cost != 322 || out[0].Output != 90 || out[1].Output != 90 {
			t.Fatalf("costs %d %d outputs %d %d; want 100 322 90 90", hits[0].Cost, hits[1].Cost, out[0].Output, out[1].Output)
		}
		if rem := read(t, s, hits, now); rem[0] != 0 || rem[1] != 678 {
			t.Fatalf("remaining %v, want [0 678]", rem)
		}
	})
}

// Concurrent clamping reservations on one key never take more than the
// limit, and the budget is used up to the last unit the minimum allows.
func TestClampConcurrent(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for _, r := range []*limits.Rule{sw("w", 5000, time.Hour), tb("b", 1, time.Hour, 5000), calDay("c", 5000)} {
			t.Run(string(r.Algorithm), func(t *testing.T) {
				s := newStore()
				now := at(0)
				var charged atomic.Int64
				var wg sync.WaitGroup
				for g := range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						out := make([]limits.Decision, 1)
						for i := range 30 {
							hits := []limits.Hit{clampHit(r, "k", int64(5+g), 1, int64(50+7*i), 16)}
							ok, err := s.Decide(context.Background(), hits, now, out)
							if err != nil {
								t.Error(err)
								return
							}
							if ok {
								if hits[0].Cost != hits[0].Clamp.Base+out[0].Output || out[0].Output < 16 {
									t.Errorf("charged %d for output %d", hits[0].Cost, out[0].Output)
								}
								charged.Add(hits[0].Cost)
							}
						}
					}()
				}
				wg.Wait()
				left := read(t, s, one(r, "k"), now)[0]
				if charged.Load() > 5000 || charged.Load()+left != 5000 || left >= 5+16+15 {
					t.Fatalf("charged %d, %d left of 5000", charged.Load(), left)
				}
			})
		}
	})
}

// clusterClamp: a clamping batch split over two masters is lowered part
// by part: a later part asks no more than an earlier one decided, and
// every decision names the batch's output.
func clusterClamp(t *testing.T, c *redistest.Cluster) {
	s := clusterStore(t, c, "clamp:", time.Second)
	rules := []*limits.Rule{sw("big", 1000, time.Minute), sw("small", 100, time.Minute)}
	batch := splitBatch(t, c, "clamp:", rules)
	for i := range batch {
		batch[i] = clampHit(batch[i].Rule, batch[i].Key.String()[len("caller="):], 10, 1, 500, 16)
	}
	out := make([]limits.Decision, 2)
	if ok, err := s.Decide(context.Background(), batch, time.Now(), out); !ok || err != nil {
		t.Fatalf("%v %v %+v", ok, err, out)
	}
	if out[0].Output != 90 || out[1].Output != 90 || batch[1].Cost != 100 || batch[0].Cost < 100 {
		t.Fatalf("outputs %d %d costs %d %d", out[0].Output, out[1].Output, batch[0].Cost, batch[1].Cost)
	}
}

// Fallback: a clamping hit decided by the local store while the shared
// one is down is charged what fits of the local share, and the caller's
// hit says so (its settlement corrects that charge).
func TestClampFallback(t *testing.T) {
	srv := redistest.Start(t)
	rs := newRedisStore(t, srv, true)
	f := limits.NewFallback(rs, limits.NewMemory(limits.MemoryOptions{}), 2)
	rs.MarkDown(errors.New("test: Redis is down"))
	r := sw("tokens", 100, time.Hour) // 50 locally
	hits := []limits.Hit{clampHit(r, "k", 10, 1, 500, 16)}
	out := make([]limits.Decision, 1)
	if ok, err := f.Decide(context.Background(), hits, at(0), out); !ok || err != nil || hits[0].Cost != 50 || out[0].Output != 40 {
		t.Fatalf("%v %v cost %d %+v", ok, err, hits[0].Cost, out[0])
	}
	if err := f.Settle(context.Background(), []limits.Settlement{{Hit: hits[0], Ticket: out[0].Ticket, Actual: 20}}, at(0)); err != nil {
		t.Fatal(err)
	}
	hits2 := []limits.Hit{clampHit(r, "k", 10, 1, 500, 16)}
	if ok, err := f.Decide(context.Background(), hits2, at(0), out); !ok || err != nil || hits2[0].Cost != 30 {
		t.Fatalf("after settling 50 down to 20, 30 should remain: %v %v cost %d %+v", ok, err, hits2[0].Cost, out[0])
	}
}
