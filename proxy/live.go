package proxy

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// liveChanges are the admin API's changes since the configuration was last
// loaded (SPEC §10): applied on top of it each time the policy is
// compiled, shown by GET /admin/config and GET /admin/rules, never written
// to the file, and dropped by a reload (the file is read again as it is).
// A value is never modified once a policy uses it: a change clones it.
type liveChanges struct {
	rules     map[string]liveRule                // by rule name
	overrides map[string]map[string]liveOverride // rule → key (public form) → limit
}

// liveRule is a rule's live parameters; nil or zero fields keep the file's.
type liveRule struct {
	limit, burst *int64 // burst: token buckets only
	action       string
	maxDelay     time.Duration
}

type liveOverride struct {
	limit     int64
	unlimited bool
}

func (l *liveChanges) clone() *liveChanges {
	c := &liveChanges{rules: maps.Clone(l.rules), overrides: map[string]map[string]liveOverride{}}
	for r, m := range l.overrides {
		c.overrides[r] = maps.Clone(m)
	}
	if c.rules == nil {
		c.rules = map[string]liveRule{}
	}
	return c
}

// apply puts the live changes of r's rule into r. r's slices may be
// shared with the configuration: they are replaced, never written to.
func (l *liveChanges) apply(r *config.Rule) {
	if l == nil {
		return
	}
	if lr, ok := l.rules[r.Name]; ok {
		if lr.limit != nil {
			r.Limit = *lr.limit
		}
		if lr.burst != nil {
			r.Burst, r.BurstSet = *lr.burst, true
		}
		if lr.action != "" {
			r.Action = lr.action
		}
		if lr.maxDelay > 0 {
			r.MaxDelay = lr.maxDelay
		}
	}
	if ov := l.overrides[r.Name]; len(ov) > 0 {
		merged := map[string]config.Override{}
		for _, o := range r.Overrides {
			merged[o.Key] = o
		}
		for k, o := range ov {
			merged[k] = config.Override{Key: k, Limit: o.limit, Unlimited: o.unlimited}
		}
		r.Overrides = make([]config.Override, 0, len(merged))
		for _, k := range slices.Sorted(maps.Keys(merged)) {
			r.Overrides = append(r.Overrides, merged[k])
		}
	}
}

// describe lists the live changes, one line each, in a stable order; usd
// amounts are in micro-dollars here (the log says which rule).
func (l *liveChanges) describe() []string {
	if l == nil {
		return nil
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(l.rules)) {
		lr := l.rules[name]
		if lr.limit != nil {
			out = append(out, fmt.Sprintf("rule %s: limit %d", name, *lr.limit))
		}
		if lr.burst != nil {
			out = append(out, fmt.Sprintf("rule %s: burst %d", name, *lr.burst))
		}
		if lr.action != "" {
			out = append(out, fmt.Sprintf("rule %s: action %s", name, lr.action))
		}
		if lr.maxDelay > 0 {
			out = append(out, fmt.Sprintf("rule %s: max_delay %s", name, lr.maxDelay))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(l.overrides)) {
		keys := slices.Collect(maps.Keys(l.overrides[name]))
		sort.Strings(keys)
		for _, k := range keys {
			o := l.overrides[name][k]
			v := strconv.FormatInt(o.limit, 10)
			if o.unlimited {
				v = "unlimited"
			}
			out = append(out, fmt.Sprintf("rule %s: override %s = %s", name, strconv.Quote(k), v))
		}
	}
	return out
}
