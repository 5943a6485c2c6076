package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

func TestReadyzFollowsTheStore(t *testing.T) {
	for _, tc := range []struct {
		failOpen string
		up       bool
		code     int
		state    string
	}{
		{config.FailOpenFalse, true, 200, `"store_state":"up"`},
		{config.FailOpenFalse, false, 503, `"store_state":"down"`},
		{config.FailOpenTrue, false, 200, `"store_state":"down"`},
		{config.FailOpenLocal, false, 200, `"store_state":"down"`},
	} {
		f := newFixture(t, func(c *config.Config, o *proxy.Options) {
			c.FailOpen = tc.failOpen
			o.StoreName, o.StoreUp = "redis", func() bool { return tc.up }
		})
		w := httptest.NewRecorder()
		f.admin.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.state) || !strings.Contains(w.Body.String(), `"store":"redis"`) {
			t.Errorf("fail_open=%s up=%v: %d %s", tc.failOpen, tc.up, w.Code, w.Body)
		}
	}
}

func TestStoreMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := proxy.NewStoreMetrics(reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	m.Call(time.Millisecond, nil)
	m.Call(50*time.Millisecond, context.DeadlineExceeded)
	m.Call(time.Millisecond, errors.New("dial tcp: connection refused"))
	m.StateChange("", false, context.DeadlineExceeded)
	m.Fallback()
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("%v %+v", err, problems)
	}
	for name, want := range map[string]float64{
		"ratelimit_proxy_store_up":                       0,
		"ratelimit_proxy_store_fallback_decisions_total": 1,
	} {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name {
				got := mf.GetMetric()[0]
				v := got.GetGauge().GetValue() + got.GetCounter().GetValue()
				if v != want {
					t.Errorf("%s = %v, want %v", name, v, want)
				}
			}
		}
	}
	want := `
# HELP ratelimit_proxy_store_call_errors_total Failed calls to the shared state store by kind (timeout, connection, redis).
# TYPE ratelimit_proxy_store_call_errors_total counter
ratelimit_proxy_store_call_errors_total{kind="connection"} 1
ratelimit_proxy_store_call_errors_total{kind="redis"} 0
ratelimit_proxy_store_call_errors_total{kind="timeout"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_proxy_store_call_errors_total"); err != nil {
		t.Fatal(err)
	}
}
