package tokens_test

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

func edited(t *testing.T, body string) (string, error) {
	t.Helper()
	r := []byte(body)
	edits, err := tokens.IncludeUsage(r)
	if err != nil {
		return "", err
	}
	out, n := tokens.Edited(r, edits)
	b, err := io.ReadAll(out)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != n {
		t.Fatalf("size %d, read %d", n, len(b))
	}
	return string(b), nil
}

func TestIncludeUsage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"gpt-4o","stream":true}`, `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`},
		{"{ }", `{ "stream_options":{"include_usage":true}}`},
		{` {"stream":true} ` + "\n", ` {"stream":true,"stream_options":{"include_usage":true}} ` + "\n"},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream_options":null,"n":1}`, `{"stream_options":{"include_usage":true},"n":1}`},
		{`{"stream_options": {"include_obfuscation": false, "Include_Usage": false} ,"x":[{"stream_options":1}]}`,
			`{"stream_options": {"include_obfuscation": false,"include_usage":true} ,"x":[{"stream_options":1}]}`},
		// Every copy in every spelling gets the last copy's value.
		{`{"Stream_Options":{"include_usage":true},"stream\u005foptions":{"a":"}"}}`,
			`{"Stream_Options":{"a":"}","include_usage":true},"stream\u005foptions":{"a":"}","include_usage":true}}`},
		{`{"messages":[{"role":"user","content":"{\"stream_options\":1}"}],"stream":true}`,
			`{"messages":[{"role":"user","content":"{\"stream_options\":1}"}],"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		got, err := edited(t, tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.in, got, tc.want)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(got), &v); err != nil {
			t.Errorf("%s: edited body is not JSON: %v", tc.in, err)
		}
	}
	for _, bad := range []string{`[1,2]`, `{"a":`, `{"a" 1}`, ``, `"x"`, `{"a":[1,}`} {
		if _, err := edited(t, bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzIncludeUsage(f *testing.F) {
	f.Add([]byte(`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false}}`))
	f.Add([]byte(`{"a":[{"b":"\"}"}],"Stream_Options":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		edits, err := tokens.IncludeUsage(body)
		if err != nil || !json.Valid(body) {
			return
		}
		out, _ := tokens.Edited(body, edits)
		b, _ := io.ReadAll(out)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("valid %s edited into invalid %s: %v", body, b, err)
		}
		found := false
		for k, val := range v {
			if strings.EqualFold(k, "stream_options") {
				so, _ := val.(map[string]any)
				if so == nil || so["include_usage"] != true {
					t.Fatalf("%s edited into %s: %s has no include_usage", body, b, k)
				}
				found = true
			}
		}
		if !found {
			t.Fatalf("%s edited into %s: no stream_options", body, b)
		}
	})
}
