package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
)

// A greedy upstream: it writes exactly the output cap it was sent (or, when
// the client asked with X-Out, min(cap, X-Out)) and reports that usage, with
// the input the client says the proxy estimated (X-Est), so it never reports
// more input than was estimated.

type greedyHit struct {
	id         string
	body       []byte
	capName    string // the top-level cap member it received ("" none)
	capVal     int64  // its value (-1: none, or not a whole number)
	prompt     int64
	completion int64
	model      string
	stream     bool
}

type greedyUpstream struct {
	mu   sync.Mutex
	hits []greedyHit
	srv  string
}

var capNames = []string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

func newGreedyUpstream(t *testing.T) *greedyUpstream {
	t.Helper()
	g := &greedyUpstream{}
	g.srv = newUpstream(t, g.serve).URL
	return g
}

func (g *greedyUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var top map[string]json.RawMessage
	_ = json.Unmarshal(body, &top)
	h := greedyHit{id: r.Header.Get("X-Req-Id"), body: body, capVal: -1}
	for _, n := range capNames {
		if raw, ok := top[n]; ok {
			h.capName = n
			if v, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
				h.capVal = v
			}
		}
	}
	var model string
	_ = json.Unmarshal(top["model"], &model)
	h.model = model
	var stream bool
	_ = json.Unmarshal(top["stream"], &stream)
	h.stream = stream
	h.prompt, _ = strconv.ParseInt(r.Header.Get("X-Est"), 10, 64)
	out := h.capVal
	if out < 0 {
		out = 1_000_000 // no cap: a greedy model writes on and on
	}
	if want, err := strconv.ParseInt(r.Header.Get("X-Out"), 10, 64); err == nil && want < out {
		out = want
	}
	var n int64 = 1
	_ = json.Unmarshal(top["n"], &n)
	h.completion = out * max(n, 1) // every choice writes the cap
	g.mu.Lock()
	g.hits = append(g.hits, h)
	g.mu.Unlock()

	out = h.completion
	switch r.URL.Path {
	case "/v1/messages":
		g.anthropic(w, model, stream, h.prompt, out)
		return
	case "/v1/responses":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_g","object":"response","status":"incomplete","model":%q,"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"words"}]}],"usage":{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d}}`+"\n", model, h.prompt, out, h.prompt+out)
		return
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, h.prompt, out, h.prompt+out)
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-g","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"words words words"},"finish_reason":"length"}],"usage":%s}`+"\n", model, usage)
		return
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	_ = json.Unmarshal(top["stream_options"], &so)
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	for range 3 {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-g\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"words \"}}]}\n\n", model)
		if fl != nil {
			fl.Flush()
		}
	}
	fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-g\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n", model)
	if so.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-g\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", model, usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// anthropic answers in the Messages API's shape; in a stream the usage
// comes in message_start (input) and message_delta (cumulative output).
func (g *greedyUpstream) anthropic(w http.ResponseWriter, model string, stream bool, in, out int64) {
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_g","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"words"}],"stop_reason":"max_tokens","usage":{"input_tokens":%d,"output_tokens":%d}}`+"\n", model, in, out)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	ev := func(name, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	ev("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_g","type":"message","role":"assistant","model":%q,"content":[],"usage":{"input_tokens":%d,"output_tokens":1}}}`, model, in))
	ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"words words"}}`)
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":%d}}`, out))
	ev("message_stop", `{"type":"message_stop"}`)
}

func (g *greedyUpstream) all() []greedyHit {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]greedyHit(nil), g.hits...)
}

func (g *greedyUpstream) byID() map[string]greedyHit {
	m := map[string]greedyHit{}
	for _, h := range g.all() {
		m[h.id] = h
	}
	return m
}
