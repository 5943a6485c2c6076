package limits

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The top keys of a rule in Redis: a bounded SCAN for the rule's counters
// on every master, then a Peek of each key found (the read the admin API's
// ?key= makes), in batches.

const (
	// topScanCount is the COUNT of each SCAN call.
	topScanCount = 1000
	// topPeekBatch is how many keys one Peek reads on a single server or
	// Sentinel-managed master (one script call); on a Cluster each key is
	// its own slot, so its own call.
	topPeekBatch = 100
	// topPeekers is how many Peeks are in flight at once: a single
	// server's script calls are serial anyway, a Cluster's spread over its
	// masters.
	topPeekers        = 4
	topClusterPeekers = 16
)

// Top implements Lister. It SCANs every master (a Cluster's, concurrently)
// with MATCH for the rule's counters, COUNT 1000, until the whole keyspace
// has been walked or RedisOptions.TopScan keys have been examined, and
// reads each counter found with Peek at cost 0, so that its numbers are
// those a Peek of that key gives. Both steps stop when TopTime has passed
// since Top began (no new SCAN or Peek is sent, but the first batch of
// Peeks always is; those in flight finish within their timeout): Top then
// ranks what it read and says Truncated.
func (s *Redis) Top(ctx context.Context, q TopQuery, now time.Time) (TopResult, error) {
	if err := q.check(); err != nil {
		return TopResult{}, err
	}
	deadline := s.o.TopClock().Add(s.o.TopTime)
	keys, truncated, err := s.scanRule(ctx, q.Rule, deadline)
	if err != nil {
		return TopResult{}, err
	}
	t, cut, err := s.peekAll(ctx, &q, keys, now, deadline)
	if err != nil {
		return TopResult{}, err
	}
	return TopResult{Keys: t.sorted(), Truncated: truncated || cut}, nil
}

// ruleKeys returns how the names of rule's counters read: head, the key's
// public form, then tail (counterKeys' first key: a window's sorted set, a
// bucket's or a calendar counter's string). They are taken from counterKeys
// themselves, around a key that marks its place.
func (s *Redis) ruleKeys(rule *Rule) (head, tail string) {
	const mark = "\x00"
	h := Hit{Rule: rule, Key: Key{s: mark}}
	name := s.counterKeys([]Hit{h}, false)[0]
	head, tail, _ = strings.Cut(name, mark)
	return head, tail
}

// globEscape escapes the characters SCAN's MATCH pattern gives a meaning.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// scanRule returns the keys (public forms) of rule's counters, each once,
// found by a SCAN bounded as Top says; truncated reports that it stopped
// at its bound with keyspace left to walk.
func (s *Redis) scanRule(ctx context.Context, rule *Rule, deadline time.Time) (keys []Key, truncated bool, err error) {
	head, tail := s.ruleKeys(rule)
	// The pattern ends the rule's name at the separator, so the counters
	// of a rule whose name starts with this one's are not matched.
	match := globEscape(head) + "*" + globEscape(tail)
	var (
		examined atomic.Int64
		cut      atomic.Bool
		mu       sync.Mutex
		seen     = map[string]struct{}{}
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			left := int64(s.o.TopScan) - examined.Load()
			if left <= 0 || !s.o.TopClock().Before(deadline) {
				cut.Store(true)
				return nil
			}
			count := min(topScanCount, left)
			examined.Add(count)
			callCtx, cancel := context.WithTimeout(ctx, max(s.o.Timeout, 250*time.Millisecond))
			names, next, err := c.Scan(callCtx, cursor, match, count).Result()
			cancel()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, n := range names {
				k, ok := strings.CutPrefix(n, head)
				if k, ok = strings.CutSuffix(k, tail); !ok {
					continue
				}
				// Only a key as NewKey writes it is one the store counts.
				if pk, err := ParseKey(k); err == nil && pk.s == k {
					seen[k] = struct{}{}
				}
			}
			mu.Unlock()
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	if s.cluster != nil {
		err = s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.o.Client)
	}
	if err != nil {
		return nil, false, fmt.Errorf("redis scan: %w", err)
	}
	keys = make([]Key, 0, len(seen))
	for k := range seen {
		keys = append(keys, Key{s: k})
	}
	return keys, cut.Load(), nil
}

// peekAll reads keys under q with Peek at cost 0, in batches, a few at
// once, and keeps the q.N most used; cut reports that the deadline came
// before every key was read (no batch but the first is sent after it).
func (s *Redis) peekAll(parent context.Context, q *TopQuery, keys []Key, now, deadline time.Time) (t *topN, cut bool, err error) {
	size, workers := topPeekBatch, topPeekers
	if s.cluster != nil {
		size, workers = 1, topClusterPeekers
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	batches := make(chan []Key)
	var late atomic.Bool
	go func() {
		defer close(batches)
		for from := 0; from < len(keys); from += size {
			// The first batch is always read: a scan that took the whole
			// time still answers with something.
			if from > 0 && !s.o.TopClock().Before(deadline) {
				late.Store(true)
				return
			}
			select {
			case batches <- keys[from:min(from+size, len(keys))]:
			case <-ctx.Done():
				return
			}
		}
	}()
	t = newTopN(q.N)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hits := make([]Hit, 0, size)
			out := make([]Decision, size)
			for b := range batches {
				hits = hits[:0]
				for _, k := range b {
					hits = append(hits, q.hit(k))
				}
				if _, err := s.Peek(ctx, hits, now, out[:len(hits)]); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
					continue // drain
				}
				mu.Lock()
				for i := range hits {
					t.offer(stateOf(&hits[i], &out[i]))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = parent.Err() // the batches stopped short
	}
	if first != nil {
		return nil, false, first
	}
	return t, late.Load(), nil
}
