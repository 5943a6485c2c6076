package usage_test

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// chatForm is how an OpenAI chat stream is written.
type chatForm struct {
	usage   bool   // the client (or the proxy) asked for include_usage: the final usage chunk
	nulls   bool   // with usage, "usage":null ends every other chunk (OpenAI's form)
	spaced  bool   // `"usage": null`, a space after the colon
	eol     string // line end: "\n" (default), "\r\n" or "\r"
	noSpace bool   // "data:{...}" without the space
}

// chatDeltas are the content deltas of the chat stream.
var chatDeltas = []string{"Hello", "!", " How", " can", " I", " help", " you", " today", "?", ` "quoted" \ text`, " é ☃ 😀"}

const chatHead = `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_eb9dce56a8",`

// chatUsage is the final chunk's usage.
var chatUsage = usage.Usage{Input: 19, CachedInput: 3, Output: 10, Reasoning: 2}

const chatUsageJSON = `{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":2,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`

// chatText is the output text of the chat stream.
func chatText() string { return strings.Join(chatDeltas, "") }

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// chatChunks returns the data payloads of a chat stream of n content
// chunks (the deltas, repeated).
func chatChunks(f chatForm, n int) []string {
	null := ""
	if f.usage && f.nulls {
		null = `,"usage":null`
		if f.spaced {
			null = `,"usage": null`
		}
	}
	choice := func(delta, finish string) string {
		return `"choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}]`
	}
	p := []string{chatHead + choice(`{"role":"assistant","content":"","refusal":null}`, "null") + null + "}"}
	for i := range n {
		d := chatDeltas[i%len(chatDeltas)]
		p = append(p, chatHead+choice(`{"content":`+jsonString(d)+`}`, "null")+null+"}")
	}
	p = append(p, chatHead+choice(`{}`, `"stop"`)+null+"}")
	if f.usage {
		p = append(p, chatHead+`"choices":[],"usage":`+chatUsageJSON+"}")
	}
	return append(p, "[DONE]")
}

// sse writes payloads as data events.
func sse(f chatForm, payloads []string) []byte {
	eol := f.eol
	if eol == "" {
		eol = "\n"
	}
	prefix := "data: "
	if f.noSpace {
		prefix = "data:"
	}
	var b strings.Builder
	for _, p := range payloads {
		b.WriteString(prefix + p + eol + eol)
	}
	return []byte(b.String())
}

// chatStream is the whole chat stream with the deltas once.
func chatStream(f chatForm) []byte { return sse(f, chatChunks(f, len(chatDeltas))) }

// named writes Anthropic- or Responses-style events: "event: X" then data.
func named(events ...[2]string) []byte {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", e[0], e[1])
	}
	return []byte(b.String())
}

// anthropicStream is a message with text and thinking, cumulative output
// in message_delta.
func anthropicStream() []byte {
	return named(
		[2]string{"message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me think."}}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		[2]string{"ping", `{"type": "ping"}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hello"}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" world"}}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":1}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\": "}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":2}`},
		[2]string{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":7}}`},
		[2]string{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":42}}`},
		[2]string{"message_stop", `{"type":"message_stop"}`},
	)
}

const anthropicText = `Let me think.Hello world{"city": "Paris"}`

// responsesStream is a Responses API stream with reasoning, text and a
// function call.
func responsesStream(final string) []byte {
	resp := func(status, usage string) string {
		return `{"id":"resp_1","object":"response","created_at":1741476777,"status":"` + status + `","error":null,"model":"gpt-4.1","output":[],"text":{"format":{"type":"text"}},"usage":` + usage + `,"user":null,"metadata":{}}`
	}
	return named(
		[2]string{"response.created", `{"type":"response.created","sequence_number":0,"response":` + resp("in_progress", "null") + `}`},
		[2]string{"response.in_progress", `{"type":"response.in_progress","sequence_number":1,"response":` + resp("in_progress", "null") + `}`},
		[2]string{"response.reasoning_summary_text.delta", `{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Thinking","sequence_number":2}`},
		[2]string{"response.output_text.delta", `{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"Hi","sequence_number":3}`},
		[2]string{"response.output_text.delta", `{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":" there\n","sequence_number":4}`},
		[2]string{"response.output_text.done", `{"type":"response.output_text.done","item_id":"msg_1","output_index":1,"content_index":0,"text":"Hi there\n","sequence_number":5}`},
		[2]string{"response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":2,"delta":"{\"a\":1}","sequence_number":6}`},
		[2]string{final, `{"type":"` + final + `","sequence_number":7,"response":` + resp("completed", `{"input_tokens":36,"input_tokens_details":{"cached_tokens":4},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":123}`) + `}`},
	)
}

const responsesText = "ThinkingHi there\n{\"a\":1}"
