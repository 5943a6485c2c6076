package usage_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// A JSON body: the usage is read when it closes, the body passes as it is.
func TestJSONUsage(t *testing.T) {
	cases := []struct {
		name string
		api  usage.API
		body string
		want usage.Usage
	}{
		{"chat", usage.OpenAIChat, `{
  "id": "chatcmpl-123", "object": "chat.completion", "created": 1741569952, "model": "o3-mini",
  "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, \"usage\": 3", "refusal": null}, "finish_reason": "stop"}],
  "usage": {"prompt_tokens": 1117, "completion_tokens": 46, "total_tokens": 1163,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 20, "audio_tokens": 0}},
  "service_tier": "default"
}`, usage.Usage{Input: 1117, CachedInput: 1024, Output: 46, Reasoning: 20}},
		{"chat-details-null", usage.OpenAIChat, `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":null}}`,
			usage.Usage{Input: 10, Output: 2}},
		{"completions", usage.OpenAICompletions, `{"id":"cmpl-1","object":"text_completion","choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
			usage.Usage{Input: 5, Output: 7}},
		{"embeddings", usage.OpenAIEmbeddings, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023064255,-0.009327292]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			usage.Usage{Input: 8}},
		{"responses", usage.OpenAIResponses, `{"id":"resp_1","object":"response","status":"completed","error":null,"output":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Plan"}]},{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":4},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":123},"user":null}`,
			usage.Usage{Input: 36, CachedInput: 4, Output: 87, Reasoning: 64}},
		{"anthropic", usage.Anthropic, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":4000,"output_tokens":9,"service_tier":"standard"}}`,
			usage.Usage{Input: 4312, CachedInput: 4000, CacheWrite: 300, Output: 9}},
		{"generic-openai", usage.Generic, `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
			usage.Usage{Input: 3, Output: 1}},
		{"generic-anthropic", usage.Generic, `{"content":[{"type":"text","text":"x"}],"usage":{"input_tokens":3,"cache_read_input_tokens":10,"output_tokens":1}}`,
			usage.Usage{Input: 13, CachedInput: 10, Output: 1}},
		{"ollama-chat", usage.Generic, `{"model":"llama3.2","created_at":"2023-12-12T14:13:43Z","message":{"role":"assistant","content":"Hello! How are you today?"},"done":true,"total_duration":5191566416,"load_duration":2154458,"prompt_eval_count":26,"prompt_eval_duration":383809000,"eval_count":298,"eval_duration":4799921000}`,
			usage.Usage{Input: 26, Output: 298}},
		{"ollama-ndjson", usage.Generic, `{"model":"llama3.2","message":{"role":"assistant","content":"The"},"done":false}
{"model":"llama3.2","message":{"role":"assistant","content":" sky"},"done":false}
{"model":"llama3.2","message":{"role":"assistant","content":""},"done":true,"prompt_eval_count":26,"eval_count":2}
`, usage.Usage{Input: 26, Output: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, res := check(t, []byte(c.body), usage.Options{API: c.api, Count: countBytes})
			if string(got) != c.body {
				t.Fatal("body changed")
			}
			if !res.Reported || res.Usage != c.want || !res.Complete || res.Output != 0 {
				t.Fatalf("result %+v, want usage %+v reported", res, c.want)
			}
		})
	}
}

// A body longer than MaxBody keeps its head and finds its usage in its
// tail: an embeddings response ends with its usage.
func TestJSONUsageInTail(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	for i := range 2000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"object":"embedding","index":%d,"embedding":[0.0023064255,-0.009327292,0.015797347,-0.0077780345]}`, i)
	}
	b.WriteString(`],"model":"text-embedding-3-small","usage":{"prompt_tokens":4000,"total_tokens":4000}}`)
	body := []byte(b.String())
	for _, maxBody := range []int{0, 1 << 10, 100 << 10} {
		o := usage.Options{API: usage.OpenAIEmbeddings, MaxBody: maxBody, Count: countBytes}
		_, res := check(t, body, o)
		if !res.Reported || res.Usage != (usage.Usage{Input: 4000}) {
			t.Fatalf("MaxBody %d: result %+v", maxBody, res)
		}
	}
	// A long chat answer cut at MaxBody still reports; without usage its
	// head's text is counted.
	long := `{"choices":[{"message":{"content":"` + strings.Repeat("word ", 50000) + `"}}]`
	_, res := check(t, []byte(long+`,"usage":{"prompt_tokens":1,"completion_tokens":50000}}`), usage.Options{MaxBody: 1 << 10, Count: countBytes})
	if !res.Reported || res.Usage.Output != 50000 {
		t.Fatalf("long chat: %+v", res)
	}
	_, res = check(t, []byte(long+"}"), usage.Options{MaxBody: 1 << 10, Count: countBytes})
	if res.Reported || res.Output != int64(1<<10-len(`{"choices":[{"message":{"content":"`)) {
		t.Fatalf("long chat without usage: %+v", res)
	}
}

// Streams of every shape: the usage is found, the bytes pass unchanged.
func TestStreamUsage(t *testing.T) {
	cases := []struct {
		name string
		api  usage.API
		body []byte
		want usage.Usage
	}{
		{"responses-completed", usage.OpenAIResponses, responsesStream("response.completed"), usage.Usage{Input: 36, CachedInput: 4, Output: 87, Reasoning: 64}},
		{"responses-incomplete", usage.OpenAIResponses, responsesStream("response.incomplete"), usage.Usage{Input: 36, CachedInput: 4, Output: 87, Reasoning: 64}},
		{"responses-unnamed", usage.OpenAIResponses, bytes.ReplaceAll(responsesStream("response.completed"), []byte("event: "), []byte(": ")), usage.Usage{Input: 36, CachedInput: 4, Output: 87, Reasoning: 64}},
		{"responses-generic", usage.Generic, responsesStream("response.completed"), usage.Usage{Input: 36, CachedInput: 4, Output: 87, Reasoning: 64}},
		{"anthropic", usage.Anthropic, anthropicStream(), usage.Usage{Input: 2125, CachedInput: 2000, CacheWrite: 100, Output: 42}},
		{"anthropic-generic", usage.Generic, anthropicStream(), usage.Usage{Input: 2125, CachedInput: 2000, CacheWrite: 100, Output: 42}},
		{"completions", usage.OpenAICompletions, sse(chatForm{}, []string{
			`{"id":"cmpl-1","object":"text_completion","choices":[{"text":"Hi","index":0,"finish_reason":null}],"usage":null}`,
			`{"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`,
			"[DONE]"}), usage.Usage{Input: 4, Output: 1}},
		{"generic-chat", usage.Generic, chatStream(chatForm{usage: true, nulls: true}), chatUsage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, strip := range []bool{false, true} {
				got, res := check(t, c.body, usage.Options{API: c.api, Stream: true, Strip: strip, Count: countBytes})
				if !bytes.Equal(got, c.body) && (!strip || c.api != usage.OpenAICompletions) {
					t.Fatalf("strip=%v: stream changed", strip)
				}
				if !res.Reported || res.Usage != c.want || !res.Complete {
					t.Fatalf("strip=%v: result %+v, want %+v", strip, res, c.want)
				}
			}
		})
	}
}

// message_start alone is no complete usage: its input figures are kept,
// and the text is counted.
func TestAnthropicWithoutDelta(t *testing.T) {
	body := anthropicStream()
	cut := body[:bytes.Index(body, []byte("event: message_delta"))]
	_, res := check(t, cut, usage.Options{API: usage.Anthropic, Stream: true, Count: countBytes})
	if res.Reported || res.Usage.Input != 2125 || res.Output != int64(len(anthropicText)) {
		t.Fatalf("result %+v", res)
	}
}

// With no complete usage, the output text that passed is counted: per
// API, what is text and what is not.
func TestFallbackText(t *testing.T) {
	chat := chatStream(chatForm{})
	cases := []struct {
		name string
		o    usage.Options
		body []byte
		want string
	}{
		{"chat-stream", usage.Options{Stream: true}, chat, chatText()},
		{"chat-stream-strip", usage.Options{Stream: true, Strip: true}, chat, chatText()},
		{"chat-stream-parts", usage.Options{Stream: true}, sse(chatForm{}, []string{
			`{"choices":[{"delta":{"role":"assistant","reasoning_content":"why "}}]}`,
			`{"choices":[{"delta":{"content":[{"type":"text","text":"a"}],"refusal":"b"}}]}`,
			`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}`,
			`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"x\":"}}]}}]}`,
			`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}`,
			`{"choices":[{"delta":{"reasoning":"r"}}]}`,
			`{"error":{"message":"boom"},"choices":[{"delta":{"content":"not counted"}}]}`,
		}), `why ab{"x":1}r`},
		{"completions-stream", usage.Options{API: usage.OpenAICompletions, Stream: true}, sse(chatForm{}, []string{
			`{"choices":[{"text":"one","index":0}]}`, `{"choices":[{"text":" two","index":0}]}`, "[DONE]"}), "one two"},
		{"responses-stream", usage.Options{API: usage.OpenAIResponses, Stream: true}, responsesStream("response.failed_without_usage"), responsesText},
		{"anthropic-stream", usage.Options{API: usage.Anthropic, Stream: true}, bytes.ReplaceAll(anthropicStream(), []byte(`"usage"`), []byte(`"u"`)), anthropicText},
		{"chat-json", usage.Options{}, []byte(`{"choices":[{"message":{"content":"Hi \u00e9\ud83d\ude00","refusal":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}},{"text":"t"}]}`), "Hi é😀{\"a\":1}t"},
		{"chat-json-parts", usage.Options{}, []byte(`{"choices":[{"message":{"content":[{"type":"text","text":"p1"},{"type":"text","text":"p2"}]}}]}`), "p1p2"},
		{"responses-json", usage.Options{API: usage.OpenAIResponses}, []byte(`{"output":[{"type":"reasoning","summary":[{"type":"summary_text","text":"S"}]},{"type":"message","content":[{"type":"output_text","text":"T"},{"type":"refusal","refusal":"R"}]},{"type":"function_call","name":"f","arguments":"{}"}],"usage":null}`), "STR{}"},
		{"anthropic-json", usage.Options{API: usage.Anthropic}, []byte(`{"type":"message","content":[{"type":"thinking","thinking":"th"},{"type":"text","text":"tx"},{"type":"tool_use","id":"t","name":"n","input":{"city":"Paris"}}]}`), `thtx{"city":"Paris"}`},
		{"ollama-ndjson", usage.Options{API: usage.Generic}, []byte("{\"message\":{\"content\":\"The\"}}\n{\"message\":{\"content\":\" sky\"}}\n{\"response\":\" is\"}\n"), "The sky is"},
		{"error-json", usage.Options{}, []byte(`{"error":{"message":"The model does not exist","type":"invalid_request_error","code":"model_not_found"}}`), ""},
		{"anthropic-error", usage.Options{API: usage.Anthropic}, []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), ""},
		{"plain-text", usage.Options{}, []byte("  Internal Server Error: upstream said no\n"), "Internal Server Error: upstream said no\n"},
		{"embeddings", usage.Options{API: usage.OpenAIEmbeddings}, []byte(`{"data":[{"embedding":[0.1]}]}`), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.Count = countBytes
			got, res := check(t, c.body, c.o)
			if !bytes.Equal(got, c.body) {
				t.Fatal("body changed")
			}
			if res.Reported || res.Output != int64(len(c.want)) || !res.Complete {
				t.Fatalf("result %+v, want Output %d (%q)", res, len(c.want), c.want)
			}
			// The text itself, with a Count that records it.
			var text []byte
			c.o.Count = func(b []byte) int { text = append(text, b...); return len(b) }
			run(t, bytes.NewReader(c.body), c.o)
			if string(text) != c.want {
				t.Fatalf("text %q, want %q", text, c.want)
			}
		})
	}
}

// The client gone mid-stream: the output that passed is counted, even if
// the usage already came.
func TestClientGone(t *testing.T) {
	body := chatStream(chatForm{usage: true, nulls: true})
	events := bytes.SplitAfter(body, []byte("\n\n"))
	for _, strip := range []bool{false, true} {
		for n := range len(chatDeltas) + 4 { // up to the usage chunk ([DONE] with Strip)
			o := usage.Options{API: usage.OpenAIChat, Stream: true, Strip: strip, Count: countBytes}
			_, res := runUpTo(t, &pieces{p: slices.Clone(events)}, o, n)
			var want int
			for i := 1; i < min(n, len(chatDeltas)+1); i++ {
				want += len(chatDeltas[i-1])
			}
			if res.Complete || res.Output != int64(want) {
				t.Fatalf("strip=%v after %d reads: result %+v, want Output %d", strip, n, res, want)
			}
			if res.Reported != (n >= len(chatDeltas)+3) { // role, deltas, finish, then the usage chunk
				t.Fatalf("strip=%v after %d reads: Reported %v", strip, n, res.Reported)
			}
		}
	}
}

// The client gone mid-stream while the stream is pushed: the push ends
// with the client's error, the stream is not complete, and what was
// scanned is counted as the same reads count it.
func TestPushClientGone(t *testing.T) {
	body := chatStream(chatForm{usage: true, nulls: true})
	events := bytes.SplitAfter(body, []byte("\n\n"))
	for _, strip := range []bool{false, true} {
		o := usage.Options{API: usage.OpenAIChat, Stream: true, Strip: strip, Count: countBytes}
		var res usage.Result
		rc := usage.NewReader(&pushBody{src: &pieces{p: slices.Clone(events)}}, o, func(r usage.Result) { res = r })
		w := &failAfter{n: 3}
		pushed, err := rc.(interface {
			Push(io.Writer, func() error, []byte) (bool, error)
		}).Push(w, func() error { return nil }, make([]byte, 32<<10))
		if !pushed || err != errGone {
			t.Fatalf("strip=%v: pushed %v, error %v; want the client's", strip, pushed, err)
		}
		rc.Close()
		if res.Complete || res.Reported {
			t.Fatalf("strip=%v: result %+v after the client left", strip, res)
		}
		// Four events were read and scanned, as when a copy reads four
		// and fails to write the fourth.
		_, want := runUpTo(t, &pieces{p: slices.Clone(events)}, o, 4)
		if res.Output != want.Output {
			t.Fatalf("strip=%v: Output %d, four reads give %d", strip, res.Output, want.Output)
		}
	}
}

var errGone = errors.New("client gone")

// failAfter takes n writes, then fails.
type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errGone
	}
	f.n--
	return len(p), nil
}

// Text past MaxText is counted in batches of MaxText, whatever the reads.
func TestMaxTextBatches(t *testing.T) {
	body := sse(chatForm{}, chatChunks(chatForm{}, 500))
	var want int
	for i := range 500 {
		want += len(chatDeltas[i%len(chatDeltas)])
	}
	for _, s := range splitters() {
		var batches []int
		o := usage.Options{Stream: true, MaxText: 1000, Count: func(b []byte) int {
			if len(b) > 1000 {
				t.Fatalf("batch of %d bytes past MaxText", len(b))
			}
			batches = append(batches, len(b))
			return len(b)
		}}
		_, res := run(t, s.wrap(body), o)
		if res.Output != int64(want) || len(batches) < want/1000 {
			t.Fatalf("%s: Output %d in %d batches, want %d", s.name, res.Output, len(batches), want)
		}
	}
}

// bufferedBody says how many of its bytes are at hand, as *h1.Body does.
type bufferedBody struct {
	*strings.Reader
}

func (b bufferedBody) Close() error  { return nil }
func (b bufferedBody) Buffered() int { return b.Len() }

// The reader passes its body's Buffered through (the forwarding flushes a
// stream when it is 0), and says 0 when the body cannot tell.
func TestReaderBuffered(t *testing.T) {
	type buffered interface{ Buffered() int }
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	r := usage.NewReader(bufferedBody{strings.NewReader(stream)}, usage.Options{API: usage.OpenAIChat, Stream: true}, nil)
	b, ok := r.(buffered)
	if !ok {
		t.Fatal("reader has no Buffered")
	}
	if n := b.Buffered(); n != len(stream) {
		t.Fatalf("before reading: %d, want %d", n, len(stream))
	}
	p := make([]byte, 10)
	n, _ := r.Read(p)
	if got := b.Buffered(); got != len(stream)-n {
		t.Fatalf("after %d bytes: %d", n, got)
	}
	io.ReadAll(r)
	if got := b.Buffered(); got != 0 {
		t.Fatalf("at the end: %d", got)
	}
	r = usage.NewReader(io.NopCloser(strings.NewReader(stream)), usage.Options{API: usage.OpenAIChat, Stream: true}, nil)
	if got := r.(buffered).Buffered(); got != 0 {
		t.Fatalf("body that cannot tell: %d", got)
	}
}
