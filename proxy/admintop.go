package proxy

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// GET /admin/limits/{rule}?top=N (SPEC §10): the N keys of a rule with
// the most used, read from the store (this instance's memory, or Redis's
// shared counters through a bounded scan).

const (
	defaultTop = 20
	maxTop     = 1000
)

// topView is GET /admin/limits/{rule}?top=N.
type topView struct {
	Rule string    `json:"rule"`
	Keys []topItem `json:"keys"`
	// Truncated says that the shared store's scan stopped at its bound:
	// keys it did not reach may be missing.
	Truncated bool `json:"truncated,omitempty"`
}

// topItem is one key of a topView, with the numbers ?key= gives for it.
type topItem struct {
	Key               string      `json:"key"`
	Limit             any         `json:"limit"`
	Used              json.Number `json:"used"`
	Remaining         any         `json:"remaining"`
	ResetAfterSeconds json.Number `json:"reset_after_seconds"`
}

// ownLimits are the limits key is held to under ru (a tier's, with plan,
// or an override's) as a hit's own, ok false when they are the rule's or
// unlimited (the rule's counting is shown then).
func (ru *rule) ownLimits(plan string, key limits.Key) (limit, burst int64, ok bool) {
	eff, own := ru.effective(plan, key)
	if !own || eff.unlimited {
		return 0, 0, false
	}
	burst = eff.limit
	if ru.burstSet {
		burst = ru.lim.Burst
	}
	return eff.limit, burst, true
}

// amount is n in the unit of ru's cost, as the admin API writes it.
func (ru *rule) amount(n int64) json.Number {
	if ru.cost == costUSD {
		return dollars(n)
	}
	return json.Number(strconv.FormatInt(n, 10))
}

// topOf reads ?top=N: 20 when it has no value, else a whole number from
// 1 to 1000.
func topOf(r *http.Request) (int, error) {
	q := r.URL.Query()
	if _, ok := q["key"]; ok {
		return 0, errors.New("give either ?top=N or ?key=K, not both")
	}
	v := q.Get("top")
	if v == "" {
		return defaultTop, nil
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || n < 1:
		return 0, errors.New("top must be a whole number of keys from 1 to " + strconv.Itoa(maxTop))
	case n > maxTop:
		return 0, errors.New("top is at most " + strconv.Itoa(maxTop) + " keys")
	}
	return n, nil
}

func (p *Proxy) adminTop(w http.ResponseWriter, r *http.Request) {
	pol, ru := p.ruleOf(w, r)
	if ru == nil {
		return
	}
	n, err := topOf(r)
	if err != nil {
		adminError(w, http.StatusBadRequest, codeInvalidRequest, err.Error()+".")
		return
	}
	lister, ok := p.batch.(limits.Lister)
	if !ok {
		adminError(w, http.StatusNotImplemented, "not_implemented", "This state store cannot list its keys.")
		return
	}
	res, err := lister.Top(r.Context(), limits.TopQuery{Rule: ru.lim, N: n, Own: func(k limits.Key) (int64, int64, bool) {
		return ru.ownLimits(pol.knownPlan(k), k)
	}}, p.now())
	switch {
	case errors.Is(err, limits.ErrNoTop):
		adminError(w, http.StatusNotImplemented, "not_implemented", "This state store cannot list its keys.")
		return
	case err != nil:
		adminError(w, http.StatusServiceUnavailable, "store_unavailable", "The state store could not be read: "+err.Error()+".")
		return
	}
	v := topView{Rule: ru.lim.Name, Keys: make([]topItem, 0, len(res.Keys)), Truncated: res.Truncated}
	for _, ks := range res.Keys {
		it := topItem{Key: ks.Key.String(), Limit: ru.amount(ks.Limit), Used: ru.amount(ks.Used),
			Remaining:         ru.amount(ks.Decision.Remaining),
			ResetAfterSeconds: json.Number(strconv.FormatInt(ceilSeconds(ks.Decision.ResetAfter), 10))}
		if eff, own := ru.effective("", ks.Key); own && eff.unlimited {
			it.Limit, it.Remaining = "unlimited", "unlimited"
		}
		v.Keys = append(v.Keys, it)
	}
	writeAdminJSON(w, http.StatusOK, v)
}
