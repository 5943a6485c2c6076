// Package gate protects the upstream (SPEC §9): a group of routes gets an
// in-flight cap, an outbound rate, a queue ordered by priority then
// arrival, a pause when the upstream says it is overloaded, and an
// adaptive (AIMD) rate. The state lives in memory for one instance or on
// Redis for many (slots as leases, the queue as a sorted set, one Lua
// script per step).
//
// A request takes a Ticket with Acquire before it leaves for the upstream
// and gives it back with Release on every ending; Transport retries the
// upstream's 429 and 503 answers under the ticket.
package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options describe one group.
type Options struct {
	Name        string
	MaxInFlight int64         // 0: no cap
	Rate        int64         // requests towards the upstream per Per; 0: no rate
	Per         time.Duration // the rate's window
	Queue       int64         // most requests waiting (every instance together); 0: none wait
	MaxWait     time.Duration // longest wait in the queue; 0: none wait
	Priorities  []string      // highest first (metric labels); at least one
	Retries     int           // retries of an upstream 429/503
	MaxBackoff  time.Duration // longest backoff before one retry, after the pause
	Adaptive    *Adaptive     // nil: off
	Fair        bool          // fair_by is set: the fair-keys gauge is exported
	// BaseBackoff is the first retry's backoff ceiling (doubling from
	// there up to MaxBackoff); 500 ms when 0.
	BaseBackoff time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Metrics, when set, receive the group's measurements.
	Metrics *Metrics
}

// Adaptive is AIMD (SPEC §9): the effective rate starts at Start × Rate,
// rises by Increase after each clean Every, is multiplied by Decrease on
// an upstream 429 and then held for Hold, and never exceeds Ceiling × Rate.
// Factors are integers of 10⁻⁶ (ppm) so that memory and Redis compute the
// same values.
type Adaptive struct {
	Start, Increase, Decrease, Ceiling int64
	Every, Hold                        time.Duration
}

// PPM is one whole factor.
const PPM = 1_000_000

// Reasons a request is refused with 503 upstream_busy.
const (
	ReasonQueueFull = "queue_full" // the queue is full (or none may wait)
	ReasonMaxWait   = "max_wait"   // waited max_wait (or until the caller's deadline)
	ReasonPaused    = "paused"     // the upstream's pause outlasts max_wait
)

// BusyError is a refusal: the upstream cannot take the request in time.
type BusyError struct {
	Reason     string
	RetryAfter time.Duration // when trying again makes sense; ≥ 1 s
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("upstream busy (%s), retry after %s", e.Reason, e.RetryAfter)
}

// ErrUnavailable is Acquire's error when the shared state cannot be
// reached and the group must not decide alone (FAIL_OPEN=false).
var ErrUnavailable = errors.New("gate: shared state unavailable")

// Group is one [[upstream_group]]: its gate on this instance.
type Group struct {
	o       Options                 // as built: Name, Priorities, Now, Metrics never change
	cur     atomic.Pointer[Options] // the limits in force (Update replaces them)
	now     func() time.Time
	b       backend
	m       *groupMetrics
	waiting []atomic.Int64 // local waiters by priority (metrics)
	flying  atomic.Int64   // local tickets held
	closed  sync.Once
}

// New returns a group whose state is in memory (one instance).
func New(o Options) (*Group, error) {
	g, err := newGroup(o)
	if err != nil {
		return nil, err
	}
	g.b = newMemory(g.o)
	return g, nil
}

func newGroup(o Options) (*Group, error) {
	o, err := check(o)
	if err != nil {
		return nil, err
	}
	g := &Group{o: o, now: o.Now, waiting: make([]atomic.Int64, len(o.Priorities))}
	g.cur.Store(&o)
	if o.Metrics != nil {
		g.m = o.Metrics.group(g)
	}
	return g, nil
}

// check validates o and fills in its defaults.
func check(o Options) (Options, error) {
	switch {
	case o.Name == "":
		return o, errors.New("gate: a group needs a name")
	case len(o.Priorities) == 0:
		return o, errors.New("gate: a group needs at least one priority")
	case o.Rate > 0 && o.Per < time.Millisecond:
		return o, errors.New("gate: a rate needs a window of 1 ms or more")
	case o.Adaptive != nil && (o.Rate <= 0 || o.Adaptive.Every < time.Millisecond):
		return o, errors.New("gate: adaptive needs a rate and a period")
	}
	if o.MaxWait <= 0 {
		o.Queue = 0 // nobody may wait
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = 500 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// opts are the options in force.
func (g *Group) opts() *Options { return g.cur.Load() }

// CanUpdate reports why Update(o) would fail: o is invalid, or names
// another group or other priorities (those need a new group).
func (g *Group) CanUpdate(o Options) error {
	o, err := check(o)
	switch {
	case err != nil:
		return err
	case o.Name != g.o.Name:
		return errors.New("gate: an update cannot rename a group")
	case !slices.Equal(o.Priorities, g.o.Priorities):
		return errors.New("gate: an update cannot change the priorities")
	}
	return nil
}

// Update puts o's limits (cap, rate, queue, max_wait, retries, backoff,
// adaptive) in force at once, keeping the group's state: its slots,
// queue, sends, pause and adaptive factor. Waiters are granted at once
// when the new limits have room for them; with Redis the limits are
// stored there, so that every instance's dispatcher (also one that has
// not reloaded) goes by them, and every instance's waiters hear of the
// room. Name, priorities, clock and metrics stay as built.
func (g *Group) Update(o Options) error {
	if err := g.CanUpdate(o); err != nil {
		return err
	}
	o, _ = check(o)
	o.Now, o.Metrics = g.o.Now, g.o.Metrics
	g.cur.Store(&o)
	g.b.update(o, g.now())
	return nil
}

// Name is the group's name.
func (g *Group) Name() string { return g.o.Name }

// Close stops the group's background work (Redis: renewals, the
// dispatcher); tickets still held are released by their requests.
func (g *Group) Close() {
	g.closed.Do(func() {
		g.b.close()
		if g.o.Metrics != nil {
			g.o.Metrics.drop(g)
		}
	})
}

// Retire takes a group out of service after a reload replaced or removed
// it: its gauges stop being reported at once (a new group of the same name
// reports its own), and it closes once the requests it admitted or queued
// are done, which new requests no longer join. removed also deletes the
// group's counter series (no group of that name is left). The state a
// group keeps on Redis is shared by name, so a replacement carries on
// with it.
func (g *Group) Retire(removed bool) {
	if g.o.Metrics != nil {
		g.o.Metrics.drop(g)
		if removed {
			g.o.Metrics.forget(g.o.Name)
		}
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for range t.C {
			if g.idle() {
				break
			}
		}
		g.Close()
	}()
}

// idle reports that no ticket of g is held and nobody waits.
func (g *Group) idle() bool {
	if g.flying.Load() != 0 {
		return false
	}
	for i := range g.waiting {
		if g.waiting[i].Load() != 0 {
			return false
		}
	}
	return true
}

// waiter is one request on its way through the gate.
type waiter struct {
	id   string // Redis: instance:sequence; memory: ""
	prio int
	// done gets one value, nil when granted, else why not; made by the
	// backend before anyone else can see w.
	done chan error
	// fair is the request's fair key ("" with fair_by empty); weight its
	// requests per turn (its plan's fair_weights entry, ≥ 1).
	fair   string
	weight int
	fairOn bool // fair_by is set (the Redis backend queues by place in turns)
	// The memory backend's queue links, guarded by its lock.
	prev, next *waiter
	lane       *lane
	queued     bool
	// local: the fallback decided it (the shared store had failed).
	local bool
}

// grant hands w its slot; refuse tells it why it has none. Each waiter
// gets exactly one of them (done has room for one).
func (w *waiter) grant()           { w.done <- nil }
func (w *waiter) refuse(err error) { w.done <- err }

// Acquire waits for a slot towards the upstream for a request of priority
// prio (an index into Options.Priorities, 0 highest), at most MaxWait and
// never past deadline (zero: none) or ctx's end. The error is a
// *BusyError, ErrUnavailable, or ctx's error when the client left.
func (g *Group) Acquire(ctx context.Context, prio int, deadline time.Time) (*Ticket, error) {
	return g.AcquireFair(ctx, prio, Fair{}, deadline)
}

// Fair is a request's place in fair share (fair_by): its key's value and
// its weight, the requests it may take per turn (≥ 1; 0 means 1).
// Within one priority the waiters take turns across keys; the zero Fair
// is one key for everyone, so arrival order.
type Fair struct {
	Key    string
	Weight int
}

// AcquireFair is Acquire for a request with a fair key: in memory the
// waiters of a priority take turns by deficit round robin (fair.go), on
// Redis by start-time fair queueing (gate.lua), the same order.
func (g *Group) AcquireFair(ctx context.Context, prio int, fair Fair, deadline time.Time) (*Ticket, error) {
	if prio < 0 || prio >= len(g.o.Priorities) {
		prio = len(g.o.Priorities) - 1
	}
	start := g.now()
	t := &Ticket{g: g, Arrived: start} // one allocation for the ticket and its waiter
	w := &t.w
	w.prio, w.fair, w.weight, w.fairOn = prio, fair.Key, max(fair.Weight, 1), fair != Fair{}
	res, err := g.b.enter(ctx, w, start)
	if err != nil {
		return nil, err
	}
	switch res.outcome {
	case granted:
		return g.admit(t, start), nil
	case refused:
		return nil, g.busy(res.reason, res.hint)
	}
	wait := g.opts().MaxWait
	if !deadline.IsZero() {
		wait = min(wait, deadline.Sub(start))
	}
	g.waiting[prio].Add(1)
	defer g.waiting[prio].Add(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case err := <-w.done:
		if err != nil {
			return nil, err
		}
		return g.admit(t, start), nil
	case <-timer.C:
		if g.give(w) {
			return g.admit(t, start), nil // granted as the wait ended
		}
		// Retry-After: the pause, or when the rate said a send frees.
		return nil, g.busy(ReasonMaxWait, max(g.pauseLeft(), start.Add(res.hint).Sub(g.now())))
	case <-ctx.Done():
		if g.give(w) {
			g.release(w) // granted as the client left: nobody uses it
		}
		if g.m != nil {
			g.m.gone.Inc()
		}
		return nil, ctx.Err()
	}
}

// give takes a waiting w out of the queue; true when it had been granted
// meanwhile (its slot is then the caller's to use or release). A refusal
// that raced the wait counts as no slot.
func (g *Group) give(w *waiter) bool {
	left, err := g.b.leave(context.Background(), w, g.now())
	if err == nil && left {
		return false
	}
	// Not in the queue any more: it was granted or refused; done says.
	select {
	case err := <-w.done:
		return err == nil
	default:
	}
	if err != nil {
		return false // unknown: a lease of ours expires unrenewed
	}
	// Granted in the store; the grant is on its way to done.
	return <-w.done == nil
}

func (g *Group) admit(t *Ticket, start time.Time) *Ticket {
	g.flying.Add(1)
	if g.m != nil {
		g.m.waited(t.w.prio, g.now().Sub(start))
	}
	return t
}

func (g *Group) busy(reason string, hint time.Duration) *BusyError {
	if g.m != nil {
		g.m.busy(reason)
	}
	return &BusyError{Reason: reason, RetryAfter: max(hint, time.Second)}
}

// release gives w's slot back. It runs whatever the request's context
// says (the client may be gone); a backend bounds its own I/O.
func (g *Group) release(w *waiter) {
	g.b.release(context.Background(), w, g.now())
}

// Ticket is a slot towards the upstream, held from the request's
// departure to its last byte.
type Ticket struct {
	g *Group
	w waiter
	// Deadline is the caller's: no retry is waited for past it.
	Deadline time.Time
	// Arrived is when the request arrived (Acquire's start unless the
	// caller knows better): no retry is waited for past MaxWait after it.
	Arrived  time.Time
	released atomic.Bool
}

// Group is the ticket's group.
func (t *Ticket) Group() *Group { return t.g }

// Release gives the slot back; only the first call counts.
func (t *Ticket) Release() {
	if t == nil || !t.released.CompareAndSwap(false, true) {
		return
	}
	t.g.flying.Add(-1)
	t.g.release(&t.w)
}

// InFlight is how many tickets of the group this instance holds.
func (g *Group) InFlight() int64 { return g.flying.Load() }

// Waiting is how many requests of priority prio wait on this instance.
func (g *Group) Waiting(prio int) int64 { return g.waiting[prio].Load() }

// FairKeys is how many fair keys (values of fair_by) have requests of
// priority prio waiting on this instance: the callers taking turns.
func (g *Group) FairKeys(prio int) int {
	if prio < 0 || prio >= len(g.o.Priorities) {
		return 0
	}
	return g.b.fairKeys(prio)
}

// throttled records an upstream 429 or 503 answer to a request sent at
// sent: the group pauses for pause (at least), and a 429 lowers the
// adaptive rate. It returns the pause remaining.
func (g *Group) throttled(w *waiter, status int, pause time.Duration, sent time.Time) time.Duration {
	if g.m != nil {
		g.m.throttled(status)
	}
	now := g.now()
	left, err := g.b.throttle(context.Background(), w, throttle{pause: pause, age: now.Sub(sent), decrease: status == 429}, now)
	if err != nil {
		return pause
	}
	return left
}

// pauseLeft is the pause remaining as this instance last saw it.
func (g *Group) pauseLeft() time.Duration {
	return g.b.snapshot(g.now()).pause
}

// resend lets a retry leave: 0 when no pause holds the group and the
// outbound rate has room (the send is then counted), else how long until
// that may be. The retry keeps its slot meanwhile.
func (g *Group) resend(w *waiter, attempt int) time.Duration {
	d, err := g.b.resend(context.Background(), w, attempt, g.now())
	if err != nil {
		return 0 // the state is out of reach: the pause and backoff already spaced it
	}
	return d
}

// Snapshot is the shared state as this instance last saw it.
type Snapshot struct {
	Factor float64       // the adaptive factor (1 when off)
	Pause  time.Duration // pause remaining
}

// Snapshot reports the group's shared state for metrics and tests.
func (g *Group) Snapshot() Snapshot {
	s := g.b.snapshot(g.now())
	return Snapshot{Factor: float64(s.factor) / PPM, Pause: s.pause}
}

// outcome of entering the gate.
type outcome uint8

const (
	granted outcome = iota
	queued
	refused
)

type enterResult struct {
	outcome outcome
	reason  string        // refused: a Reason
	hint    time.Duration // when the state may let one more through (rate, pause); 0 unknown
}

type throttle struct {
	pause    time.Duration
	age      time.Duration // since the throttled request was sent
	decrease bool          // a 429: lower the adaptive factor
}

type snapshot struct {
	factor int64 // ppm
	pause  time.Duration
}

// backend keeps a group's state. enter grants w, queues it (it is granted
// or refused later through w.done) or refuses it; leave takes a queued w
// out (false when it is no longer queued: granted or refused).
type backend interface {
	enter(ctx context.Context, w *waiter, now time.Time) (enterResult, error)
	leave(ctx context.Context, w *waiter, now time.Time) (bool, error)
	release(ctx context.Context, w *waiter, now time.Time)
	throttle(ctx context.Context, w *waiter, t throttle, now time.Time) (time.Duration, error)
	resend(ctx context.Context, w *waiter, attempt int, now time.Time) (time.Duration, error)
	snapshot(now time.Time) snapshot
	// fairKeys is how many fair keys have requests of priority prio
	// waiting on this instance.
	fairKeys(prio int) int
	// update puts new limits in force and grants the waiters they make
	// room for.
	update(o Options, now time.Time)
	close()
}
