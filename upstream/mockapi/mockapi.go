// Package mockapi implements a small, deterministic, OpenAI-compatible mock
// chat API. It is used as the demo upstream of the rate-limiting reverse proxy
// and as a test double in integration tests.
//
// Besides the OpenAI routes (/v1/models, /v1/chat/completions,
// /v1/completions, /v1/embeddings, /v1/responses) it serves an
// Anthropic-style /v1/messages endpoint, a simple /api/chat endpoint that
// accepts JSON or streamed multipart uploads, and /healthz.
package mockapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// DefaultStreamDelay is the pause between streamed chunks used by New.
const DefaultStreamDelay = 20 * time.Millisecond

const (
	// maxJSONBody caps the size of JSON request bodies.
	maxJSONBody = 32 << 20
	// maxPromptBytes is how much of the user's text is echoed in replies.
	maxPromptBytes = 200
	// replyPrefix starts every mock reply.
	replyPrefix = "This is a mock reply to: "
	// defaultChatModel is reported when a request names no model.
	defaultChatModel = "gpt-4o-mini"
	// modelsCreated is the fixed creation timestamp of the listed models.
	modelsCreated = 1700000000
)

// Options configures the handler returned by NewWithOptions.
type Options struct {
	// StreamDelay is the pause between consecutive server-sent events of a
	// streamed chat completion. Zero or negative means no pause.
	StreamDelay time.Duration
}

// server holds the per-handler state; there is no package-level state.
type server struct {
	opts Options
	seq  atomic.Uint64
}

// New returns the mock API handler using DefaultStreamDelay between streamed
// chunks. The handler is safe for concurrent use.
func New() http.Handler {
	return NewWithOptions(Options{StreamDelay: DefaultStreamDelay})
}

// NewWithOptions returns the mock API handler configured by o. The handler is
// safe for concurrent use.
func NewWithOptions(o Options) http.Handler {
	s := &server{opts: o}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChatCompletions)
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /api/chat", s.handleAPIChat)
	mux.HandleFunc("/", handleNotFound)
	return mux
}

// nextID returns a process-unique (per handler) sequence number.
func (s *server) nextID() uint64 { return s.seq.Add(1) }

func (s *server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok"))
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type modelList struct {
	Object string  `json:"object"`
	Data   []model `json:"data"`
}

func (s *server) handleModels(w http.ResponseWriter, _ *http.Request) {
	ids := []string{"gpt-4o-mini", "gpt-4o", "gpt-3.5-turbo"}
	list := modelList{Object: "list", Data: make([]model, 0, len(ids))}
	for _, id := range ids {
		list.Data = append(list.Data, model{ID: id, Object: "model", Created: modelsCreated, OwnedBy: "mock"})
	}
	writeJSON(w, http.StatusOK, list)
}

func handleNotFound(w http.ResponseWriter, _ *http.Request) {
	code := "not_found"
	writeJSON(w, http.StatusNotFound, errorEnvelope{Error: apiError{
		Message: "not found",
		Type:    "invalid_request_error",
		Code:    &code,
	}})
}

// apiError is the body of an OpenAI error envelope.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type errorEnvelope struct {
	Error apiError `json:"error"`
}

// writeOpenAIError writes an OpenAI-style invalid_request_error.
func writeOpenAIError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorEnvelope{Error: apiError{Message: msg, Type: "invalid_request_error"}})
}

// writeJSON encodes v and writes it with the given status code.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}`,
			http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// decodeJSON decodes the (size-capped) request body into v.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody)).Decode(v)
}

// decodeStatus maps a decodeJSON error to an HTTP status code.
func decodeStatus(err error) int {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// estimateTokens is a crude token estimate: roughly four bytes per token.
func estimateTokens(s string) int { return (len(s) + 3) / 4 }

// mockReply builds the deterministic reply for the given user text.
func mockReply(userText string) string { return replyPrefix + truncate(userText, maxPromptBytes) }

// truncate shortens s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
