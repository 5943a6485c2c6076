package proxy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// ruleInfo reports the running rules at scrape time, read from the
// current policy, so that a reload needs no bookkeeping: a rule removed is
// no longer reported, a rule added is. ratelimit_proxy_rule_info is the
// Prometheus "info" idiom (value 1, the description in labels) that the
// dashboard joins to the per-rule series to pick out, say, the calendar
// quotas; ratelimit_proxy_rule_period_end_timestamp_seconds tells when a
// calendar rule's current period ends in its time zone.
type ruleInfo struct {
	p         *Proxy
	info, end *prometheus.Desc
}

func newRuleInfo(p *Proxy) *ruleInfo {
	return &ruleInfo{
		p: p,
		info: prometheus.NewDesc("ratelimit_proxy_rule_info",
			"Each running rule (value 1): its algorithm, window (seconds, or day/week/month for calendar rules; empty for concurrency), cost and action.",
			[]string{"rule", "algorithm", "window", "cost", "action"}, nil),
		end: prometheus.NewDesc("ratelimit_proxy_rule_period_end_timestamp_seconds",
			"A calendar rule's current period's end (its next local midnight, Monday or 1st), as a Unix time.",
			[]string{"rule"}, nil),
	}
}

func (ri *ruleInfo) Describe(ch chan<- *prometheus.Desc) {
	ch <- ri.info
	ch <- ri.end
}

func (ri *ruleInfo) Collect(ch chan<- prometheus.Metric) {
	pol := ri.p.policy.Load()
	if pol == nil {
		return
	}
	now := ri.p.now()
	for _, ru := range pol.rules {
		c := &ru.conf
		window := ""
		switch {
		case c.Algorithm == string(limits.Calendar):
			window = c.Period
		case c.Algorithm == "concurrency":
			// no window: places in flight
		case c.Window > 0:
			window = strconv.FormatInt(int64(c.Window.Seconds()), 10)
		}
		ch <- prometheus.MustNewConstMetric(ri.info, prometheus.GaugeValue, 1,
			ru.lim.Name, c.Algorithm, window, c.Cost, c.Action)
		if ru.lim.Algorithm == limits.Calendar {
			_, end := ru.lim.Bounds(now)
			ch <- prometheus.MustNewConstMetric(ri.end, prometheus.GaugeValue, float64(end.Unix()), ru.lim.Name)
		}
	}
}
