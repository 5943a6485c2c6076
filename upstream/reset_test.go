package upstream

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// resetNow is the fixed "now" of the tests: dates below are relative to it.
var resetNow = time.Date(2025, time.March, 4, 5, 6, 7, 0, time.UTC)

// hdr builds a header from name/value pairs with Add, so that a name given
// twice has two values and names are canonicalised as on the wire.
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestResetAfter(t *testing.T) {
	in30s := resetNow.Add(30 * time.Second).Format(time.RFC3339)
	in90s := resetNow.Add(90 * time.Second).Format(time.RFC3339)
	in5m := resetNow.Add(5 * time.Minute).Format(time.RFC3339)
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"none", hdr(), 0, false},
		{"unrelated headers", hdr("Content-Type", "application/json", "X-Ratelimit-Remaining-Requests", "0"), 0, false},

		// retry-after-ms
		{"ms integer", hdr("retry-after-ms", "1500"), 1500 * time.Millisecond, true},
		{"ms decimal", hdr("retry-after-ms", "20.5"), 20500 * time.Microsecond, true},
		{"ms decimal rounds up to ns", hdr("retry-after-ms", "0.0000001"), 1, true},
		{"ms digit past 18 decimals rounds up", hdr("retry-after-ms", "2.0000000000000000001"), 2*time.Millisecond + 1, true},
		{"ms zeros past 18 decimals", hdr("retry-after-ms", "2."+strings.Repeat("0", 40)), 2 * time.Millisecond, true},
		{"ms leading dot", hdr("retry-after-ms", ".5"), 500 * time.Microsecond, true},
		{"ms trailing dot", hdr("retry-after-ms", "5."), 5 * time.Millisecond, true},
		{"ms zero", hdr("retry-after-ms", "0"), 0, true},
		{"ms negative", hdr("retry-after-ms", "-5"), 0, true},
		{"ms whitespace", hdr("retry-after-ms", " \t250 "), 250 * time.Millisecond, true},
		{"ms name case", hdr("RETRY-AFTER-MS", "250"), 250 * time.Millisecond, true},
		{"ms first value counts", hdr("retry-after-ms", "100", "retry-after-ms", "900"), 100 * time.Millisecond, true},
		{"ms huge capped", hdr("retry-after-ms", "99999999999999999999"), MaxReset, true},
		{"ms just under cap", hdr("retry-after-ms", "3599999.999999"), MaxReset - 1, true},

		// Retry-After
		{"seconds", hdr("Retry-After", "120"), 2 * time.Minute, true},
		{"seconds decimal", hdr("Retry-After", "1.25"), 1250 * time.Millisecond, true},
		{"seconds zero", hdr("Retry-After", "0"), 0, true},
		{"seconds negative", hdr("Retry-After", "-5"), 0, true},
		{"seconds capped", hdr("Retry-After", "86400"), MaxReset, true},
		{"seconds huge capped", hdr("Retry-After", "99999999999999999999"), MaxReset, true},
		{"seconds many digits capped", hdr("Retry-After", "1"+strings.Repeat("0", 400)), MaxReset, true},
		{"seconds first value counts", hdr("Retry-After", "7", "Retry-After", "9"), 7 * time.Second, true},
		{"IMF-fixdate", hdr("Retry-After", "Tue, 04 Mar 2025 05:06:37 GMT"), 30 * time.Second, true},
		{"RFC 850 date", hdr("Retry-After", "Tuesday, 04-Mar-25 05:06:37 GMT"), 30 * time.Second, true},
		{"asctime date", hdr("Retry-After", "Tue Mar  4 05:06:37 2025"), 30 * time.Second, true},
		{"past date", hdr("Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT"), 0, true},
		{"date now", hdr("Retry-After", "Tue, 04 Mar 2025 05:06:07 GMT"), 0, true},
		{"far date capped", hdr("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT"), MaxReset, true},
		{"RFC 3339 is not an HTTP-date", hdr("Retry-After", in30s), 0, false},

		// precedence
		{"ms beats Retry-After", hdr("retry-after-ms", "250", "Retry-After", "10"), 250 * time.Millisecond, true},
		{"ms beats reset headers", hdr("retry-after-ms", "250", "x-ratelimit-reset-requests", "10s", "x-ratelimit-remaining-requests", "0"), 250 * time.Millisecond, true},
		{"Retry-After beats reset headers", hdr("Retry-After", "3", "x-ratelimit-reset-requests", "10s", "anthropic-ratelimit-requests-reset", in90s), 3 * time.Second, true},
		{"zero ms still beats Retry-After", hdr("retry-after-ms", "0", "Retry-After", "10"), 0, true},
		{"bad ms falls through to Retry-After", hdr("retry-after-ms", "soon", "Retry-After", "10"), 10 * time.Second, true},
		{"bad ms and Retry-After fall through", hdr("retry-after-ms", "NaN", "Retry-After", "later", "x-ratelimit-reset-tokens", "6m0s"), 6 * time.Minute, true},

		// OpenAI reset durations
		{"openai 1s", hdr("x-ratelimit-reset-requests", "1s"), time.Second, true},
		{"openai 6m0s", hdr("x-ratelimit-reset-tokens", "6m0s"), 6 * time.Minute, true},
		{"openai 20ms", hdr("x-ratelimit-reset-requests", "20ms"), 20 * time.Millisecond, true},
		{"openai 1h2m3.5s", hdr("x-ratelimit-reset-requests", "1h2m3.5s"), MaxReset, true},
		{"openai 2m3.5s", hdr("x-ratelimit-reset-requests", "2m3.5s"), 2*time.Minute + 3500*time.Millisecond, true},
		{"openai 59m59.999s", hdr("x-ratelimit-reset-requests", "59m59.999s"), MaxReset - time.Millisecond, true},
		{"openai days capped", hdr("x-ratelimit-reset-requests", "2d3h"), MaxReset, true},
		{"openai fractional day", hdr("x-ratelimit-reset-requests", "0.0005d"), 43200 * time.Millisecond, true},
		{"openai micro sign", hdr("x-ratelimit-reset-requests", "1µs"), time.Microsecond, true},
		{"openai greek mu", hdr("x-ratelimit-reset-requests", "1μs"), time.Microsecond, true},
		{"openai us and ns", hdr("x-ratelimit-reset-requests", "1us5ns"), time.Microsecond + 5, true},
		{"openai plain seconds", hdr("x-ratelimit-reset-requests", "17"), 17 * time.Second, true},
		{"openai plain decimal seconds", hdr("x-ratelimit-reset-requests", "0.5"), 500 * time.Millisecond, true},
		{"openai 0s", hdr("x-ratelimit-reset-requests", "0s"), 0, true},
		{"openai negative", hdr("x-ratelimit-reset-requests", "-1m"), 0, true},
		{"openai huge term capped", hdr("x-ratelimit-reset-requests", "99999999999999999999h1s"), MaxReset, true},

		// Anthropic reset timestamps
		{"anthropic requests", hdr("anthropic-ratelimit-requests-reset", in30s), 30 * time.Second, true},
		{"anthropic tokens", hdr("anthropic-ratelimit-tokens-reset", in90s), 90 * time.Second, true},
		{"anthropic input tokens", hdr("anthropic-ratelimit-input-tokens-reset", in30s), 30 * time.Second, true},
		{"anthropic output tokens", hdr("anthropic-ratelimit-output-tokens-reset", in5m), 5 * time.Minute, true},
		{"anthropic offset and fraction", hdr("anthropic-ratelimit-requests-reset", "2025-03-04T07:06:08.25+02:00"), 1250 * time.Millisecond, true},
		{"anthropic past", hdr("anthropic-ratelimit-requests-reset", "2025-03-04T05:00:00Z"), 0, true},
		{"anthropic far capped", hdr("anthropic-ratelimit-requests-reset", "2030-01-01T00:00:00Z"), MaxReset, true},

		// which reset: exhausted beats not exhausted, longest wins
		{"longest when none exhausted",
			hdr("x-ratelimit-reset-requests", "2s", "x-ratelimit-reset-tokens", "6m0s"), 6 * time.Minute, true},
		{"longest when remaining unknown or nonzero",
			hdr("x-ratelimit-reset-requests", "2s", "x-ratelimit-remaining-requests", "5", "x-ratelimit-reset-tokens", "6m0s"), 6 * time.Minute, true},
		{"exhausted requests beat longer tokens",
			hdr("x-ratelimit-reset-requests", "2s", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-tokens", "6m0s", "x-ratelimit-remaining-tokens", "120"), 2 * time.Second, true},
		{"exhausted tokens",
			hdr("x-ratelimit-reset-requests", "2s", "x-ratelimit-remaining-requests", "3", "x-ratelimit-reset-tokens", "6m0s", "x-ratelimit-remaining-tokens", " 0 "), 6 * time.Minute, true},
		{"longest of the exhausted",
			hdr("x-ratelimit-reset-requests", "2s", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-tokens", "20s", "x-ratelimit-remaining-tokens", "0",
				"anthropic-ratelimit-output-tokens-reset", in5m), 20 * time.Second, true},
		{"anthropic exhausted input beats longer tokens",
			hdr("anthropic-ratelimit-input-tokens-reset", in30s, "anthropic-ratelimit-input-tokens-remaining", "0",
				"anthropic-ratelimit-tokens-reset", in5m, "anthropic-ratelimit-tokens-remaining", "4000",
				"anthropic-ratelimit-requests-reset", in90s, "anthropic-ratelimit-requests-remaining", "49"), 30 * time.Second, true},
		{"anthropic exhausted output vs openai exhausted",
			hdr("anthropic-ratelimit-output-tokens-reset", in90s, "anthropic-ratelimit-output-tokens-remaining", "0",
				"x-ratelimit-reset-requests", "20s", "x-ratelimit-remaining-requests", "0"), 90 * time.Second, true},
		{"exhausted but unreadable reset is skipped",
			hdr("x-ratelimit-reset-requests", "soon", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-tokens", "6s"), 6 * time.Second, true},
		{"exhausted past reset is 0",
			hdr("anthropic-ratelimit-requests-reset", "2025-03-04T05:00:00Z", "anthropic-ratelimit-requests-remaining", "0", "x-ratelimit-reset-tokens", "6s"), 0, true},
		{"remaining 0.0 is not known exhausted",
			hdr("x-ratelimit-reset-requests", "2s", "x-ratelimit-remaining-requests", "0.0", "x-ratelimit-reset-tokens", "6s"), 6 * time.Second, true},

		// garbage: ignored, falls through, never panics
		{"ms exponent", hdr("retry-after-ms", "1e309"), 0, false},
		{"ms exponent small", hdr("retry-after-ms", "1e3"), 0, false},
		{"ms NaN", hdr("retry-after-ms", "NaN"), 0, false},
		{"ms Inf", hdr("retry-after-ms", "Inf"), 0, false},
		{"ms +Inf", hdr("retry-after-ms", "+Inf"), 0, false},
		{"ms hex", hdr("retry-after-ms", "0x10"), 0, false},
		{"ms plus sign", hdr("retry-after-ms", "+5"), 0, false},
		{"ms double minus", hdr("retry-after-ms", "--5"), 0, false},
		{"ms lone minus", hdr("retry-after-ms", "-"), 0, false},
		{"ms lone dot", hdr("retry-after-ms", "."), 0, false},
		{"ms two dots", hdr("retry-after-ms", "1.2.3"), 0, false},
		{"ms underscore", hdr("retry-after-ms", "1_000"), 0, false},
		{"ms inner space", hdr("retry-after-ms", "1 000"), 0, false},
		{"ms comma list", hdr("retry-after-ms", "100, 200"), 0, false},
		{"ms unit", hdr("retry-after-ms", "100ms"), 0, false},
		{"empty values", hdr("retry-after-ms", "", "Retry-After", "   "), 0, false},
		{"Retry-After garbage", hdr("Retry-After", "tomorrow"), 0, false},
		{"Retry-After exponent", hdr("Retry-After", "1e309"), 0, false},
		{"Retry-After unit", hdr("Retry-After", "10s"), 0, false},
		{"openai no unit after term", hdr("x-ratelimit-reset-requests", "1m30"), 0, false},
		{"openai unknown unit", hdr("x-ratelimit-reset-requests", "5y"), 0, false},
		{"openai unit only", hdr("x-ratelimit-reset-requests", "s"), 0, false},
		{"openai inner minus", hdr("x-ratelimit-reset-requests", "1s-2s"), 0, false},
		{"openai space", hdr("x-ratelimit-reset-requests", "1m 30s"), 0, false},
		{"openai upper case", hdr("x-ratelimit-reset-requests", "1M"), 0, false},
		{"openai dot term", hdr("x-ratelimit-reset-requests", ".s"), 0, false},
		{"openai exponent", hdr("x-ratelimit-reset-requests", "1e309s"), 0, false},
		{"anthropic not a timestamp", hdr("anthropic-ratelimit-requests-reset", "30"), 0, false},
		{"anthropic no zone", hdr("anthropic-ratelimit-requests-reset", "2025-03-04T05:06:37"), 0, false},
		{"all garbage", hdr("retry-after-ms", "x", "Retry-After", "y", "x-ratelimit-reset-requests", "z", "x-ratelimit-reset-tokens", "w",
			"anthropic-ratelimit-requests-reset", "v", "anthropic-ratelimit-tokens-reset", "u",
			"anthropic-ratelimit-input-tokens-reset", "t", "anthropic-ratelimit-output-tokens-reset", "s"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ResetAfter(tt.h, resetNow)
			if got != tt.want || ok != tt.ok {
				t.Errorf("ResetAfter(%v) = %v, %v; want %v, %v", tt.h, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestSetRetryAfter(t *testing.T) {
	tests := []struct {
		d       time.Duration
		seconds string
		ms      string
	}{
		{1200 * time.Millisecond, "2", "1200"},
		{0, "1", "1"},
		{-time.Hour, "1", "1"},
		{1, "1", "1"},
		{999100 * time.Microsecond, "1", "1000"},
		{time.Second, "1", "1000"},
		{time.Second + 1, "2", "1001"},
		{MaxReset, "3600", "3600000"},
		{time.Duration(1<<63 - 1), "9223372037", "9223372036855"},
	}
	for _, tt := range tests {
		h := hdr("Retry-After", "999", "Retry-After", "998", "retry-after-ms", "7")
		SetRetryAfter(h, tt.d)
		if got := h.Values("Retry-After"); len(got) != 1 || got[0] != tt.seconds {
			t.Errorf("SetRetryAfter(%v): Retry-After %q, want %q", tt.d, got, tt.seconds)
		}
		if got := h.Values("retry-after-ms"); len(got) != 1 || got[0] != tt.ms {
			t.Errorf("SetRetryAfter(%v): retry-after-ms %q, want %q", tt.d, got, tt.ms)
		}
	}
}

// TestSetRetryAfterRoundTrip: what SetRetryAfter writes, ResetAfter reads
// back as at least the wait (never sending a caller back early) and less
// than a millisecond more.
func TestSetRetryAfterRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{1, 999100 * time.Microsecond, 1200 * time.Millisecond, 59*time.Minute + 1} {
		h := http.Header{}
		SetRetryAfter(h, d)
		got, ok := ResetAfter(h, resetNow)
		if !ok || got < d || got-d >= time.Millisecond {
			t.Errorf("round trip of %v: %v, %v", d, got, ok)
		}
	}
}

// FuzzResetAfter: whatever the headers say, ResetAfter neither panics nor
// leaves [0, MaxReset], reports 0 when it found nothing, and reads back
// what SetRetryAfter wrote.
func FuzzResetAfter(f *testing.F) {
	f.Add("1500", "Tue, 04 Mar 2025 05:06:37 GMT", "1h2m3.5s", "0", "2025-03-04T05:06:37Z", "0", int64(0))
	f.Add("1e309", "99999999999999999999", "2d3h", "5", "2030-01-01T00:00:00Z", "", int64(-1))
	f.Add("NaN", "-5", "0x10", "0", "garbage", "0", int64(1<<63-1))
	f.Add("", "Tuesday, 04-Mar-25 05:06:37 GMT", "", "", "", "", int64(1200e6))
	f.Add(" Inf ", "Tue Mar  4 05:06:37 2025", "-1m", "0", "0001-01-01T00:00:00Z", "0", int64(-1<<63))
	f.Fuzz(func(t *testing.T, ms, ra, reset, remaining, anthropic, anthropicRemaining string, d int64) {
		h := http.Header{}
		h.Set("retry-after-ms", ms)
		h.Set("Retry-After", ra)
		h.Set("x-ratelimit-reset-tokens", reset)
		h.Set("x-ratelimit-remaining-tokens", remaining)
		h.Set("anthropic-ratelimit-input-tokens-reset", anthropic)
		h.Set("anthropic-ratelimit-input-tokens-remaining", anthropicRemaining)
		for _, hh := range []http.Header{h, {"X-Ratelimit-Reset-Requests": {ms}}, {"Retry-After": {reset}}} {
			got, ok := ResetAfter(hh, resetNow)
			if got < 0 || got > MaxReset || !ok && got != 0 {
				t.Fatalf("ResetAfter(%v) = %v, %v", hh, got, ok)
			}
		}

		want := min(max(time.Duration(d), 0), MaxReset)
		h = http.Header{}
		SetRetryAfter(h, time.Duration(d))
		got, ok := ResetAfter(h, resetNow)
		// Up to 1 ms over: a wait of 0 or less is still written as 1 ms.
		if !ok || got < want || got-want > time.Millisecond {
			t.Fatalf("SetRetryAfter(%v) read back as %v, %v (headers %v)", time.Duration(d), got, ok, h)
		}
		if s, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64); err != nil || s < 1 {
			t.Fatalf("SetRetryAfter(%v): Retry-After %q", time.Duration(d), h.Get("Retry-After"))
		}
	})
}
