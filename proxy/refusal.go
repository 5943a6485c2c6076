package proxy

import (
	"hash/maphash"
	"net/http"
	"sync"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// A caller over its limit keeps asking, and each ask is a 429: the
// refusal is the attacker's hot path. Its answer is rendered once per
// (rule, key) and second and kept here (preparedCache): the JSON body and
// every header value but Retry-After-Ms, which changes every millisecond
// and comes from a table of recent values (recent.go). What the answer says is read from the
// batch's decisions every time: an entry is used only when the decisions
// render to the same bytes (the same rules, keys, limits and remaining,
// the same waits in whole seconds), so it never decides anything, and a
// decision counted down by the refusal memory (limits.Remember) finds its
// answer ready until the second changes.

// hitSig is what a 429's bytes depend on of one hit and its decision.
type hitSig struct {
	ru           *rule
	key          limits.Key // a refusing hit's only (see sign)
	own          bool
	limit, burst int64 // the hit's own
	allowed      bool
	dLimit       int64
	remaining    int64
	retryS       int64 // RetryAfter in whole seconds, rounded up
	resetS       int64 // ResetAfter, likewise
	resetMs      int64 // ResetAfter under a second, in milliseconds (OpenAI's reset headers)
	nextS        int64 // the RateLimit t parameter
}

// refusalSig is what a 429's bytes depend on: its envelope, and every hit
// of the batch with its decision, in order.
type refusalSig struct {
	env  envelope
	n    int
	hits [maxInlineRules]hitSig
}

// sign is x's refused batch's signature; false when the batch is too
// large to keep (its answer is rendered every time).
func (x *exchange) sign(sig *refusalSig) bool {
	if len(x.hits) > maxInlineRules {
		return false
	}
	sig.env = x.envelope()
	sig.n = len(x.hits)
	for i := range x.hits {
		h, d := &x.hits[i], &x.out[i]
		s := &sig.hits[i]
		*s = hitSig{ru: x.rules[i], own: h.Own, limit: h.Limit, burst: h.Burst, allowed: d.Allowed,
			dLimit: d.Limit, remaining: d.Remaining, retryS: ceilSeconds(d.RetryAfter), resetS: ceilSeconds(d.ResetAfter),
			nextS: ceilSeconds(nextAfter(d))}
		if !d.Allowed {
			// A refusing hit's key is in the answer (denied_key); an
			// admitting hit's is not, so callers who rotate it (a header
			// of their choosing) still find the answer ready.
			s.key = h.Key
		}
		if d.ResetAfter > 0 && d.ResetAfter < time.Second {
			s.resetMs = ceilMillis(d.ResetAfter)
		}
	}
	return true
}

// prepared is a 429 rendered once: its body and its headers (the
// rate-limit headers stamped, Retry-After, the content headers), shared by
// every answer it serves and never written to.
type prepared struct {
	sig     refusalSig
	status  int
	body    []byte
	headers []headerValue
	expires time.Time // kept no longer (the memory's bound)
}

type headerValue struct {
	name  string
	value []string
}

type preparedKey struct {
	ru  *rule
	key limits.Key
}

// preparedCache holds the prepared 429s of the last refused (rule, key)
// pairs, at most preparedShards × preparedPerShard.
type preparedCache struct {
	seed   maphash.Seed
	shards [preparedShards]struct {
		mu sync.Mutex
		m  map[preparedKey]*prepared
	}
}

const (
	preparedShards   = 16
	preparedPerShard = 256
)

func newPreparedCache() *preparedCache {
	c := &preparedCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[preparedKey]*prepared)
	}
	return c
}

func (c *preparedCache) shard(k preparedKey) int {
	return int(maphash.String(c.seed, k.key.String()) % preparedShards)
}

// get is the answer prepared for k whose bytes are sig's; nil when there
// is none.
func (c *preparedCache) get(k preparedKey, sig *refusalSig) *prepared {
	s := &c.shards[c.shard(k)]
	s.mu.Lock()
	pr := s.m[k]
	s.mu.Unlock()
	if pr == nil || pr.sig != *sig {
		return nil
	}
	return pr
}

// put keeps pr for k, in place of what was kept; a full shard first drops
// its entries past their time, then any one.
func (c *preparedCache) put(k preparedKey, pr *prepared, now time.Time) {
	s := &c.shards[c.shard(k)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[k]; !ok && len(s.m) >= preparedPerShard {
		for ok, old := range s.m {
			if !now.Before(old.expires) {
				delete(s.m, ok)
			}
		}
		if len(s.m) >= preparedPerShard {
			for ok := range s.m {
				delete(s.m, ok)
				break
			}
		}
	}
	s.m[k] = pr
}

// prepare renders d, a 429 whose body and headers (but Retry-After-Ms)
// are complete, as x would write it, and keeps it for the first refusing
// hit's (rule, key) when sig is set.
func (x *exchange) prepare(d *denial, first int, sig *refusalSig) *prepared {
	pr := &prepared{status: d.e.status, body: d.e.body(x.envelope())}
	h := http.Header{}
	for _, kv := range d.headers[:d.nh] {
		h[kv.name] = kv.value
	}
	contentHeaders(h, len(pr.body))
	x.stamp(h)
	pr.headers = make([]headerValue, 0, len(h))
	for name, v := range h {
		pr.headers = append(pr.headers, headerValue{name, v})
	}
	if sig == nil {
		return pr
	}
	pr.sig = *sig
	var longest time.Duration
	for i := range x.out {
		longest = max(longest, x.out[i].RetryAfter, x.out[i].ResetAfter)
	}
	pr.expires = x.start.Add(longest + time.Second)
	x.p.prepared.put(preparedKey{x.rules[first], x.hits[first].Key}, pr, x.start)
	return pr
}

// writePrepared answers d's prepared 429: as writeError would, with the
// rate-limit headers already among its own.
func (x *exchange) writePrepared(d *denial) {
	pr := d.prepared
	x.discardIfUnread(x.r)
	h := x.Header()
	for _, kv := range pr.headers {
		h[kv.name] = kv.value
	}
	h["Retry-After-Ms"] = msValue(d.retryMs)
	x.limited = false // stamped: the prepared headers hold them
	x.WriteHeader(pr.status)
	x.Write(pr.body)
}

// retryAfterMs is the Retry-After-Ms value of a wait: at least 1.
func retryAfterMs(wait time.Duration) int64 { return max(ceilMillis(wait), 1) }
