package tokens_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/png"
	"mime/multipart"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// n counts text alone, as model's encoding does.
func n(t testing.TB, model, text string) int {
	t.Helper()
	c, err := tk.Count(model, text, -1)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// other is what a model of another provider is charged for one text:
// cl100k_base's count, never below ⌈characters ÷ 3.5⌉.
func other(t testing.TB, text string) int {
	t.Helper()
	return max(n(t, "gpt-4", text), (len([]rune(text))*2+6)/7)
}

func pngDataURL(t testing.TB, w, h int) string {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

func TestFormats(t *testing.T) {
	const m = "gpt-4o"
	img := pngDataURL(t, 1024, 1024) // 768×768 after scaling: 4 tiles
	wide := pngDataURL(t, 4096, 1024)
	tests := []struct {
		name   string
		format tokens.Format
		body   string
		want   int
	}{
		{"chat, text parts", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"Hello there"},{"type":"text","text":"General Kenobi"}]}]}`,
			3 + n(t, m, "user") + n(t, m, "Hello there") + n(t, m, "General Kenobi") + 3},
		{"chat, image high", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + img + `","detail":"high"}}]}]}`,
			3 + n(t, m, "user") + 85 + 170*4 + 3},
		{"chat, image auto, wide", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + wide + `"}}]}]}`,
			// 4096×1024 → 2048×512 (fits 2048), short side 512 ≤ 768: 4×1 tiles
			3 + n(t, m, "user") + 85 + 170*4 + 3},
		{"chat, image low", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + img + `","detail":"low"}}]}]}`,
			3 + n(t, m, "user") + 85 + 3},
		{"chat, remote image: the largest image at its detail (768×2048, 2×4 tiles)", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]}`,
			3 + n(t, m, "user") + 85 + 170*8 + 3},
		{"chat, remote image low", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"low"}}]}]}`,
			3 + n(t, m, "user") + 85 + 3},
		{"chat, gpt-4o-mini image low", tokens.FormatChat,
			`{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x","detail":"low"}}]}]}`,
			3 + n(t, m, "user") + 2833 + 3},
		{"chat, tool calls and tool result", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"22 C"}]}`,
			3 + n(t, m, "assistant") + n(t, m, "get_weather") + n(t, m, `{"city":"Rome"}`) +
				3 + n(t, m, "tool") + n(t, m, "22 C") + 3}, // ids are metadata
		{"chat, name", tokens.FormatChat,
			`{"messages":[{"role":"user","name":"bob","content":"hi"}],"model":"gpt-4o"}`,
			3 + n(t, m, "user") + n(t, m, "bob") + 1 + n(t, m, "hi") + 3},
		{"completions, prompt string", tokens.FormatCompletions,
			`{"model":"gpt-4o","prompt":"Say this is a test"}`, n(t, m, "Say this is a test")},
		{"completions, prompt array and token ids", tokens.FormatCompletions,
			`{"model":"gpt-4o","prompt":["one two","three"],"suffix":"counted too"}`, n(t, m, "one two") + n(t, m, "three") + n(t, m, "counted too")},
		{"completions, token ids", tokens.FormatCompletions, `{"model":"gpt-4o","prompt":[1,2,3,4]}`, 4},
		{"embeddings, strings", tokens.FormatEmbeddings,
			`{"model":"text-embedding-3-small","input":["The food was delicious","and the waiter"]}`,
			n(t, "text-embedding-3-small", "The food was delicious") + n(t, "text-embedding-3-small", "and the waiter")},
		{"embeddings, token arrays", tokens.FormatEmbeddings, `{"model":"text-embedding-3-small","input":[[1,2,3],[4,5]]}`, 5},
		{"responses, string input and instructions", tokens.FormatResponses,
			`{"model":"gpt-4.1","instructions":"Be brief.","input":"Tell me a joke"}`, n(t, m, "Be brief.") + n(t, m, "Tell me a joke")},
		{"responses, input items", tokens.FormatResponses,
			`{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_text","text":"What is in this image?"},{"type":"input_image","image_url":"https://x/y.png"}]}]}`,
			3 + n(t, m, "user") + n(t, m, "What is in this image?") + 85 + 170*8},
		{"anthropic, claude: heuristic", tokens.FormatMessages,
			`{"model":"claude-sonnet-4","system":"You are terse.","messages":[{"role":"user","content":"Hello, Claude"},{"role":"assistant","content":[{"type":"text","text":"Hi!"}]}]}`,
			other(t, "You are terse.") + other(t, "user") + other(t, "Hello, Claude") + other(t, "assistant") + other(t, "Hi!")},
		{"anthropic, system blocks", tokens.FormatMessages,
			`{"model":"gpt-4o","system":[{"type":"text","text":"Rules."}],"messages":[{"role":"user","content":"go"}]}`,
			n(t, m, "Rules.") + n(t, m, "user") + n(t, m, "go")},
		{"seed /api/chat JSON", tokens.FormatSeedChat,
			`{"message":"Analizza questo contratto","system":"You are a legal assistant"}`,
			n(t, "gpt-4", "Analizza questo contratto") + n(t, "gpt-4", "You are a legal assistant")}, // +50 is multipart's; no model: cl100k_base
		{"unknown API: every member but the parameters", tokens.FormatGeneric,
			`{"foo":{"prompt":"nested is read"},"prompt":"top level is","n":3,"temperature":"0.5"}`, n(t, "gpt-4", "nested is read") + n(t, "gpt-4", "top level is")},
		{"OpenAI shape: unknown top-level members are parameters", tokens.FormatChat,
			`{"model":"gpt-4o","metadata":{"note":"not shown to the model"},"user":"u1","messages":[]}`, 3},
		{"not an object", tokens.FormatChat, `[1,2,3]`, 0},
		{"messages not an array", tokens.FormatChat, `{"messages":null,"prompt":"p"}`, n(t, m, "p")},
		{"anthropic messages not an array", tokens.FormatMessages, `{"messages":{},"system":"s"}`, n(t, m, "s")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := estimate(t, tt.format, "application/json", tt.body, -1); got.Tokens != tt.want {
				t.Fatalf("got %d (%+v), want %d", got.Tokens, got, tt.want)
			}
		})
	}
}

func multipartBody(t testing.TB, fields map[string]string, files ...[3]string) (string, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for k, v := range fields {
		w.WriteField(k, v)
	}
	for _, f := range files { // name, content type, content
		h := map[string][]string{
			"Content-Disposition": {fmt.Sprintf(`form-data; name="file"; filename=%q`, f[0])},
			"Content-Type":        {f[1]},
		}
		p, _ := w.CreatePart(h)
		p.Write([]byte(f[2]))
	}
	w.Close()
	return b.String(), w.FormDataContentType()
}

func TestMultipart(t *testing.T) {
	const m = "gpt-4o"
	var pngBuf bytes.Buffer
	png.Encode(&pngBuf, image.NewGray(image.Rect(0, 0, 512, 512)))
	body, ct := multipartBody(t, map[string]string{"message": "Summarise this", "system": "Be exact", "other": "counted too", "model": "gpt-4o"},
		[3]string{"notes.txt", "text/plain", "The contract ends in May."},
		[3]string{"archive.zip", "application/zip", strings.Repeat("PK binary\x00\x01", 1000)},
		[3]string{"photo.png", "image/png", pngBuf.String()},
	)
	want := n(t, m, "Summarise this") + n(t, m, "Be exact") + n(t, m, "counted too") + n(t, m, "The contract ends in May.") +
		(11000*3+34)/35 + // 11000 bytes of an archive by the size heuristic
		85 + 170 + // a 512×512 image: one tile
		tokens.SeedOverhead
	if got := estimate(t, tokens.FormatSeedChat, ct, body, -1); got.Tokens != want {
		t.Fatalf("got %+v, want %d", got, want)
	}
}

func TestInvalidBodies(t *testing.T) {
	good, ct := multipartBody(t, map[string]string{"message": "hi"})
	tests := []struct {
		name, contentType, body string
	}{
		{"truncated JSON", "application/json", `{"messages":[{"role":"user","content":"hi"`},
		{"trailing garbage", "application/json", `{"model":"x"} {}`},
		{"bad escape", "application/json", `{"prompt":"\q"}`},
		{"control character", "application/json", "{\"prompt\":\"a\x01b\"}"},
		{"bare word", "application/json", `hello`},
		{"empty JSON", "application/json", ``},
		{"multipart without boundary", "multipart/form-data", good},
		{"multipart cut short", ct, good[:len(good)-10]},
		{"multipart wrong boundary", "multipart/form-data; boundary=nope", good},
		{"too deep", "application/json", strings.Repeat("[", 300) + strings.Repeat("]", 300)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: tt.contentType, Body: []byte(tt.body)}, 2000)
			if !errors.Is(err, tokens.ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
			if strings.Contains(err.Error(), "hi") && tt.name != "bare word" {
				t.Fatalf("error echoes the body: %v", err)
			}
		})
	}
}

func TestLenientContentTypes(t *testing.T) {
	const m = "gpt-4o"
	// curl -d sends JSON as a form; text/plain bodies are text.
	if got := estimate(t, tokens.FormatSeedChat, "application/x-www-form-urlencoded", `{"message":"hi"}`, -1); got.Tokens != n(t, m, "hi") {
		t.Fatalf("curl -d JSON: %+v", got)
	}
	if got := estimate(t, tokens.FormatSeedChat, "application/x-www-form-urlencoded", `message=hello+world&system=x&foo=bar&model=gpt-4o`, -1); got.Tokens != n(t, m, "hello world")+n(t, m, "x")+n(t, m, "bar") {
		t.Fatalf("form: %+v", got)
	}
	if got := estimate(t, tokens.FormatGeneric, "text/plain", "just some text", -1); got.Tokens != n(t, m, "just some text") {
		t.Fatalf("text: %+v", got)
	}
	if got := estimate(t, tokens.FormatGeneric, "text/plain", "{not json at all", -1); got.Tokens != n(t, m, "{not json at all") {
		t.Fatalf("JSON-looking text: %+v", got)
	}
}

func TestEncodingByModel(t *testing.T) {
	for model, want := range map[string]string{
		"gpt-4o": tokens.O200KBase, "gpt-4o-mini-2024-07-18": tokens.O200KBase, "gpt-4.1": tokens.O200KBase, "gpt-5": tokens.O200KBase,
		"o1": tokens.O200KBase, "o3-mini": tokens.O200KBase, "o4-mini": tokens.O200KBase, "chatgpt-4o-latest": tokens.O200KBase,
		"": tokens.CL100KBase, "some-unknown-model": tokens.Heuristic, "us.anthropic.claude-sonnet-4-20250514-v1:0": tokens.Heuristic,
		"codellama:13b": tokens.Heuristic, "open-mixtral-8x22b": tokens.Heuristic, "phi3:mini": tokens.Heuristic, "azure/gpt-4o": tokens.O200KBase, "openai/gpt-4o": tokens.O200KBase,
		"gpt-4": tokens.CL100KBase, "gpt-4-turbo": tokens.CL100KBase, "gpt-4-0613": tokens.CL100KBase, "gpt-3.5-turbo": tokens.CL100KBase,
		"text-embedding-3-large": tokens.CL100KBase, "text-embedding-ada-002": tokens.CL100KBase,
		"claude-3-5-sonnet-latest": tokens.Heuristic, "anthropic/claude-opus-4": tokens.Heuristic, "meta-llama/Llama-3.1-8B": tokens.Heuristic,
		"mistral-large": tokens.Heuristic, "gemini-2.5-pro": tokens.Heuristic,
	} {
		if got := tk.EncodingName(model); got != want {
			t.Errorf("%q: %s, want %s", model, got, want)
		}
	}
}

// Counting stops once the cap is passed: an 8 MiB prompt costs what 2000
// tokens cost.
func TestEarlyStop(t *testing.T) {
	big := strings.Repeat("lorem ipsum dolor sit amet ", 8<<20/27)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + big + `"}]}`
	start := time.Now()
	est := estimate(t, tokens.FormatChat, "application/json", body, 2000)
	if !est.Stopped || est.Tokens <= 2000 || est.Tokens > 2000+chunkTokens {
		t.Fatalf("got %+v", est)
	}
	if d := time.Since(start); d > 2*time.Second { // generous for -race; typically a few ms
		t.Fatalf("took %v", d)
	}
	// The count up to the cap is exact: a prompt just under the cap is not stopped.
	exact := estimate(t, tokens.FormatChat, "application/json", `{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}`, 3+n(t, "gpt-4o", "user")+n(t, "gpt-4o", "hello")+3)
	if exact.Stopped {
		t.Fatalf("stopped at the cap exactly: %+v", exact)
	}
}

// chunkTokens bounds how far past the cap a stopped count may go: one
// chunk of text.
const chunkTokens = 4096

// A tools array too large to decode is counted as text, and the fields
// after it are still read.
func TestOversizedToolsAreCountedAsText(t *testing.T) {
	desc := strings.Repeat("word ", 300<<10) // 1.5 MB
	body := `{"model":"gpt-4o","tools":[{"type":"function","function":{"name":"f","description":"` + desc + `"}}],"messages":[{"role":"user","content":"after"}]}`
	est := estimate(t, tokens.FormatChat, "application/json", body, -1)
	if est.Tokens < 200000 || est.Stopped {
		t.Fatalf("got %+v", est)
	}
	small := estimate(t, tokens.FormatChat, "application/json", `{"model":"gpt-4o","tools":[{"type":"function","function":{"name":"f","description":"`+desc+`"}}]}`, -1)
	if est.Tokens-small.Tokens != 3+n(t, "gpt-4o", "user")+n(t, "gpt-4o", "after")+3 {
		t.Fatalf("messages after the tools not counted: %d vs %d", est.Tokens, small.Tokens)
	}
}
