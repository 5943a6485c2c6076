package limits

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ForgetAll drops every remembered refusal (a subscriber that may have
// missed messages).
func (r *Remember) ForgetAll() {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		s.lru.Purge()
		s.mu.Unlock()
	}
}

// ForgetBus carries the forgetting of remembered refusals between the
// instances that share a Redis (SPEC §4.2): a reset, a live change or a
// reload on one instance is published on the channel <prefix>forget as
// "<rule>\n<key>" (the key in its public form, empty for every key of the
// rule), and every instance, this one included, forgets on receipt. A
// subscriber that (re)subscribes forgets everything, since it may have
// missed messages while it was away; so a change is seen everywhere
// within the pub/sub delivery time, and never later than the reconnect.
type ForgetBus struct {
	client   redis.UniversalClient
	channel  string
	remember *Remember // nil: nothing is remembered here; changes are still published
	// OnError, when set, hears a publish or subscription failure.
	OnError func(op string, err error)
}

// NewForgetBus returns the bus of the instances under prefix.
func NewForgetBus(client redis.UniversalClient, prefix string, r *Remember) *ForgetBus {
	return &ForgetBus{client: client, channel: prefix + "forget", remember: r}
}

// Forget forgets the refusals of key under rule (every key when key is
// zero) here at once, and publishes it for the other instances.
func (b *ForgetBus) Forget(rule string, key Key) {
	if b.remember != nil {
		b.remember.Forget(rule, key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := b.client.Publish(ctx, b.channel, rule+"\n"+key.s).Err(); err != nil && b.OnError != nil {
		b.OnError("publish", err)
	}
}

// Run subscribes and forgets what is published until ctx ends.
func (b *ForgetBus) Run(ctx context.Context) {
	ps := b.client.Subscribe(ctx, b.channel)
	defer ps.Close()
	backoff := 50 * time.Millisecond
	for {
		msg, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if b.OnError != nil {
				b.OnError("subscribe", err)
			}
			select { // the next Receive reconnects and subscribes again
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && b.remember != nil {
				b.remember.ForgetAll()
			}
		case *redis.Message:
			b.receive(m.Payload)
		}
	}
}

// receive forgets what one message names; a malformed one is ignored.
func (b *ForgetBus) receive(payload string) {
	if b.remember == nil {
		return
	}
	rule, k, ok := strings.Cut(payload, "\n")
	if !ok || rule == "" {
		return
	}
	if k == "" {
		b.remember.Forget(rule, Key{})
		return
	}
	if key, err := ParseKey(k); err == nil {
		b.remember.Forget(rule, key)
	}
}
