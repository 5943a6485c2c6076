package tokens_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// prose is English-like text with punctuation, numbers and some non-ASCII.
func prose(n int) string {
	const para = "The quarterly report, filed on 2024-03-31, shows revenue of $1,234,567 — up 12% year over year. " +
		"Nevertheless, the committee's concerns (see §4.2) remain: café supply costs rose, and naïve forecasts failed.\n"
	return strings.Repeat(para, n/len(para)+1)[:n]
}

func chatBody(text string) string {
	b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []map[string]string{
		{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": text},
	}})
	return string(b)
}

// BenchmarkEstimate counts whole chat bodies (no cap) of several sizes.
func BenchmarkEstimate(b *testing.B) {
	tk := tokens.New()
	if err := tk.Preload(); err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{1 << 10, 100 << 10, 1 << 20} {
		body := chatBody(prose(size))
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(body)}, -1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEarlyStop is an 8 MiB prompt against a 2000-token cap.
func BenchmarkEarlyStop(b *testing.B) {
	tk := tokens.New()
	tk.Preload()
	body := chatBody(prose(8 << 20))
	b.ReportAllocs()
	for b.Loop() {
		est, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(body)}, 2000)
		if err != nil || !est.Stopped {
			b.Fatal(err, est)
		}
	}
}

// BenchmarkCount is the encoder alone on prose, per encoding.
func BenchmarkCount(b *testing.B) {
	tk := tokens.New()
	tk.Preload()
	text := prose(100 << 10)
	for _, model := range []string{"gpt-4o", "gpt-4", "claude-sonnet-4"} {
		b.Run(tk.EncodingName(model), func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				tk.Count(model, text, -1)
			}
		})
	}
}

// BenchmarkAdversarial counts 100 KiB texts built to be slow: one long
// piece (no spaces), long whitespace, marks, CJK without punctuation.
func BenchmarkAdversarial(b *testing.B) {
	tk := tokens.New()
	tk.Preload()
	for name, text := range map[string]string{
		"letters": strings.Repeat("a", 100<<10),
		"base64":  strings.Repeat("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk", 1700),
		"spaces":  strings.Repeat(" ", 100<<10),
		"marks":   strings.Repeat("e\u0301", 100<<10/3),
		"cjk":     strings.Repeat("中文字符", 100<<10/12),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Count("gpt-4o", text, -1)
			}
		})
	}
}
