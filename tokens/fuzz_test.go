package tokens_test

import (
	"errors"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// FuzzEstimateJSON: any body either counts or is ErrInvalid; never a panic,
// a hang or another error; a capped count never exceeds the uncapped one
// and stops only past the cap.
func FuzzEstimateJSON(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"a":{"type":"string","enum":["x",1]}}}}}]}`,
		`{"model":"claude-3","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`,
		`{"prompt":[[1,2],[3]],"input":["a",{"role":"user","content":"b"}]}`,
		`{"a":"\ud83d\ude00\u0000\ud800","b":[1e5,-0.5,true,false,null]}`,
		`{"model":"claude-3","messages":[{"role":"user","content":[{"type":"document","title":"t","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK"}},{"type":"document","source":{"type":"text","data":"x"}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=","format":"wav"}},{"type":"file","file":{"file_data":"data:text/plain;base64,aGk=","filename":"a.txt"}}]}],"MODEL":"gpt-4o"}`,
		`{"input":[{"type":"input_file","file_data":"data:application/pdf;base64,JVBERi0=","filename":"a.pdf"},{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]}],"text":{"format":{"type":"json_schema","schema":{"a":"b"}}}}`,
		`{"model":"a","model":"b"}`, `[{"prompt":"a"},{"prompt":"b"}]`, "{\"prompt\":\"\xe2\x82\"}",
		`[]`, `{}`, `{"x":`, ``,
	} {
		f.Add(s, 5)
	}
	tk := tokens.New()
	tk.Preload()
	formats := []tokens.Format{tokens.FormatChat, tokens.FormatMessages, tokens.FormatResponses, tokens.FormatSeedChat, tokens.FormatGeneric}
	f.Fuzz(func(t *testing.T, body string, limit int) {
		if limit < 0 {
			limit = -limit
		}
		format := formats[len(body)%len(formats)]
		req := tokens.Request{Format: format, ContentType: "application/json", Body: []byte(body)}
		full, err := tk.Estimate(req, -1)
		if err != nil {
			if !errors.Is(err, tokens.ErrInvalid) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		capped, err := tk.Estimate(req, limit)
		if err != nil && !errors.Is(err, tokens.ErrInvalid) {
			t.Fatalf("capped: %v", err)
		}
		if err == nil && (capped.Tokens > full.Tokens || capped.Stopped != (full.Tokens > limit) || (!capped.Stopped && capped.Tokens != full.Tokens)) {
			t.Fatalf("limit %d: capped %+v, full %+v", limit, capped, full)
		}
	})
}

// FuzzEstimateMultipart feeds arbitrary bodies as multipart with a fixed
// boundary.
func FuzzEstimateMultipart(f *testing.F) {
	f.Add("--b\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\nhello\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nfile text\r\n--b--\r\n")
	f.Add("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n\r\n\x89PNG\r\n\x1a\n\r\n--b--\r\n")
	f.Add("--b--")
	tk := tokens.New()
	tk.Preload()
	f.Fuzz(func(t *testing.T, body string) {
		_, err := tk.Estimate(tokens.Request{Format: tokens.FormatSeedChat, ContentType: "multipart/form-data; boundary=b", Body: []byte(body)}, 2000)
		if err != nil && !errors.Is(err, tokens.ErrInvalid) {
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}
