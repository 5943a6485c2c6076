package proxy

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// One key's limits in the admin API (SPEC §10): read, reset, override.

// keyOf reads ?key=K, the key's public form (SPEC §5), for rule ru. A key
// pasted unescaped into the URL (its & splitting the query) is put back
// together from the parameters named after ru's key parts; a bare value
// for a one-part rule gets the part's name.
func keyOf(r *http.Request, pol *policy, ru *rule) (limits.Key, error) {
	q := r.URL.Query()
	raw := q.Get("key")
	if raw == "" {
		return limits.Key{}, errors.New("give the key as ?key=K, its public form as a 429's denied_key shows it (caller=ip:203.0.113.7)")
	}
	labels := make([]string, len(ru.key))
	for i := range ru.key {
		labels[i] = ru.key[i].label
	}
	if !strings.Contains(raw, "=") && len(labels) == 1 {
		raw = labels[0] + "=" + raw
	}
	for _, l := range labels[1:] {
		if vs, ok := q[l]; ok && len(vs) == 1 && !strings.Contains(raw, l+"=") {
			raw += "&" + l + "=" + vs[0]
		}
	}
	parts, err := limits.ParseKeyParts(raw)
	if err != nil {
		return limits.Key{}, err
	}
	names := make([]string, len(parts))
	for i := range parts {
		// Header names are case-insensitive: the rule's spelling counts.
		if i < len(labels) && strings.HasPrefix(labels[i], "header:") && strings.EqualFold(parts[i].Name, labels[i]) {
			parts[i].Name = labels[i]
		}
		names[i] = parts[i].Name
		parts[i].Value = pol.countedIP(parts[i])
	}
	if !slices.Equal(names, labels) {
		hint := ""
		if slices.Contains(labels, "api_key") || slices.Contains(labels, "caller") {
			hint = " (`ratelimit-proxy key` prints an API key's caller= and api_key= forms)"
		}
		return limits.Key{}, fmt.Errorf("rule %s counts by %s; the key names %s%s", ru.lim.Name, strings.Join(labels, "&"), strings.Join(names, "&"), hint)
	}
	return limits.NewKey(parts...), nil
}

// countedIP is an ip or caller=ip: part's value as it is counted: an IPv6
// address as its IPV6_PREFIX prefix (a client address pasted from an
// access log finds its counter). Any other value is returned as it is.
func (pol *policy) countedIP(p limits.Part) string {
	v, isCaller := strings.CutPrefix(p.Value, "ip:")
	if p.Name != "ip" && !(p.Name == "caller" && isCaller) {
		return p.Value
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return p.Value
	}
	out := a.Unmap().String()
	if a.Unmap().Is6() {
		pre, _ := a.Prefix(pol.ips.ipv6Prefix)
		out = pre.String()
	}
	if p.Name == "caller" {
		return "ip:" + out
	}
	return out
}

// limitView is GET /admin/limits/{rule}?key=K.
type limitView struct {
	Rule              string       `json:"rule"`
	Key               string       `json:"key"`
	Limit             any          `json:"limit"`
	Used              json.Number  `json:"used"`
	Remaining         any          `json:"remaining"`
	WindowSeconds     json.Number  `json:"window_seconds"`
	ResetAfterSeconds json.Number  `json:"reset_after_seconds"`
	Algorithm         string       `json:"algorithm"`
	Burst             *json.Number `json:"burst,omitempty"`
	Cost              string       `json:"cost"`
	// Override is the key's own limit when one applies (the file's or a
	// live one), Tier the plan asked for with ?tier=.
	Override any    `json:"override,omitempty"`
	Tier     string `json:"tier,omitempty"`
}

// limitsOf reads one key's state under ru with a Peek of cost 0.
func (p *Proxy) limitsOf(ctx context.Context, ru *rule, key limits.Key, plan string) (limitView, error) {
	amount := func(n int64) json.Number {
		if ru.cost == costUSD {
			return dollars(n)
		}
		return json.Number(strconv.FormatInt(n, 10))
	}
	h := limits.Hit{Rule: ru.lim, Key: key}
	eff, own := ru.effective(plan, key)
	h.Limit, h.Burst, h.Own = ru.ownLimits(plan, key)
	var d [1]limits.Decision
	if _, err := p.batch.Peek(ctx, []limits.Hit{h}, p.now(), d[:]); err != nil {
		return limitView{}, err
	}
	limit, burst := h.Limits()
	capacity := limit
	if ru.lim.Algorithm == limits.TokenBucket {
		capacity = burst
	}
	v := limitView{Rule: ru.lim.Name, Key: key.String(), Limit: amount(limit), Used: amount(max(capacity-d[0].Remaining, 0)),
		Remaining: amount(d[0].Remaining), WindowSeconds: seconds(max(ru.lim.Window, d[0].Period)),
		ResetAfterSeconds: json.Number(strconv.FormatInt(ceilSeconds(d[0].ResetAfter), 10)),
		Algorithm:         string(ru.lim.Algorithm), Cost: ru.conf.Cost, Tier: plan}
	if ru.lim.Algorithm == limits.TokenBucket {
		b := amount(burst)
		v.Burst = &b
	}
	if o, ok := ru.override[key.String()]; ok {
		v.Override = amount(o.limit)
		if o.unlimited {
			v.Override = "unlimited"
		}
	}
	if own && eff.unlimited {
		v.Limit, v.Remaining = "unlimited", "unlimited"
	}
	return v, nil
}

// ruleAndKey finds the {rule} of the path and ?key=K, answering 404 or
// 400 when it cannot.
func (p *Proxy) ruleAndKey(w http.ResponseWriter, r *http.Request) (*rule, limits.Key, bool) {
	pol, ru := p.ruleOf(w, r)
	if ru == nil {
		return nil, limits.Key{}, false
	}
	key, err := keyOf(r, pol, ru)
	if err != nil {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, err.Error()+".")
		return nil, limits.Key{}, false
	}
	return ru, key, true
}

func (p *Proxy) adminLimits(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, top := q["top"]
	if top || len(q) == 0 { // no question at all: the top 20
		p.adminTop(w, r)
		return
	}
	ru, key, ok := p.ruleAndKey(w, r)
	if !ok {
		return
	}
	plan := strings.TrimSpace(r.URL.Query().Get("tier"))
	if plan == "" {
		plan = p.policy.Load().knownPlan(key)
	}
	v, err := p.limitsOf(r.Context(), ru, key, plan)
	if err != nil {
		adminError(w, http.StatusServiceUnavailable, "store_unavailable", "The state store could not be read: "+err.Error()+".")
		return
	}
	writeAdminJSON(w, http.StatusOK, v)
}

// adminResetKey is DELETE /admin/limits/{rule}?key=K: the key's counters
// on that rule are forgotten, and so is its remembered refusal, here and
// on every instance sharing the store.
func (p *Proxy) adminResetKey(w http.ResponseWriter, r *http.Request) {
	ru, key, ok := p.ruleAndKey(w, r)
	if !ok {
		return
	}
	if err := p.store.Reset(r.Context(), ru.lim, key); err != nil {
		adminError(w, http.StatusServiceUnavailable, "store_unavailable", "The counters could not be reset: "+err.Error()+".")
		return
	}
	p.forget(ru.lim.Name, key)
	p.log.Info("admin: counters reset", "rule", ru.lim.Name, "key", key.String())
	w.WriteHeader(http.StatusNoContent)
}

// adminOverride is PUT /admin/limits/{rule}?key=K {"limit":N}: a live
// override of one key's limit (N, "unlimited", or null to drop the live
// override). It answers the key's limits as GET does.
func (p *Proxy) adminOverride(w http.ResponseWriter, r *http.Request) {
	ru, key, ok := p.ruleAndKey(w, r)
	if !ok {
		return
	}
	m, ok := readChange(w, r, "limit")
	if !ok {
		return
	}
	drop := string(bytes.TrimSpace(m["limit"])) == "null"
	var o liveOverride
	var err error
	if !drop {
		if o.limit, o.unlimited, err = amountOf(m["limit"], ru, true); err != nil {
			adminError(w, http.StatusBadRequest, codeInvalidRequest, "limit "+err.Error()+".")
			return
		}
	}
	name := ru.lim.Name
	pol, err := p.change(func(cur *policy, live *liveChanges) error {
		if drop {
			delete(live.overrides[name], key.String())
			return nil
		}
		if live.overrides[name] == nil {
			live.overrides[name] = map[string]liveOverride{}
		}
		live.overrides[name][key.String()] = o
		return nil
	})
	if err != nil {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, err.Error())
		return
	}
	shown := string(m["limit"])
	p.log.Info("admin: key limit overridden live", "rule", name, "key", key.String(), "limit", shown)
	v, err := p.limitsOf(r.Context(), pol.ruleNamed(name), key, pol.knownPlan(key))
	if err != nil {
		adminError(w, http.StatusServiceUnavailable, "store_unavailable", "The override is set; the state store could not be read: "+err.Error()+".")
		return
	}
	writeAdminJSON(w, http.StatusOK, v)
}

// knownPlan is the plan of the known key (API_KEYS_FILE) a counter's key
// names — its caller=user:<name> or its api_key= part — so that the admin
// API shows the limits the key is held to on requests: the tier of the
// person's unexpired keys (the least name, should they differ); "" for any other key.
func (pol *policy) knownPlan(key limits.Key) string {
	if pol.keys == nil {
		return ""
	}
	parts, err := limits.ParseKeyParts(key.String())
	if err != nil {
		return ""
	}
	now := pol.now()
	for _, part := range parts {
		var match func(k *config.APIKey) bool
		switch {
		case part.Name == "caller" && strings.HasPrefix(part.Value, "user:"):
			name := part.Value[len("user:"):]
			match = func(k *config.APIKey) bool { return k.Caller == name }
		case part.Name == "api_key" && len(part.Value) == 16:
			match = func(k *config.APIKey) bool { return hex.EncodeToString(k.SHA256[:8]) == part.Value }
		default:
			continue
		}
		best := ""
		for _, k := range pol.keys {
			if k.Tier == "" || !match(&k) || !k.Expires.IsZero() && !now.Before(k.Expires) {
				continue
			}
			if best == "" || k.Tier < best {
				best = k.Tier // map order varies: the least name, so the answer does not
			}
		}
		if best != "" {
			return best
		}
	}
	return ""
}
