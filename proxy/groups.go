package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// codeUpstreamBusy is the 503 of an upstream group that cannot take a
// request in time (SPEC §9).
const codeUpstreamBusy = "upstream_busy"

// decUpstreamBusy is that refusal's decision label.
const decUpstreamBusy = "upstream_busy"

// groups are the upstream groups (SPEC §9) matched by path: the first
// group listing a request's path gates it.
type groups struct {
	list  []*group
	match *routes // path → the group, through protectedRoute.label
	by    map[string]*group
}

// group is one [[upstream_group]] compiled.
type group struct {
	g           *gate.Group
	from        string // "header", "query", "tier" or ""
	name        string // header (canonical) or query parameter
	prios       map[string]int
	defaultPrio int                  // "default", else the lowest
	conf        config.UpstreamGroup // what it was built from
	fairBy      *keyPart             // fair_by compiled; nil: arrival order
	weights     map[string]int       // fair_weights: requests per turn by plan
	// update, when set, is new limits for a gate kept from the policy
	// this one replaces, put in force by the swap (retireGroups): a
	// policy compiled but never installed changes nothing.
	update *gate.Options
}

// newGroups builds the gates of the configured groups; shared with
// Redis when ro is set. A group of old (the groups a reload replaces)
// whose table did not change is kept as it is, with its gate; one whose
// table changed keeps its gate too, given the new limits at the swap
// (its slots, queue and pause carry over, and its waiters get the room
// a raised limit makes), unless its priorities changed: then it gets a
// new gate.
func newGroups(c *config.Config, now func() time.Time, m *gate.Metrics, ro *gate.RedisOptions, old *groups) (*groups, error) {
	if len(c.UpstreamGroups) == 0 {
		return nil, nil
	}
	gs := &groups{by: map[string]*group{}}
	var entries []string
	owner := map[string]string{} // entry → group name
	for _, cg := range c.UpstreamGroups {
		paths := cg.Paths
		if paths == nil {
			paths = c.ProtectedPaths
		}
		for _, p := range paths {
			if _, taken := owner[p]; !taken {
				owner[p] = cg.Name
				entries = append(entries, p)
			}
		}
		prev := old.byName(cg.Name)
		if prev != nil && reflect.DeepEqual(prev.conf, cg) {
			gs.list = append(gs.list, prev)
			gs.by[cg.Name] = prev
			continue
		}
		o := gate.Options{Name: cg.Name, MaxInFlight: cg.MaxInFlight, Rate: cg.Rate, Per: cg.Per, Queue: cg.Queue,
			MaxWait: cg.MaxWait, Priorities: cg.Priorities, Retries: int(cg.Retries), MaxBackoff: cg.MaxBackoff,
			Fair: cg.FairBy != "", Now: now, Metrics: m}
		if a := cg.Adaptive; a != nil {
			o.Adaptive = &gate.Adaptive{Start: a.Start, Increase: a.Increase, Decrease: a.Decrease, Ceiling: a.Ceiling,
				Every: a.Every, Hold: a.Hold}
		}
		var g *gate.Group
		var err error
		var update *gate.Options
		switch {
		case prev != nil && prev.g.CanUpdate(o) == nil:
			g, update = prev.g, &o
		case ro != nil:
			g, err = gate.NewRedis(o, *ro)
		default:
			g, err = gate.New(o)
		}
		if err != nil {
			for _, grp := range gs.list {
				if prev := old.byName(grp.g.Name()); prev == nil || prev.g != grp.g {
					grp.g.Close() // built here: nobody else has it
				}
			}
			return nil, fmt.Errorf("upstream_group %q: %w", cg.Name, err)
		}
		grp := &group{g: g, prios: map[string]int{}, defaultPrio: len(cg.Priorities) - 1, conf: cg, update: update}
		for i, p := range cg.Priorities {
			grp.prios[p] = i
			if p == "default" {
				grp.defaultPrio = i
			}
		}
		if cg.FairBy != "" {
			kp, err := (&rule{}).compilePart(cg.FairBy) // config allows no body part: nothing is registered
			if err != nil {
				return nil, fmt.Errorf("upstream_group %q: fair_by: %w", cg.Name, err)
			}
			grp.fairBy = &kp
			grp.weights = make(map[string]int, len(cg.FairWeights))
			for plan, w := range cg.FairWeights {
				grp.weights[plan] = int(w)
			}
		}
		kind, name, _ := strings.Cut(cg.PriorityFrom, ":")
		grp.from, grp.name = kind, name
		if kind == "header" {
			grp.name = http.CanonicalHeaderKey(name)
		}
		gs.list = append(gs.list, grp)
		gs.by[cg.Name] = grp
	}
	gs.match = newRoutes(entries, nil)
	for _, rt := range gs.match.exact {
		rt.group = gs.by[owner[rt.label]]
	}
	for i := range gs.match.patterns {
		rt := gs.match.patterns[i].route
		rt.group = gs.by[owner[rt.label]]
	}
	return gs, nil
}

func (gs *groups) byName(name string) *group {
	if gs == nil {
		return nil
	}
	return gs.by[name]
}

// retireGroups puts in force the new limits of the gates next keeps,
// and retires the gates of old that next no longer uses (a group
// removed, or given a new gate): they stop being reported at once and
// close when their last request is done. It returns what changed.
func retireGroups(old, next *groups) []string {
	var changed []string
	if next != nil {
		for _, grp := range next.list {
			if grp.update != nil {
				grp.g.Update(*grp.update) // CanUpdate said yes
				grp.update = nil
			}
			if prev := old.byName(grp.conf.Name); prev == nil {
				changed = append(changed, "upstream_group "+grp.conf.Name+": added")
			} else if prev != grp {
				changed = append(changed, "upstream_group "+grp.conf.Name+": changed")
			}
		}
	}
	if old == nil {
		return changed
	}
	for _, grp := range old.list {
		kept := next.byName(grp.conf.Name)
		if kept == nil {
			changed = append(changed, "upstream_group "+grp.conf.Name+": removed")
		}
		if kept != nil && kept.g == grp.g {
			continue
		}
		grp.g.Retire(kept == nil)
	}
	return changed
}

func (gs *groups) close() {
	if gs == nil {
		return
	}
	for _, g := range gs.list {
		g.g.Close()
	}
}

// of is the group gating r; nil when none does. A WebSocket upgrade on an
// unprotected route is tunnelled, not queued: it would hold a slot for the
// life of a connection. Any other Upgrade header is stripped before
// forwarding (upstream.stripUpgrade), so the request is an ordinary one
// and is gated like the rest: an Upgrade header cannot buy a way past.
func (gs *groups) of(r *http.Request, protected bool) *group {
	if gs == nil || !protected && upstream.WebSocketUpgrade(r.Header) {
		return nil
	}
	rt, _ := gs.match.match(r)
	if rt == nil {
		return nil
	}
	return rt.group
}

// priority is r's priority index in the group: the value of priority_from
// among the group's priorities (case-insensitive), else "default". The
// tier is the caller's plan as the guards found it, or, on a path they
// did not guard, as tier_from gives it.
func (grp *group) priority(r *http.Request, x *exchange) int {
	var v string
	switch grp.from {
	case "header":
		v = r.Header.Get(grp.name)
	case "query":
		if q, err := url.ParseQuery(r.URL.RawQuery); err == nil {
			v = q.Get(grp.name)
		}
	case "tier":
		if x.keys.r != nil {
			v = x.keys.plan
		} else {
			c := x.pol.identify(r, anthropicPath(canonicalPath(r.URL.Path)))
			v = x.pol.planOf(r, &c)
		}
	}
	if v == "" {
		return grp.defaultPrio
	}
	if i, ok := grp.prios[strings.ToLower(strings.TrimSpace(v))]; ok {
		return i
	}
	return grp.defaultPrio
}

// fair is r's place in the group's turns: the value of fair_by (a
// request without one shares the turn of every other without one) and
// its plan's weight. The key parts are read as the guards read them, or,
// on a path they did not guard, from the request and caller alone.
func (grp *group) fair(r *http.Request, x *exchange) gate.Fair {
	if grp.fairBy == nil {
		return gate.Fair{}
	}
	in := &x.keys
	var own keyInput
	if in.r == nil {
		path := canonicalPath(r.URL.Path)
		c := x.pol.identify(r, anthropicPath(path))
		own = keyInput{r: r, p: x.p, pol: x.pol, c: c, path: path}
		own.plan = x.pol.planOf(r, &c)
		in = &own
	}
	saved := in.err // an ambiguous value is one more key here, not a refusal
	v, _ := in.value(grp.fairBy)
	in.err = saved
	f := gate.Fair{Key: v, Weight: 1}
	if w, ok := grp.weights[in.plan]; ok && in.plan != "" {
		f.Weight = w
	}
	return f
}

// callerDeadline is when the caller stops waiting: its context's deadline,
// or the timeout its SDK announces (X-Stainless-Timeout, seconds, sent by
// OpenAI's and Anthropic's SDKs), whichever is first; zero when unknown.
func callerDeadline(r *http.Request, start time.Time) time.Time {
	d, _ := r.Context().Deadline()
	if v := r.Header.Get("X-Stainless-Timeout"); v != "" {
		if s, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && s > 0 && s < 86400*7 {
			sdk := start.Add(time.Duration(s * float64(time.Second)))
			if d.IsZero() || sdk.Before(d) {
				d = sdk
			}
		}
	}
	return d
}

// enterGroup takes the request's slot towards the upstream. It returns
// the request to forward (carrying the ticket) and the ticket to release,
// or the denial: 503 upstream_busy, 503 when the shared state is down and
// FAIL_OPEN=false, no answer when the client left.
func (x *exchange) enterGroup(grp *group) (*http.Request, *gate.Ticket, *denial) {
	r, start := x.r, x.start
	// A body the guards did not read (a group path outside
	// PROTECTED_PATHS) is read now: a client that leaves while queued is
	// only noticed once its body has been read, and a retry sends it again.
	if x.body == nil && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		c := x.pol.identify(r, anthropicPath(canonicalPath(r.URL.Path)))
		if d := x.spool(&c); d != nil {
			return nil, nil, d
		}
	}
	deadline := callerDeadline(r, start)
	t, err := grp.g.AcquireFair(r.Context(), grp.priority(r, x), grp.fair(r, x), deadline)
	if err == nil {
		t.Deadline, t.Arrived = deadline, start
		if x.body != nil && r.GetBody == nil {
			body := x.body
			r.GetBody = func() (io.ReadCloser, error) { return body.upstreamBody(), nil }
		}
		return r.WithContext(gate.WithTicket(r.Context(), t)), t, nil
	}
	x.budget.unsent = true // nothing reached the model
	var busy *gate.BusyError
	switch {
	case errors.As(err, &busy):
		secs := max(ceilSeconds(busy.RetryAfter), 1)
		s := strconv.FormatInt(secs, 10)
		d := x.refuse(decUpstreamBusy, http.StatusServiceUnavailable, codeUpstreamBusy,
			"The upstream API is busy. Please retry after "+s+" seconds.").
			with(field{"retry_after_seconds", secs}, field{"group", grp.g.Name()}, field{"reason", busy.Reason}).
			header("Retry-After", []string{s}).
			header("Retry-After-Ms", []string{strconv.FormatInt(max(ceilMillis(busy.RetryAfter), 1), 10)})
		d.msg, d.log = "request refused: upstream busy",
			[]any{"group", grp.g.Name(), "reason", busy.Reason, "retry_after", secs, "path", r.URL.Path}
		return nil, nil, d
	case errors.Is(err, gate.ErrUnavailable):
		x.p.metrics.storeErrors.Inc()
		return nil, nil, x.refuse(decStoreError, http.StatusServiceUnavailable, codeStoreDown,
			"The rate limiter is unavailable. Please retry shortly.").
			header("Retry-After", []string{"1"})
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return nil, nil, x.gone()
	default:
		return nil, nil, x.refuse(decUpstreamError, http.StatusBadGateway, codeUpstreamDown,
			"The upstream API could not be reached.")
	}
}
