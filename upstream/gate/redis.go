package gate

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// gateScript is every step of the shared gate; see gate.lua.
//
//go:embed gate.lua
var gateScript string

// RedisOptions share a group's gate through Redis.
type RedisOptions struct {
	Client  redis.UniversalClient
	Prefix  string        // starts every key and the channel ("ratelimit-proxy:")
	Timeout time.Duration // longest wait for one step (default 50 ms)
	// Instances share the cap and the rate; while Redis cannot be reached
	// each decides alone with its share (every bound ÷ Instances).
	Instances int64
	// FailClosed: while Redis cannot be reached, requests are refused
	// with ErrUnavailable instead (FAIL_OPEN=false).
	FailClosed bool
	// Lease is how long a slot or a place in the queue outlives the last
	// renewal of its instance (default 10 s): a dead instance's slots are
	// free again within it. Renewals run every Lease/3.
	Lease time.Duration
	// Poll is the longest a waiter waits to hear of a slot freed on
	// another instance when a notification is lost (default 500 ms).
	Poll time.Duration
	// ClientClock makes the script use the group's clock instead of
	// Redis's TIME. For tests that step a fake clock only.
	ClientClock bool
}

// NewRedis returns a group whose state is shared on Redis by every
// instance that names it alike.
func NewRedis(o Options, ro RedisOptions) (*Group, error) {
	g, err := newGroup(o)
	if err != nil {
		return nil, err
	}
	if ro.Client == nil {
		return nil, errors.New("gate: a Redis client is required")
	}
	if ro.Timeout <= 0 {
		ro.Timeout = 50 * time.Millisecond
	}
	if ro.Lease <= 0 {
		ro.Lease = 10 * time.Second
	}
	if ro.Poll <= 0 {
		ro.Poll = 500 * time.Millisecond
	}
	ro.Instances = max(ro.Instances, 1)
	var id [6]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("gate: an instance id: %w", err)
	}
	tag := ro.Prefix + "{gate:" + g.o.Name + "}:"
	b := &redisBackend{
		ro: ro, now: g.o.Now, script: redis.NewScript(gateScript),
		keys:     []string{tag + "f", tag + "q", tag + "l", tag + "r", tag + "s", tag + "v"},
		channel:  ro.Prefix + "gate:" + g.o.Name,
		instance: hex.EncodeToString(id[:]) + ":",
		waiting:  map[string]*waiter{}, held: map[string]struct{}{},
		local: newMemory(share(g.o, ro.Instances)),
		busy:  func(reason string, hint time.Duration) error { return g.busy(reason, hint) },
		kick:  make(chan struct{}, 1), stop: make(chan struct{}),
	}
	b.factor.Store(PPM)
	if g.o.Adaptive != nil {
		b.factor.Store(min(g.o.Adaptive.Start, g.o.Adaptive.Ceiling))
	}
	b.setConf(g.o)
	g.b = b
	b.sub = ro.Client.Subscribe(context.Background(), b.channel)
	msgs := b.sub.Channel() // its goroutines start now, not on the dispatcher's first turn
	b.wg.Add(2)
	go b.dispatch(msgs)
	go b.renew()
	// The limits just loaded are the group's everywhere (the newest
	// loaded anywhere win); when Redis cannot be reached now, the next
	// renewal stores them if none are.
	b.run(context.Background(), "conf", g.now())
	return g, nil
}

// setConf makes o's limits the ones this instance sends with each step.
func (b *redisBackend) setConf(o Options) {
	conf := []any{o.MaxInFlight, o.Rate, o.Per.Milliseconds(), o.Queue, o.MaxWait.Milliseconds(),
		b.ro.Lease.Milliseconds()}
	if a := o.Adaptive; a != nil {
		conf = append(conf, a.Start, a.Increase, a.Every.Milliseconds(), a.Decrease, a.Hold.Milliseconds(), a.Ceiling)
	} else {
		conf = append(conf, 0, 0, 0, 0, 0, 0)
	}
	conf = append(conf, b.channel)
	b.conf.Store(&conf)
}

// update stores o's limits on Redis for every instance, whose waiters
// hear of the room a raised limit makes; the fallback gets its share.
func (b *redisBackend) update(o Options, now time.Time) {
	b.setConf(o)
	b.local.update(share(o, b.ro.Instances), now)
	b.run(context.Background(), "conf", now)
	b.kickDispatch()
}

// share is o with every bound divided among instances (rounded up), for
// deciding alone while Redis is down.
func share(o Options, instances int64) Options {
	div := func(n int64) int64 {
		if n <= 0 {
			return n
		}
		return max(1, (n+instances-1)/instances)
	}
	o.MaxInFlight, o.Rate, o.Queue = div(o.MaxInFlight), div(o.Rate), div(o.Queue)
	return o
}

// redisBackend keeps the state on Redis. A waiter of this instance is in
// waiting until it is granted (the dispatcher or leave finds it granted
// on Redis: it moves to held), refused, or leaves; held slots and waiting
// places are renewed every Lease/3 and expire when an instance dies.
type redisBackend struct {
	ro       RedisOptions
	now      func() time.Time
	script   *redis.Script
	keys     []string
	channel  string
	instance string
	conf     atomic.Pointer[[]any] // ARGV 3..15 of every step
	seq      atomic.Uint64
	busy     func(reason string, hint time.Duration) error

	mu      sync.Mutex
	waiting map[string]*waiter
	held    map[string]struct{}

	local     *memory // the fallback while Redis is down
	fails     atomic.Int64
	downUntil atomic.Int64 // unix ms; Redis is skipped until then

	factor     atomic.Int64 // last seen, ppm
	pauseUntil atomic.Int64 // last seen, unix ms of this instance's clock

	sub  *redis.PubSub
	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

var _ backend = (*redisBackend)(nil)

// run executes one step. The reply's last two values (factor, pause
// remaining) refresh what this instance knows of the shared state.
func (b *redisBackend) run(ctx context.Context, op string, now time.Time, extra ...any) ([]any, error) {
	if b.down(now) {
		return nil, errDown
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.ro.Timeout)
	defer cancel()
	conf := *b.conf.Load()
	args := make([]any, 0, 2+len(conf)+len(extra))
	args = append(args, op, "")
	if b.ro.ClientClock {
		args[1] = now.UnixMilli()
	}
	args = append(args, conf...)
	args = append(args, extra...)
	v, err := b.script.Run(ctx, b.ro.Client, b.keys, args...).Slice()
	if err != nil {
		b.failed(now)
		return nil, err
	}
	b.fails.Store(0)
	if len(v) < 4 {
		return nil, fmt.Errorf("gate: a reply of %d values", len(v))
	}
	fa, _ := v[len(v)-2].(int64)
	left, _ := v[len(v)-1].(int64)
	b.factor.Store(fa)
	b.pauseUntil.Store(now.UnixMilli() + left)
	return v, nil
}

var errDown = errors.New("gate: redis is down")

// failed counts a failure; three in a row skip Redis for a second.
func (b *redisBackend) failed(now time.Time) {
	if b.fails.Add(1) >= 3 {
		b.downUntil.Store(now.Add(time.Second).UnixMilli())
		b.fails.Store(0)
	}
}

func (b *redisBackend) down(now time.Time) bool { return now.UnixMilli() < b.downUntil.Load() }

func (b *redisBackend) enter(ctx context.Context, w *waiter, now time.Time) (enterResult, error) {
	w.id = b.instance + fmt.Sprintf("%016x", b.seq.Add(1))
	w.done = make(chan error, 1)
	b.mu.Lock()
	b.waiting[w.id] = w // before the step: the dispatcher may grant it at once
	b.mu.Unlock()
	var v []any
	var err error
	if w.fairOn {
		v, err = b.run(ctx, "enter", now, w.id, w.prio, w.fair, w.weight)
	} else {
		v, err = b.run(ctx, "enter", now, w.id, w.prio)
	}
	if err != nil {
		if !errors.Is(err, errDown) {
			// The step may have run on Redis all the same (a timeout):
			// whatever it left there for w is taken back.
			go b.run(context.Background(), "drop", b.now(), w.id)
		}
		if !b.forget(w) {
			// The dispatcher took it meanwhile: moved to the fallback
			// (abandon) or granted; its answer comes through done.
			return enterResult{outcome: queued}, nil
		}
		return b.fallback(ctx, w, now)
	}
	code, _ := v[0].(int64)
	hint, _ := v[1].(int64)
	res := enterResult{hint: time.Duration(hint) * time.Millisecond}
	if code != 1 {
		b.mu.Lock()
		_, ours := b.waiting[w.id]
		delete(b.waiting, w.id)
		if ours && code == 0 {
			b.hold(w.id)
		}
		b.mu.Unlock()
		if !ours {
			// Moved to the fallback meanwhile (the dispatcher saw Redis
			// fail): the fallback's answer comes through done.
			if code == 0 {
				b.run(ctx, "release", now, w.id)
			}
			return enterResult{outcome: queued}, nil
		}
	}
	switch code {
	case 0:
		res.outcome = granted
	case 1:
		res.outcome = queued
		if hint > 0 {
			b.kickDispatch() // its grant sets the timer for the rate's or pause's end
		}
	case 2, 3:
		res.outcome, res.reason = refused, ReasonQueueFull
		if code == 3 {
			res.reason = ReasonPaused
		}
	}
	return res, nil
}

// fallback decides w alone, or refuses it when that is not allowed.
func (b *redisBackend) fallback(ctx context.Context, w *waiter, now time.Time) (enterResult, error) {
	if b.ro.FailClosed {
		return enterResult{}, ErrUnavailable
	}
	w.local = true
	return b.local.enter(ctx, w, now)
}

// forget drops w from waiting; false when it was not there any more.
func (b *redisBackend) forget(w *waiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.waiting[w.id]
	delete(b.waiting, w.id)
	return ok
}

// claim moves a granted w from waiting to held and tells it; true too
// when it had already been claimed (by leave) and is held, false when
// its waiter is gone and nobody will use the slot.
func (b *redisBackend) claim(id string) bool {
	b.mu.Lock()
	w := b.waiting[id]
	if w != nil {
		delete(b.waiting, id)
		b.hold(id)
	}
	_, held := b.held[id]
	b.mu.Unlock()
	if w == nil {
		return held
	}
	w.grant()
	return true
}

func (b *redisBackend) leave(ctx context.Context, w *waiter, now time.Time) (bool, error) {
	if b.isLocal(w) {
		return b.local.leave(ctx, w, now)
	}
	v, err := b.run(ctx, "leave", now, w.id)
	var code int64 = -1
	if err == nil {
		code, _ = v[0].(int64)
	}
	if code == 2 {
		if b.claim(w.id) {
			return false, nil
		}
		// Moved to the fallback meanwhile: the slot granted on Redis is
		// nobody's, and w may still wait in the fallback's queue.
		b.run(ctx, "release", now, w.id)
		return b.local.leave(ctx, w, now)
	}
	if b.forget(w) {
		switch {
		case code == 1:
			return true, nil
		case err != nil:
			w.refuse(err)
			return false, err
		default: // expired: nobody holds it
			w.refuse(errors.New("gate: the place in the queue expired"))
			return false, nil
		}
	}
	// No longer ours to decide: the dispatcher granted it (the grant is
	// on its way to done) or moved it to the fallback, where it may
	// still wait.
	if b.isLocal(w) {
		return b.local.leave(ctx, w, now)
	}
	return false, nil
}

// isLocal reports whether w was moved to the fallback; abandon moves
// waiters under b.mu.
func (b *redisBackend) isLocal(w *waiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return w.local
}

func (b *redisBackend) release(ctx context.Context, w *waiter, now time.Time) {
	if w.local {
		b.local.release(ctx, w, now)
		return
	}
	b.mu.Lock()
	_, held := b.held[w.id]
	delete(b.held, w.id)
	b.mu.Unlock()
	if held {
		b.local.unhold(now)
	}
	b.run(ctx, "release", now, w.id) // on failure the lease expires unrenewed
}

// hold records that this instance holds a slot granted on Redis: its
// fallback counts it, so that deciding alone (Redis failed) it sees this
// instance's real load, not an empty one.
func (b *redisBackend) hold(id string) {
	b.held[id] = struct{}{}
	b.local.hold(b.now())
}

func (b *redisBackend) throttle(ctx context.Context, w *waiter, t throttle, now time.Time) (time.Duration, error) {
	dec := "0"
	if t.decrease {
		dec = "1"
	}
	v, err := b.run(ctx, "throttle", now, ceilMillis(t.pause), t.age.Milliseconds(), dec)
	if err != nil {
		return b.local.throttle(ctx, w, t, now)
	}
	left, _ := v[len(v)-1].(int64)
	b.kickDispatch() // waiters here learn the new pause
	return time.Duration(left) * time.Millisecond, nil
}

func (b *redisBackend) resend(ctx context.Context, w *waiter, attempt int, now time.Time) (time.Duration, error) {
	if b.isLocal(w) {
		return b.local.resend(ctx, w, attempt, now)
	}
	v, err := b.run(ctx, "resend", now, w.id+"#"+strconv.Itoa(attempt))
	if err != nil {
		return 0, err
	}
	wait, _ := v[1].(int64)
	return time.Duration(wait) * time.Millisecond, nil
}

// fairKeys counts the fair keys of this instance's waiters on Redis
// (their number is bounded by the queue) and of those in the fallback.
func (b *redisBackend) fairKeys(prio int) int {
	keys := map[string]struct{}{}
	b.mu.Lock()
	for _, w := range b.waiting {
		if w.prio == prio && w.fairOn && !w.local {
			keys[w.fair] = struct{}{}
		}
	}
	b.mu.Unlock()
	return len(keys) + b.local.fairKeys(prio)
}

func (b *redisBackend) snapshot(now time.Time) snapshot {
	if b.down(now) {
		return b.local.snapshot(now)
	}
	return snapshot{factor: b.factor.Load(),
		pause: time.Duration(max(b.pauseUntil.Load()-now.UnixMilli(), 0)) * time.Millisecond}
}

func (b *redisBackend) kickDispatch() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// dispatch grants this instance's waiters as slots free anywhere: on a
// notification, when the rate or a pause lets the next one go, and every
// Poll in case a notification was lost.
func (b *redisBackend) dispatch(msgs <-chan *redis.Message) {
	defer b.wg.Done()
	poll := time.NewTicker(b.ro.Poll)
	defer poll.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-msgs:
		case <-b.kick:
		case <-poll.C:
		case <-timer.C:
		}
		b.mu.Lock()
		n := len(b.waiting)
		b.mu.Unlock()
		if n == 0 {
			continue
		}
		now := b.now()
		v, err := b.run(context.Background(), "grant", now, b.instance)
		if err != nil {
			if b.down(now) {
				b.abandon(now)
			}
			continue
		}
		ids, _ := v[0].([]any)
		for _, x := range ids {
			id, _ := x.(string)
			if !b.claim(id) {
				b.run(context.Background(), "release", now, id) // its waiter is gone
			}
		}
		if hint, _ := v[1].(int64); hint > 0 {
			timer.Reset(time.Duration(hint) * time.Millisecond)
		}
	}
}

// abandon moves this instance's waiters to the fallback while Redis is
// down (or refuses them when that is not allowed); their places on Redis
// expire unrenewed.
func (b *redisBackend) abandon(now time.Time) {
	// Under b.mu: once a waiter is out of waiting, it is in the fallback
	// (or decided) for leave to find.
	b.mu.Lock()
	defer b.mu.Unlock()
	ws := make([]*waiter, 0, len(b.waiting))
	for id, w := range b.waiting {
		ws = append(ws, w)
		delete(b.waiting, id)
	}
	// In the queue's order, priority then arrival (ids of one instance
	// are in arrival order), not the map's.
	slices.SortFunc(ws, func(x, y *waiter) int {
		return cmp.Or(cmp.Compare(x.prio, y.prio), strings.Compare(x.id, y.id))
	})
	for _, w := range ws {
		if b.ro.FailClosed {
			w.refuse(ErrUnavailable)
			continue
		}
		w.local = true
		res, _ := b.local.enter(context.Background(), w, now)
		switch res.outcome {
		case granted:
			w.grant()
		case refused:
			w.refuse(b.busy(res.reason, res.hint))
		}
	}
}

// renew extends the leases of held slots and waiting places every
// Lease/3, and refreshes what this instance knows of the pause and factor.
func (b *redisBackend) renew() {
	defer b.wg.Done()
	t := time.NewTicker(b.ro.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		ids := make([]any, 0, len(b.held)+len(b.waiting))
		for id := range b.held {
			ids = append(ids, id)
		}
		for id := range b.waiting {
			ids = append(ids, id)
		}
		b.mu.Unlock()
		now := b.now()
		if len(ids) == 0 {
			b.run(context.Background(), "renew", now)
			continue
		}
		for len(ids) > 0 {
			n := min(len(ids), 1000)
			b.run(context.Background(), "renew", now, ids[:n]...)
			ids = ids[n:]
		}
	}
}

func (b *redisBackend) close() {
	b.once.Do(func() {
		close(b.stop)
		b.sub.Close()
		b.wg.Wait()
		b.local.close()
	})
}
