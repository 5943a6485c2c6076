package mockapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// text is message content that may be encoded either as a JSON string or as
// an array of content parts such as {"type":"text","text":"..."}. Parts
// without text (images, audio, ...) are ignored.
type text string

// UnmarshalJSON implements json.Unmarshaler.
func (t *text) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || bytes.Equal(b, []byte("null")):
		*t = ""
		return nil
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*t = text(s)
		return nil
	case b[0] == '[':
		var parts []struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		texts := make([]string, 0, len(parts))
		for _, p := range parts {
			if p.Text != "" {
				texts = append(texts, p.Text)
			}
		}
		*t = text(strings.Join(texts, "\n"))
		return nil
	default:
		return errors.New("content must be a string or an array of content parts")
	}
}

// message is a chat message as used by the chat completions, responses and
// Anthropic messages APIs.
type message struct {
	Role    string `json:"role"`
	Content text   `json:"content"`
}

// lastUserText returns the text of the last message with role "user", or ""
// if there is none.
func lastUserText(msgs []message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			return string(msgs[i].Content)
		}
	}
	return ""
}

// promptTokens estimates the tokens of all messages plus any extra texts.
func promptTokens(msgs []message, extra ...string) int {
	n := 0
	for _, m := range msgs {
		n += estimateTokens(string(m.Content))
	}
	for _, e := range extra {
		n += estimateTokens(e)
	}
	return n
}

// stringList is a JSON string or array used for completion prompts and
// embedding inputs. An array of strings yields one entry per string; an
// array of token IDs yields a single entry with its raw JSON text; nested
// token arrays yield one entry per inner array.
type stringList []string

// UnmarshalJSON implements json.Unmarshaler.
func (l *stringList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || bytes.Equal(b, []byte("null")):
		*l = nil
		return nil
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*l = stringList{s}
		return nil
	case b[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(b, &items); err != nil {
			return err
		}
		if len(items) > 0 && !bytes.HasPrefix(bytes.TrimSpace(items[0]), []byte{'"'}) &&
			!bytes.HasPrefix(bytes.TrimSpace(items[0]), []byte{'['}) {
			// A flat array of token IDs is a single input.
			*l = stringList{string(b)}
			return nil
		}
		out := make(stringList, 0, len(items))
		for _, it := range items {
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				s = string(bytes.TrimSpace(it))
			}
			out = append(out, s)
		}
		*l = out
		return nil
	default:
		return errors.New("expected a string or an array")
	}
}
