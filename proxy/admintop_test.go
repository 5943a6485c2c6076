package proxy_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// topRules: "a" counts callers, "ab" (whose name starts with a's) counts
// by ip with another limit; neither may show the other's keys.
const topRules = `
[[rule]]
name   = "a"
key    = ["caller"]
limit  = 100
window = "1m"
[[rule]]
name   = "ab"
key    = ["ip"]
limit  = 1000
window = "1m"
`

// topOnRedis keeps the counters in a real redis-server (on the test's
// clock), its Top scanning at most scan keys (0: the default bound).
func topOnRedis(t *testing.T, scan int) option {
	redistest.Require(t)
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	return func(_ *config.Config, o *proxy.Options) {
		s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "top:", Timeout: time.Second, ClientClock: true, TopScan: scan, TopTime: 30 * time.Second})
		t.Cleanup(s.Close)
		o.Store = s
	}
}

// topKeys is ?top= as a list of its keys' objects.
func topKeys(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	raw, ok := m["keys"].([]any)
	if !ok {
		t.Fatalf("no keys array: %v", m)
	}
	out := make([]map[string]any, len(raw))
	for i, k := range raw {
		out[i] = k.(map[string]any)
	}
	return out
}

// 50 callers that sent 1..50 requests, and one API key that sent 55: top=5
// lists the 5 most used, most used first, with the numbers ?key= gives for
// each of them; the API key appears as its hash only.
func TestAdminTop(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			opt, _ := configFile(t, topRules)
			opts := []option{opt}
			if store == "redis" {
				opts = append(opts, topOnRedis(t, 0))
			}
			f := newFixture(t, opts...)
			for i := range 50 {
				for range i + 1 {
					if c := f.do("/api/chat", fmt.Sprintf("203.0.113.%d:1", i+1)).Code; c != 200 {
						t.Fatalf("caller %d: %d", i, c)
					}
				}
			}
			for range 55 {
				if c := f.do("/api/chat", "198.51.100.1:1", "Authorization", "Bearer sk-top-secret").Code; c != 200 {
					t.Fatalf("API key: %d", c)
				}
			}
			f.clock.Set(20)

			code, m := f.adminDo(t, "GET", "/admin/limits/a?top=5", "", "")
			if code != 200 || m["rule"] != "a" || m["truncated"] != nil {
				t.Fatalf("top=5: %d %v", code, m)
			}
			keys := topKeys(t, m)
			want := []string{"caller=key:" + keyHash("sk-top-secret"), "caller=ip:203.0.113.50", "caller=ip:203.0.113.49", "caller=ip:203.0.113.48", "caller=ip:203.0.113.47"}
			used := []float64{55, 50, 49, 48, 47}
			if len(keys) != 5 {
				t.Fatalf("top=5 gave %d keys: %v", len(keys), m)
			}
			for i, k := range keys {
				if k["key"] != want[i] || k["used"] != used[i] || k["remaining"] != 100-used[i] || k["limit"] != 100.0 || k["reset_after_seconds"] != 40.0 {
					t.Errorf("#%d: %v, want %s used %v", i, k, want[i], used[i])
				}
			}
			if strings.Contains(mustString(m), "sk-top-secret") {
				t.Fatal("the API key itself is listed")
			}

			// Every key listed, read back with ?key=, gives the same numbers;
			// only a's keys are listed, each once.
			_, all := f.adminDo(t, "GET", "/admin/limits/a?top=1000", "", "")
			keys = topKeys(t, all)
			if len(keys) != 51 {
				t.Fatalf("top=1000 gave %d keys, want 51", len(keys))
			}
			seen := map[string]bool{}
			for _, k := range keys {
				key := k["key"].(string)
				if seen[key] || !strings.HasPrefix(key, "caller=") {
					t.Fatalf("listed %q (twice, or not a key of a)", key)
				}
				seen[key] = true
				code, one := f.adminDo(t, "GET", "/admin/limits/a?key="+url.QueryEscape(key), "", "")
				if code != 200 {
					t.Fatalf("?key=%s: %d %v", key, code, one)
				}
				for _, field := range []string{"key", "limit", "used", "remaining", "reset_after_seconds"} {
					if one[field] != k[field] {
						t.Errorf("%s: %s is %v in top, %v in ?key=", key, field, k[field], one[field])
					}
				}
			}
			_, ab := f.adminDo(t, "GET", "/admin/limits/ab?top", "", "")
			keys = topKeys(t, ab)
			if len(keys) != 20 || keys[0]["key"] != "ip=198.51.100.1" || keys[0]["limit"] != 1000.0 {
				t.Fatalf("ab, default top: %d keys, first %v", len(keys), keys[0])
			}

			// An override is the key's limit in the list as in ?key=.
			if code, m := f.adminDo(t, "PUT", "/admin/limits/a?key=caller=ip:203.0.113.50", "", `{"limit":500}`); code != 200 {
				t.Fatalf("override: %d %v", code, m)
			}
			_, m = f.adminDo(t, "GET", "/admin/limits/a?top=2", "", "")
			if k := topKeys(t, m)[1]; k["key"] != "caller=ip:203.0.113.50" || k["limit"] != 500.0 || k["remaining"] != 450.0 {
				t.Fatalf("overridden key: %v", k)
			}

			// Once the window has passed, nothing is held: nothing is listed.
			f.clock.Set(61)
			_, m = f.adminDo(t, "GET", "/admin/limits/a?top=10", "", "")
			if keys := topKeys(t, m); len(keys) != 0 {
				t.Fatalf("after the window: %v", keys)
			}
		})
	}
}

func TestAdminTopBadRequests(t *testing.T) {
	opt, _ := configFile(t, topRules)
	f := newFixture(t, opt)
	for _, tc := range []struct {
		target string
		code   int
		says   string
	}{
		{"/admin/limits/a?top=0", 400, "from 1 to 1000"},
		{"/admin/limits/a?top=-3", 400, "from 1 to 1000"},
		{"/admin/limits/a?top=ten", 400, "from 1 to 1000"},
		{"/admin/limits/a?top=1.5", 400, "from 1 to 1000"},
		{"/admin/limits/a?top=1001", 400, "at most 1000"},
		{"/admin/limits/a?top=99999999999999999999", 400, "from 1 to 1000"},
		{"/admin/limits/a?top=5&key=caller=ip:1.2.3.4", 400, "not both"},
		{"/admin/limits/nope?top=5", 404, "No rule"},
		{"/admin/limits/a?top=1000", 200, ""},
		{"/admin/limits/a?top=", 200, ""},
	} {
		code, m := f.adminDo(t, "GET", tc.target, "", "")
		msg, _ := m["message"].(string)
		if code != tc.code || !strings.Contains(msg, tc.says) {
			t.Errorf("%s: %d %v, want %d saying %q", tc.target, code, m, tc.code, tc.says)
		}
		if code == 400 && m["error"] != "invalid_request" {
			t.Errorf("%s: error %v", tc.target, m["error"])
		}
		if code == 200 && (m["keys"] == nil || m["rule"] != "a") {
			t.Errorf("%s: %v", tc.target, m)
		}
	}
}

// Redis's scan stops at its bound and says so. Of the 400 names in Redis
// (100 callers of each rule, two per counter) a quarter are a's first
// ones: a bound of 60 finds some of them (all but certainly: 10 made it
// miss every one 1 time in 18) and never all.
func TestAdminTopTruncated(t *testing.T) {
	opt, _ := configFile(t, topRules)
	f := newFixture(t, opt, topOnRedis(t, 60))
	for i := range 100 {
		if c := f.do("/api/chat", fmt.Sprintf("203.0.113.%d:1", i+1)).Code; c != 200 {
			t.Fatalf("%d", c)
		}
	}
	_, m := f.adminDo(t, "GET", "/admin/limits/a?top=1000", "", "")
	if n := len(topKeys(t, m)); m["truncated"] != true || n == 0 || n >= 100 {
		t.Fatalf("bounded scan: %d keys, truncated %v", n, m["truncated"])
	}
}

// A calendar rule's keys are listed too, with the period's numbers.
func TestAdminTopCalendar(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			opt, _ := configFile(t, `
[[rule]]
name      = "daily"
key       = ["caller"]
algorithm = "calendar"
window    = "day"
limit     = 10
`)
			opts := []option{opt}
			if store == "redis" {
				opts = append(opts, topOnRedis(t, 0))
			}
			f := newFixture(t, opts...)
			for i := range 3 {
				for range i + 1 {
					if c := f.do("/api/chat", fmt.Sprintf("203.0.113.%d:1", i+1)).Code; c != 200 {
						t.Fatalf("caller %d: %d", i, c)
					}
				}
			}
			code, m := f.adminDo(t, "GET", "/admin/limits/daily?top=2", "", "")
			if code != 200 {
				t.Fatalf("top=2: %d %v", code, m)
			}
			keys := topKeys(t, m)
			if len(keys) != 2 || keys[0]["key"] != "caller=ip:203.0.113.3" || keys[0]["used"] != 3.0 || keys[0]["remaining"] != 7.0 ||
				keys[1]["key"] != "caller=ip:203.0.113.2" || keys[1]["used"] != 2.0 {
				t.Fatalf("top=2: %v", m)
			}
		})
	}
}
