package mockapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// chatRequest is the subset of an OpenAI chat completion request we use.
type chatRequest struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	Stream        bool      `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newUsage(prompt, completion int) usage {
	return usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

type assistantMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int              `json:"index"`
	Message      assistantMessage `json:"message"`
	FinishReason string           `json:"finish_reason"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chunkDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`
}

type chatChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	// Usage is absent unless the request asked for it; then, as OpenAI
	// does, every chunk carries "usage":null and a last chunk with no
	// choices carries the usage.
	Usage json.RawMessage `json:"usage,omitempty"`
}

func (s *server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := decodeJSON(w, r, &req); err != nil {
		writeOpenAIError(w, decodeStatus(err), "invalid request body: "+err.Error())
		return
	}
	if req.Model == "" {
		req.Model = defaultChatModel
	}
	reply := mockReply(lastUserText(req.Messages))
	u := newUsage(promptTokens(req.Messages), estimateTokens(reply))
	id := fmt.Sprintf("chatcmpl-mock-%d", s.nextID())
	created := time.Now().Unix()

	if req.Stream {
		includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		s.streamChat(w, r, id, created, req.Model, reply, u, includeUsage)
		return
	}
	writeJSON(w, http.StatusOK, chatCompletion{
		ID:      id,
		Object:  "chat.completion",
		Created: created,
		Model:   req.Model,
		Choices: []chatChoice{{
			Message:      assistantMessage{Role: "assistant", Content: reply},
			FinishReason: "stop",
		}},
		Usage: u,
	})
}

// streamChat writes the reply as server-sent chat.completion.chunk events.
// It stops early when the client goes away.
func (s *server) streamChat(w http.ResponseWriter, r *http.Request, id string, created int64,
	model, reply string, u usage, includeUsage bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)

	ctx := r.Context()
	rc := http.NewResponseController(w)
	var null json.RawMessage
	if includeUsage {
		null = json.RawMessage("null")
	}
	mk := func(d chunkDelta, finish *string) chatChunk {
		return chatChunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			Choices: []chunkChoice{{Delta: d, FinishReason: finish}}, Usage: null,
		}
	}

	empty, stop := "", "stop"
	events := []chatChunk{mk(chunkDelta{Role: "assistant", Content: &empty}, nil)}
	for _, word := range strings.SplitAfter(reply, " ") {
		if word == "" {
			continue
		}
		events = append(events, mk(chunkDelta{Content: &word}, nil))
	}
	events = append(events, mk(chunkDelta{}, &stop))
	if includeUsage {
		raw, _ := json.Marshal(u)
		events = append(events, chatChunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			Choices: []chunkChoice{}, Usage: raw,
		})
	}

	var timer *time.Timer
	if s.opts.StreamDelay > 0 {
		timer = time.NewTimer(s.opts.StreamDelay)
		defer timer.Stop()
	}
	for i, ev := range events {
		if i > 0 && timer != nil {
			timer.Reset(s.opts.StreamDelay)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return
		}
		if !writeEvent(w, rc, data) {
			return
		}
	}
	writeEvent(w, rc, []byte("[DONE]"))
}

// writeEvent writes one SSE data event and flushes it. It reports whether
// the write succeeded.
func writeEvent(w http.ResponseWriter, rc *http.ResponseController, data []byte) bool {
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := w.Write(buf); err != nil {
		return false
	}
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	return true
}
