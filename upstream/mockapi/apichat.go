package mockapi

import (
	"fmt"
	"io"
	"mime"
	"net/http"
)

// maxFormField caps the size of a single non-file multipart field.
const maxFormField = 1 << 20

// fileInfo describes one uploaded file of an /api/chat request.
type fileInfo struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

type apiChatResponse struct {
	Reply string     `json:"reply"`
	Files []fileInfo `json:"files"`
}

type apiChatError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

func writeAPIChatError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiChatError{Error: "invalid_request", Message: msg})
}

// handleAPIChat serves a simple chat endpoint accepting either a JSON body
// {"message","system"}, a URL-encoded form, or a multipart/form-data upload
// with "message", "system" and optional "file" parts. Multipart bodies are
// processed as a stream; file contents are counted, never buffered.
func (s *server) handleAPIChat(w http.ResponseWriter, r *http.Request) {
	var (
		message string
		files   = []fileInfo{}
	)
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mediaType {
	case "multipart/form-data":
		var err error
		message, files, err = readMultipart(r)
		if err != nil {
			writeAPIChatError(w, http.StatusBadRequest, err.Error())
			return
		}
	case "application/x-www-form-urlencoded":
		r.Body = http.MaxBytesReader(w, r.Body, maxJSONBody)
		if err := r.ParseForm(); err != nil {
			writeAPIChatError(w, decodeStatus(err), "invalid form body: "+err.Error())
			return
		}
		message = r.PostForm.Get("message")
	default:
		var req struct {
			Message string `json:"message"`
			System  string `json:"system"`
		}
		if err := decodeJSON(w, r, &req); err != nil {
			writeAPIChatError(w, decodeStatus(err), "invalid JSON body: "+err.Error())
			return
		}
		message = req.Message
	}
	writeJSON(w, http.StatusOK, apiChatResponse{Reply: mockReply(message), Files: files})
}

// readMultipart streams through a multipart/form-data body, returning the
// "message" field and the name and size of every uploaded file.
func readMultipart(r *http.Request) (message string, files []fileInfo, err error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return "", nil, fmt.Errorf("invalid multipart body: %w", err)
	}
	files = []fileInfo{}
	for {
		part, err := mr.NextPart()
		// Only a bare io.EOF marks a clean end; NextPart wraps io.EOF for
		// bodies that end without a closing boundary.
		if err == io.EOF {
			return message, files, nil
		}
		if err != nil {
			return "", nil, fmt.Errorf("invalid multipart body: %w", err)
		}
		name, filename := part.FormName(), part.FileName()
		switch {
		case filename == "" && (name == "message" || name == "system"):
			b, err := io.ReadAll(io.LimitReader(part, maxFormField+1))
			if err != nil {
				part.Close()
				return "", nil, fmt.Errorf("invalid multipart field %q: %w", name, err)
			}
			if len(b) > maxFormField {
				part.Close()
				return "", nil, fmt.Errorf("multipart field %q exceeds %d bytes", name, maxFormField)
			}
			if name == "message" {
				message = string(b)
			}
		case name == "file" || filename != "":
			n, err := io.Copy(io.Discard, part)
			if err != nil {
				part.Close()
				return "", nil, fmt.Errorf("invalid multipart file %q: %w", filename, err)
			}
			files = append(files, fileInfo{Name: filename, Bytes: n})
		default:
			if _, err := io.Copy(io.Discard, part); err != nil {
				part.Close()
				return "", nil, fmt.Errorf("invalid multipart body: %w", err)
			}
		}
		part.Close()
	}
}
