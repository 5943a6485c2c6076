package mockapi

import (
	"fmt"
	"net/http"
)

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type anthropicMessage struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   string          `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// handleMessages serves an Anthropic Messages API compatible endpoint.
// Errors use Anthropic's error envelope rather than OpenAI's.
func (s *server) handleMessages(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string    `json:"model"`
		System   text      `json:"system"`
		Messages []message `json:"messages"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		var e anthropicError
		e.Type = "error"
		e.Error.Type = "invalid_request_error"
		e.Error.Message = "invalid request body: " + err.Error()
		writeJSON(w, decodeStatus(err), e)
		return
	}
	if req.Model == "" {
		req.Model = defaultClaudeModel
	}
	reply := mockReply(lastUserText(req.Messages))
	writeJSON(w, http.StatusOK, anthropicMessage{
		ID:         fmt.Sprintf("msg_mock_%d", s.nextID()),
		Type:       "message",
		Role:       "assistant",
		Model:      req.Model,
		Content:    []anthropicText{{Type: "text", Text: reply}},
		StopReason: "end_turn",
		Usage: anthropicUsage{
			InputTokens:  promptTokens(req.Messages, string(req.System)),
			OutputTokens: estimateTokens(reply),
		},
	})
}
