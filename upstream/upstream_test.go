package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

func TestStatus(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want int
	}{
		{"refused", live, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, http.StatusBadGateway},
		{"response header timeout", live, timeoutErr{}, http.StatusGatewayTimeout},
		{"deadline", live, fmt.Errorf("read: %w", os.ErrDeadlineExceeded), http.StatusGatewayTimeout},
		{"context deadline", live, context.DeadlineExceeded, http.StatusGatewayTimeout},
		{"client went away", gone, context.Canceled, upstream.StatusClientClosed},
		{"client went away during a dial error", gone, errors.New("dial: operation was canceled"), upstream.StatusClientClosed},
		{"unexpected EOF", live, errors.New("unexpected EOF"), http.StatusBadGateway},
	}
	for _, tt := range tests {
		if got := upstream.Status(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// The transport keeps enough idle connections for a burst to one host.
func TestTransportPoolsPerHost(t *testing.T) {
	tr := upstream.NewTransport(0)
	if tr.MaxIdleConnsPerHost < 256 || tr.Proxy != nil || !tr.DisableCompression {
		t.Fatalf("transport %+v", tr)
	}
}

// A client's own Forwarded header never reaches the upstream from an
// untrusted peer; from a trusted proxy it is kept.
func TestForwardedHeaderTrust(t *testing.T) {
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Values("Forwarded")
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	for _, trusted := range []bool{false, true} {
		rp := upstream.New(upstream.Options{Target: target, TrustForwarded: func(*http.Request) bool { return trusted }})
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Header.Set("Forwarded", "for=198.51.100.9")
		rp.ServeHTTP(httptest.NewRecorder(), r)
		if want := trusted; (len(got) == 1) != want {
			t.Errorf("trusted=%v: upstream saw Forwarded %q", trusted, got)
		}
	}
}
