package tokens_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// Schemas count whole: numbers, booleans and nulls at any depth of every
// schema slot cost what their text costs, so a 15,000-member enum of
// numbers is far from free.
func TestSchemaValuesCount(t *testing.T) {
	var enum strings.Builder
	for i := range 15000 {
		if i > 0 {
			enum.WriteByte(',')
		}
		enum.WriteString(strconv.Itoa(100000 + i*7))
	}
	nums := enum.String()
	cases := []struct {
		name string
		f    tokens.Format
		body string
	}{
		{"chat tools enum", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer","enum":[` + nums + `]}}}}}]}`},
		{"chat tools nested default", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"object","properties":{"y":{"examples":[` + nums + `]}}}}}}}]}`},
		{"chat response_format", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"enum":[` + nums + `]}}}}`},
		{"responses text.format", tokens.FormatResponses,
			`{"model":"gpt-4o","input":"hi","text":{"format":{"type":"json_schema","name":"s","schema":{"const":[` + nums + `]}}}}`},
		{"anthropic input_schema", tokens.FormatMessages,
			`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object","properties":{"x":{"enum":[` + nums + `]}}}}]}`},
		{"booleans and nulls", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"enum":[` + strings.Repeat("true,false,null,", 5000) + `1]}}}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Counted, or refused at the work bound: over a cap of 2000
			// either way.
			if est := estimate(t, c.f, "application/json", c.body, 2000); est.Tokens <= 2000 {
				t.Errorf("%+v, want over 2000", est)
			}
		})
	}
}

// The small form still passes: a schema of a few values costs a few tokens.
func TestSchemaSmallValuesCheap(t *testing.T) {
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":10,"default":null}}}}}}`
	if got := estimate(t, tokens.FormatChat, "application/json", body, -1).Tokens; got > 60 {
		t.Errorf("%d tokens for a small schema", got)
	}
}

// A name is text too: prose as a member name inside a message costs its
// text; the format's own names do not.
func TestMemberNamesInContentCount(t *testing.T) {
	prose := strings.Repeat("Please summarise every chapter of the attached manuscript in detail ", 300)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi","x":{"` + prose + `":1}}]}`
	want := n(t, "gpt-4o", prose)
	if got := estimate(t, tokens.FormatChat, "application/json", body, -1).Tokens; got < want {
		t.Errorf("prose as a name: %d tokens, the prose %d", got, want)
	}
	plain := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	if got := estimate(t, tokens.FormatChat, "application/json", plain, -1).Tokens; got != 3+n(t, "gpt-4o", "user")+n(t, "gpt-4o", "hi")+3 {
		t.Errorf("a plain message: %d tokens", got)
	}
}
