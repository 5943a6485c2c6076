package tokens_test

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

var tk = tokens.New()

func estimate(t testing.TB, f tokens.Format, contentType, body string, limit int) tokens.Estimate {
	t.Helper()
	est, err := tk.Estimate(tokens.Request{Format: f, ContentType: contentType, Body: []byte(body)}, limit)
	if err != nil {
		t.Fatalf("Estimate: %v", err)
	}
	return est
}

func withModel(t *testing.T, file, model string) string {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
		var msgs []any
		if err := json.Unmarshal(raw, &msgs); err != nil {
			t.Fatal(err)
		}
		body = map[string]any{"messages": msgs}
	} else if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	body["model"] = model
	out, _ := json.Marshal(body)
	return string(out)
}

// The reference points of OpenAI's cookbook "How to count tokens with
// tiktoken": the estimates equal the usage.prompt_tokens the API reported.
func TestCookbook(t *testing.T) {
	tests := []struct {
		file, model string
		want        int
		encoding    string
	}{
		{"cookbook_messages.json", "gpt-3.5-turbo", 129, tokens.CL100KBase},
		{"cookbook_messages.json", "gpt-4", 129, tokens.CL100KBase},
		{"cookbook_messages.json", "gpt-4o", 124, tokens.O200KBase},
		{"cookbook_messages.json", "gpt-4o-mini", 124, tokens.O200KBase},
		{"cookbook_tools.json", "gpt-3.5-turbo", 105, tokens.CL100KBase},
		{"cookbook_tools.json", "gpt-4", 105, tokens.CL100KBase},
		{"cookbook_tools.json", "gpt-4o", 101, tokens.O200KBase},
		{"cookbook_tools.json", "gpt-4o-mini", 101, tokens.O200KBase},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+tt.model, func(t *testing.T) {
			est := estimate(t, tokens.FormatChat, "application/json", withModel(t, tt.file, tt.model), -1)
			if est.Tokens != tt.want || est.Encoding != tt.encoding || est.Model != tt.model || est.Stopped {
				t.Fatalf("got %+v, want %d tokens in %s", est, tt.want, tt.encoding)
			}
		})
	}
}
