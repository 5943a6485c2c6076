package mockapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strings"
	"time"
)

const (
	defaultEmbeddingModel = "text-embedding-3-small"
	defaultClaudeModel    = "claude-3-5-haiku-latest"
	embeddingDims         = 8
)

type completionChoice struct {
	Text         string `json:"text"`
	Index        int    `json:"index"`
	Logprobs     any    `json:"logprobs"`
	FinishReason string `json:"finish_reason"`
}

type textCompletion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   usage              `json:"usage"`
}

func (s *server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string     `json:"model"`
		Prompt stringList `json:"prompt"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		writeOpenAIError(w, decodeStatus(err), "invalid request body: "+err.Error())
		return
	}
	if req.Model == "" {
		req.Model = "gpt-3.5-turbo-instruct"
	}
	prompt := strings.Join(req.Prompt, "\n")
	reply := mockReply(prompt)
	writeJSON(w, http.StatusOK, textCompletion{
		ID:      fmt.Sprintf("cmpl-mock-%d", s.nextID()),
		Object:  "text_completion",
		Created: time.Now().Unix(),
		Model:   req.Model,
		Choices: []completionChoice{{Text: reply, FinishReason: "stop"}},
		Usage:   newUsage(estimateTokens(prompt), estimateTokens(reply)),
	})
}

type embedding struct {
	Object    string    `json:"object"`
	Index     int       `json:"index"`
	Embedding []float64 `json:"embedding"`
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type embeddingList struct {
	Object string         `json:"object"`
	Data   []embedding    `json:"data"`
	Model  string         `json:"model"`
	Usage  embeddingUsage `json:"usage"`
}

func (s *server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string     `json:"model"`
		Input stringList `json:"input"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		writeOpenAIError(w, decodeStatus(err), "invalid request body: "+err.Error())
		return
	}
	if len(req.Input) == 0 {
		writeOpenAIError(w, http.StatusBadRequest, "'input' is required")
		return
	}
	if req.Model == "" {
		req.Model = defaultEmbeddingModel
	}
	out := embeddingList{Object: "list", Data: make([]embedding, 0, len(req.Input)), Model: req.Model}
	for i, in := range req.Input {
		out.Data = append(out.Data, embedding{Object: "embedding", Index: i, Embedding: embed(in)})
		out.Usage.PromptTokens += estimateTokens(in)
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	writeJSON(w, http.StatusOK, out)
}

// embed returns a deterministic unit-length vector derived from s.
func embed(s string) []float64 {
	v := make([]float64, embeddingDims)
	var norm float64
	for i := range v {
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "%d:%s", i, s)
		// Map the hash to [-1, 1).
		v[i] = float64(h.Sum64()>>11)/float64(1<<53)*2 - 1
		norm += v[i] * v[i]
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range v {
			v[i] /= norm
		}
	}
	return v
}

// responsesInput is the "input" of a Responses API request: a plain string
// or an array of message items.
type responsesInput []message

// UnmarshalJSON implements json.Unmarshaler.
func (in *responsesInput) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var msgs []message
		if err := json.Unmarshal(b, &msgs); err != nil {
			return err
		}
		*in = msgs
		return nil
	}
	var t text
	if err := t.UnmarshalJSON(b); err != nil {
		return err
	}
	*in = responsesInput{{Role: "user", Content: t}}
	return nil
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type outputItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type responsesUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type responseObject struct {
	ID        string         `json:"id"`
	Object    string         `json:"object"`
	CreatedAt int64          `json:"created_at"`
	Status    string         `json:"status"`
	Model     string         `json:"model"`
	Output    []outputItem   `json:"output"`
	Usage     responsesUsage `json:"usage"`
}

func (s *server) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model        string         `json:"model"`
		Input        responsesInput `json:"input"`
		Instructions string         `json:"instructions"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		writeOpenAIError(w, decodeStatus(err), "invalid request body: "+err.Error())
		return
	}
	if req.Model == "" {
		req.Model = defaultChatModel
	}
	reply := mockReply(lastUserText(req.Input))
	in, out := promptTokens(req.Input, req.Instructions), estimateTokens(reply)
	n := s.nextID()
	writeJSON(w, http.StatusOK, responseObject{
		ID:        fmt.Sprintf("resp_mock_%d", n),
		Object:    "response",
		CreatedAt: time.Now().Unix(),
		Status:    "completed",
		Model:     req.Model,
		Output: []outputItem{{
			Type: "message", ID: fmt.Sprintf("msg_mock_%d", n), Status: "completed", Role: "assistant",
			Content: []outputText{{Type: "output_text", Text: reply, Annotations: []any{}}},
		}},
		Usage: responsesUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out},
	})
}
