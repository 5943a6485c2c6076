package tests

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

const monthlyCap = `
[[rule]]
name      = "spend-month"
key       = ["api_key"]
cost      = "usd"
algorithm = "calendar"
window    = "month"
timezone  = "Europe/Rome"
limit     = 0.0103              # one reservation of 1,024 output tokens ($0.01024) and a little: spent, the next no longer fits

[price."gpt-4o*"]
input  = 2.50
output = 10.00
`

// A monthly spend cap through the binary, in memory and on Redis: spent,
// it refuses with insufficient_quota until midnight of the 1st in Rome
// (Retry-After), and RateLimit-Policy's w is this month's length.
func TestMonthlySpendCap(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			env := map[string]string{}
			if store == "redis" {
				env["REDIS_URL"] = redistest.Start(t).URL()
			}
			p := startProxy(t, mockUpstream(t), env, "-config", writeRules(t, monthlyCap))
			key := []string{"Authorization", "Bearer sk-month-" + store}
			var r *response
			for i := 0; i < 50; i++ {
				if r = p.post(t, "/v1/chat/completions", key...); r.StatusCode != http.StatusOK {
					break
				}
			}
			wantStatus(t, r, http.StatusTooManyRequests)
			b := r.json(t)
			if e, _ := b["error"].(map[string]any); e == nil || e["code"] != "insufficient_quota" || b["denied_by"] != "spend-month" {
				t.Fatalf("body %s", r.body)
			}
			rome, err := time.LoadLocation("Europe/Rome")
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().In(rome)
			start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, rome)
			next := start.AddDate(0, 1, 0)
			retry, _ := strconv.Atoi(r.Header.Get("Retry-After"))
			if want := time.Until(next).Seconds(); math.Abs(float64(retry)-want) > 3 {
				t.Fatalf("Retry-After %d, want the %.0f s to %v", retry, want, next)
			}
			if w := "w=" + strconv.Itoa(int(next.Sub(start).Seconds())); !strings.Contains(r.Header.Get("RateLimit-Policy"), w) {
				t.Fatalf("RateLimit-Policy %q lacks %s", r.Header.Get("RateLimit-Policy"), w)
			}
		})
	}
}
