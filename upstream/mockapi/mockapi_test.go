package mockapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/mockapi"
)

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, contentType, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode(t *testing.T, r io.Reader, v any) {
	t.Helper()
	if err := json.NewDecoder(r).Decode(v); err != nil {
		t.Fatalf("decode: %v", err)
	}
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func TestChatCompletionNonStream(t *testing.T) {
	srv := newServer(t, mockapi.New())
	body := `{"model":"gpt-4o","messages":[{"role":"system","content":"be nice"},` +
		`{"role":"user","content":[{"type":"text","text":"hello there"}]}]}`
	resp := post(t, srv.URL+"/v1/chat/completions", "application/json", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d", resp.StatusCode)
	}
	var got struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	decode(t, resp.Body, &got)
	if !strings.HasPrefix(got.ID, "chatcmpl-mock-") || got.Object != "chat.completion" || got.Model != "gpt-4o" || got.Created == 0 {
		t.Errorf("unexpected header fields: %+v", got)
	}
	if len(got.Choices) != 1 {
		t.Fatalf("choices = %d, want 1", len(got.Choices))
	}
	c := got.Choices[0]
	if want := "This is a mock reply to: hello there"; c.Message.Content != want || c.Message.Role != "assistant" || c.FinishReason != "stop" {
		t.Errorf("choice = %+v, want content %q", c, want)
	}
	u := got.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage = %+v", u)
	}
}

// readEvents returns the payloads of all "data:" events in an SSE stream.
func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, data)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	return events
}

func TestChatCompletionStream(t *testing.T) {
	srv := newServer(t, mockapi.NewWithOptions(mockapi.Options{StreamDelay: time.Millisecond}))
	for _, includeUsage := range []bool{false, true} {
		body := `{"messages":[{"role":"user","content":"tell me a story"}],"stream":true,` +
			`"stream_options":{"include_usage":` + map[bool]string{true: "true", false: "false"}[includeUsage] + `}}`
		resp := post(t, srv.URL+"/v1/chat/completions", "application/json", body)
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("Content-Type = %q", ct)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("Cache-Control = %q", cc)
		}
		events := readEvents(t, resp.Body)
		if len(events) < 4 {
			t.Fatalf("got %d events, want several: %q", len(events), events)
		}
		if last := events[len(events)-1]; last != "[DONE]" {
			t.Fatalf("last event = %q, want [DONE]", last)
		}
		var text strings.Builder
		usageChunks, stops := 0, 0
		for _, ev := range events[:len(events)-1] {
			var ch struct {
				Object  string `json:"object"`
				Model   string `json:"model"`
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
				Usage *usage `json:"usage"`
			}
			decode(t, strings.NewReader(ev), &ch)
			if ch.Object != "chat.completion.chunk" || ch.Model != "gpt-4o-mini" {
				t.Errorf("chunk = %s", ev)
			}
			if ch.Usage != nil {
				usageChunks++
				if len(ch.Choices) != 0 || ch.Usage.TotalTokens == 0 {
					t.Errorf("bad usage chunk: %s", ev)
				}
			}
			for _, c := range ch.Choices {
				text.WriteString(c.Delta.Content)
				if c.FinishReason != nil && *c.FinishReason == "stop" {
					stops++
				}
			}
		}
		if want := "This is a mock reply to: tell me a story"; text.String() != want {
			t.Errorf("streamed text = %q, want %q", text.String(), want)
		}
		if stops != 1 {
			t.Errorf("finish_reason stop chunks = %d, want 1", stops)
		}
		if want := map[bool]int{true: 1, false: 0}[includeUsage]; usageChunks != want {
			t.Errorf("include_usage=%v: usage chunks = %d, want %d", includeUsage, usageChunks, want)
		}
	}
}

func TestStreamStopsOnClientCancel(t *testing.T) {
	done := make(chan struct{})
	h := mockapi.NewWithOptions(mockapi.Options{StreamDelay: time.Hour})
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		h.ServeHTTP(w, r)
	}))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"messages":[{"role":"user","content":"hi"}],"stream":true}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The first event is sent immediately; the next one only after an hour.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line = %q, %v", line, err)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("handler did not return after the client cancelled")
	}
}

func TestAPIChatMultipart(t *testing.T) {
	srv := newServer(t, mockapi.New())
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("system", "you are a bot")
	_ = mw.WriteField("message", "summarise this")
	fw, err := mw.CreateFormFile("file", "data.bin")
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("x"), 123456)
	if _, err := fw.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	resp := post(t, srv.URL+"/api/chat", mw.FormDataContentType(), buf.String())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d", resp.StatusCode)
	}
	var got struct {
		Reply string `json:"reply"`
		Files []struct {
			Name  string `json:"name"`
			Bytes int64  `json:"bytes"`
		} `json:"files"`
	}
	decode(t, resp.Body, &got)
	if got.Reply != "This is a mock reply to: summarise this" {
		t.Errorf("reply = %q", got.Reply)
	}
	if len(got.Files) != 1 || got.Files[0].Name != "data.bin" || got.Files[0].Bytes != int64(len(payload)) {
		t.Errorf("files = %+v, want data.bin with %d bytes", got.Files, len(payload))
	}
}

func TestAPIChatErrors(t *testing.T) {
	srv := newServer(t, mockapi.New())
	for name, tc := range map[string]struct{ contentType, body string }{
		"bad json":      {"application/json", `{"message":`},
		"bad multipart": {"multipart/form-data; boundary=xyz", "garbage without boundary"},
	} {
		resp := post(t, srv.URL+"/api/chat", tc.contentType, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status = %d, want 400", name, resp.StatusCode)
			continue
		}
		var e struct{ Error, Message string }
		decode(t, resp.Body, &e)
		if e.Error != "invalid_request" || e.Message == "" {
			t.Errorf("%s: error body = %+v", name, e)
		}
	}
}

func TestBadJSON(t *testing.T) {
	srv := newServer(t, mockapi.New())
	resp := post(t, srv.URL+"/v1/chat/completions", "application/json", `{"messages": [`)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status = %d, want 400", resp.StatusCode)
	}
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	decode(t, resp.Body, &e)
	if e.Error.Type != "invalid_request_error" || e.Error.Message == "" || e.Error.Param != nil || e.Error.Code != nil {
		t.Errorf("error = %+v", e.Error)
	}
}

func TestNotFound(t *testing.T) {
	srv := newServer(t, mockapi.New())
	for _, path := range []string{"/nope", "/v1/unknown"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		decode(t, resp.Body, &e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || e.Error.Code != "not_found" || e.Error.Message != "not found" {
			t.Errorf("%s: status = %d, body = %+v", path, resp.StatusCode, e)
		}
	}
}
