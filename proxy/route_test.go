package proxy

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

func testRoutes(t testing.TB, entries ...string) *routes {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return newRoutes(entries, m)
}

// requestTo builds a request the way the server parses the request line,
// so Path and RawPath are what a client's bytes give.
func requestTo(target string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://proxy.test", nil)
	r.RequestURI = target
	u, err := url.ParseRequestURI(target)
	if err != nil {
		panic(err)
	}
	r.URL = u
	return r
}

func TestRouteMatching(t *testing.T) {
	rs := testRoutes(t, append(append([]string(nil), config.DefaultProtectedPaths...),
		"/openai/deployments/*/chat/completions", "/v2/*", "/Admin/Batch/")...)
	tests := []struct {
		target string
		want   string // the entry matched; "" for none
	}{
		// Honest spellings.
		{"/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/completions?x=1", "/v1/chat/completions"},
		{"/api/chat", "/api/chat"},
		{"/v1/messages", "/v1/messages"},
		{"/v1/models", ""},
		{"/v1/chat", ""},
		{"/v1/chat/completionsx", ""},
		{"/v1/chat/completions/x", ""},
		{"/v1/files/a%2520b", ""},
		{"/", ""},
		// Disguises a router may take for a protected path.
		{"/V1/Chat/Completions", "/v1/chat/completions"},
		{"/v1/CHAT/completions", "/v1/chat/completions"},
		{"/v1/chat/completion%C5%BF", "/v1/chat/completions"}, // ſ folds to s
		{"/v1/chat/completions;x=1", "/v1/chat/completions"},
		{"/v1;a/chat/completions", "/v1/chat/completions"},
		{"/v1/chat;a=b/completions;c", "/v1/chat/completions"},
		{"/v1/chat/completions%3Bx", "/v1/chat/completions"},
		{"/v1//chat///completions/", "/v1/chat/completions"},
		{"//v1/chat/completions", "/v1/chat/completions"},
		{"/v1/./chat/completions", "/v1/chat/completions"},
		{"/v1/x/../chat/completions", "/v1/chat/completions"},
		{"/../v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/..;/chat/completions", "/v1/chat/completions"},
		{"/v1/chat%2Fcompletions", "/v1/chat/completions"},
		{"/v1/chat%2fcompletions", "/v1/chat/completions"},
		{"/v1%2Fchat%2Fcompletions", "/v1/chat/completions"},
		{"/v1/%63hat/completions", "/v1/chat/completions"},
		{"/v1/%2563hat/completions", "/v1/chat/completions"}, // decoded twice
		{"/v1/x/%2e%2e/chat/completions", "/v1/chat/completions"},
		{"/v1/x/..%2Fchat/completions", "/v1/chat/completions"},
		{"/v1\\chat\\completions", "/v1/chat/completions"},
		{"/v1/chat%5Ccompletions", "/v1/chat/completions"},
		// Only the servlet reading (an encoded slash stays in its segment)
		// resolves this to the protected path.
		{"/v1/chat/completions/a%2F../..", "/v1/chat/completions"},
		{"/v1/Messages/", "/v1/messages"},
		// * entries.
		{"/openai/deployments/gpt-4o/chat/completions", "/openai/deployments/*/chat/completions"},
		{"/OpenAI/deployments/my%20dep/chat/completions;v=1", "/openai/deployments/*/chat/completions"},
		{"/openai/deployments/chat/completions", ""},
		{"/openai/deployments/a/b/chat/completions", ""},
		// Routers matching raw segments take an encoded slash, "." or ".."
		// for the deployment name.
		{"/openai/deployments/gpt%2F4o/chat/completions", "/openai/deployments/*/chat/completions"},
		{"/openai/deployments/meta-llama%2FLlama-3-8B/chat/completions", "/openai/deployments/*/chat/completions"},
		{"/openai/deployments/%2e%2e/chat/completions", "/openai/deployments/*/chat/completions"},
		{"/openai/deployments/./chat/completions", "/openai/deployments/*/chat/completions"},
		{"/v2", "/v2/*"},
		{"/v2/", "/v2/*"},
		{"/v2/anything/deeper", "/v2/*"},
		{"/V2;x/anything", "/v2/*"},
		{"/v2x", ""},
		{"/admin/batch", "/Admin/Batch/"},
	}
	for _, tt := range tests {
		rt, c := rs.match(requestTo(tt.target))
		got := ""
		if rt != nil {
			got = rt.label
		}
		if got != tt.want {
			t.Errorf("%s: matched %q (canonical %q), want %q", tt.target, got, c, tt.want)
		}
	}
}

func TestPostLike(t *testing.T) {
	tests := []struct {
		method string
		hdr    []string
		want   bool
	}{
		{"POST", nil, true},
		{"post", nil, true},
		{"GET", nil, false},
		{"PUT", nil, false},
		{"GET", []string{"X-HTTP-Method-Override", "POST"}, true},
		{"GET", []string{"X-HTTP-Method", "post"}, true},
		{"PUT", []string{"X-Method-Override", " Post "}, true},
		{"GET", []string{"X-HTTP-Method-Override", "GET, POST"}, true},
		{"POST", []string{"X-HTTP-Method-Override", "GET"}, true}, // the upstream may ignore the override
		{"GET", []string{"X-HTTP-Method-Override", "PUT"}, false},
		{"GET", []string{"X_HTTP_METHOD_OVERRIDE", "POST"}, true}, // read as the same header by CGI and WSGI servers
		{"GET", []string{"X-Override", "POST"}, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, "/v1/chat/completions", nil)
		for i := 0; i+1 < len(tt.hdr); i += 2 {
			r.Header.Add(tt.hdr[i], tt.hdr[i+1])
		}
		if got := postLike(r); got != tt.want {
			t.Errorf("%s %q: %v, want %v", tt.method, tt.hdr, got, tt.want)
		}
	}
}

// The fast path must agree with the full readings: a path it calls
// canonical is its own reading under both.
func FuzzRouteCanonical(f *testing.F) {
	for _, s := range []string{"/v1/chat/completions", "/V1//x/../a;b/%2e%2E/", "/v1/chat%2Fcompletions", "/a%2F../..", `/a\b`, "/%zz/%2", "/ſ", "/.../..a/.a."} {
		f.Add(s)
	}
	rs := testRoutes(f, append(append([]string(nil), config.DefaultProtectedPaths...), "/openai/deployments/*/chat/completions", "/v2/*")...)
	f.Fuzz(func(t *testing.T, target string) {
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		r := httptest.NewRequest(http.MethodPost, "http://proxy.test", nil)
		u, err := url.ParseRequestURI(target)
		if err != nil || u.Path == "" {
			return
		}
		r.URL = u
		p := u.Path
		a, b := decodedReading(p), servletReading(u.EscapedPath())
		if isCanonical(p) && u.RawPath == "" && (a != p || b != p) {
			t.Fatalf("%q called canonical, but reads as %q and %q", target, a, b)
		}
		if decodedReading(a) != a {
			t.Fatalf("reading %q of %q is not canonical", a, target)
		}
		rt, c := rs.match(r)
		if rt == nil && (rs.lookup(a) != nil || rs.lookup(b) != nil) {
			t.Fatalf("%q unprotected, but a reading matches", target)
		}
		if rt != nil && rs.lookup(c) != rt {
			t.Fatalf("%q: matched %q through %q, which does not match it", target, rt.label, c)
		}
	})
}

func BenchmarkRoute(b *testing.B) {
	rs := testRoutes(b, append(append([]string(nil), config.DefaultProtectedPaths...), "/openai/deployments/*/chat/completions")...)
	for _, tc := range []struct{ name, target string }{
		{"exact", "/v1/chat/completions"},
		{"canonical-miss", "/v1/models/gpt-4o-mini"},
		{"pattern", "/openai/deployments/gpt-4o/chat/completions"},
		{"disguised", "/V1//chat;x=1/./completions%2F"},
		{"long-disguised", "/" + strings.Repeat("a%2F..%2F", 200) + "v1/chat/completions"},
	} {
		r := requestTo(tc.target)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rs.match(r)
			}
		})
	}
}
