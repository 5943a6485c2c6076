package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// OpenAI's published chat overhead ("How to count tokens with tiktoken").
const (
	perMessage  = 3 // every message is wrapped in <|start|>{role/name}\n{content}<|end|>\n
	perName     = 1 // a name replaces the role's token and costs one more
	replyPrimed = 3 // every reply is primed with <|start|>assistant<|message|>
)

// maxToolsJSON bounds the tools (or functions) array decoded to apply the
// tools formula; a larger one is counted as JSON text instead.
const maxToolsJSON = 1 << 20

// jsonModel returns the top-level "model" of a JSON body ("" if none). It
// stops at that field, so when model comes first it reads almost nothing.
func jsonModel(r io.Reader) (string, error) {
	j := newJSONReader(r)
	defer j.free()
	if k, err := j.kind(); err != nil || k != '{' {
		return "", err
	}
	var model string
	errFound := errors.New("found")
	err := j.object(func(key []byte) error {
		if string(key) != "model" {
			return j.skip()
		}
		if k, err := j.kind(); err != nil || k != '"' {
			if err == nil {
				err = j.skip()
			}
			return err
		}
		var err error
		model, err = j.stringValue(256)
		if err == nil {
			err = errFound
		}
		return err
	})
	if errors.Is(err, errFound) {
		return model, nil
	}
	return model, err
}

// walker counts the text fields of one JSON body.
type walker struct {
	j      *jsonReader
	m      *meter
	format Format
	model  string
}

// countJSON counts the text a model reads in a JSON body of format f.
func countJSON(r io.Reader, f Format, model string, m *meter) error {
	w := &walker{j: newJSONReader(r), m: m, format: f, model: model}
	defer w.j.free()
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	if k != '{' {
		if err := w.j.skip(); err != nil {
			return err
		}
		return w.j.end()
	}
	chat := false
	err = w.j.object(func(key []byte) error {
		switch string(key) {
		case "messages":
			if f == FormatMessages {
				return w.anthropicMessages()
			}
			k, err := w.j.kind()
			chat = chat || err == nil && k == '['
			return w.chatMessages()
		case "prompt", "input":
			return w.promptOrInput()
		case "instructions", "message":
			return w.anyText()
		case "system":
			return w.anyText()
		case "tools", "functions":
			return w.tools(string(key) == "functions")
		}
		return w.j.skip()
	})
	if err != nil {
		return err
	}
	if err := w.j.end(); err != nil {
		return err
	}
	if chat {
		return m.add(replyPrimed)
	}
	return nil
}

// is reports whether the next value is of kind k (see jsonReader.kind);
// a value of another kind is skipped, and ok is false.
func (w *walker) is(k byte) (ok bool, err error) {
	got, err := w.j.kind()
	if err != nil {
		return false, err
	}
	if got != k {
		return false, w.j.skip()
	}
	return true, nil
}

// str counts the string value next in the stream.
func (w *walker) str() error {
	if err := w.j.str(w.m.stream()); err != nil {
		return err
	}
	return w.m.endText()
}

// anyText counts a string, or the text of an array of strings or content
// blocks ({"type":"text","text":…}); anything else is skipped.
func (w *walker) anyText() error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		return w.str()
	case '[':
		return w.j.array(func(int) error { return w.contentPart() })
	case '{':
		return w.contentPart()
	}
	return w.j.skip()
}

// chatMessages counts OpenAI chat messages: 3 per message, every string
// field's tokens, 1 more per name (the cookbook's num_tokens_from_messages),
// with content parts and tool calls read for their text.
func (w *walker) chatMessages() error {
	return w.eachObject(perMessage, func(key []byte) error {
		k, err := w.j.kind()
		if err != nil {
			return err
		}
		switch {
		case k == '"':
			if string(key) == "name" {
				if err := w.m.add(perName); err != nil {
					return err
				}
			}
			return w.str()
		case string(key) == "content":
			return w.anyText()
		case string(key) == "tool_calls" && k == '[':
			return w.j.array(func(int) error { return w.toolCall() })
		case string(key) == "function_call" && k == '{':
			return w.toolCall()
		}
		return w.j.skip()
	})
}

// eachObject reads an array of objects (anything else is skipped), adding
// overhead tokens per object and handing each field to field.
func (w *walker) eachObject(overhead int, field func(key []byte) error) error {
	if ok, err := w.is('['); !ok {
		return err
	}
	return w.j.array(func(int) error {
		if ok, err := w.is('{'); !ok {
			return err
		}
		if err := w.m.add(overhead); err != nil {
			return err
		}
		return w.j.object(field)
	})
}

// toolCall counts an assistant tool call's function name and arguments.
func (w *walker) toolCall() error {
	if ok, err := w.is('{'); !ok {
		return err
	}
	return w.j.object(func(key []byte) error {
		switch string(key) {
		case "function":
			return w.toolCall()
		case "name", "arguments":
			if ok, err := w.is('"'); !ok {
				return err
			}
			return w.str()
		}
		return w.j.skip()
	})
}

// contentPart counts one content part or block: text parts, images by
// their size, tool results and tool uses; other kinds are skipped.
func (w *walker) contentPart() error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	if k == '"' {
		return w.str()
	}
	if k != '{' {
		return w.j.skip()
	}
	var img imageRef
	err = w.j.object(func(key []byte) error {
		switch string(key) {
		case "text", "content", "output", "thinking":
			return w.anyText()
		case "name":
			return w.anyText()
		case "input": // tool_use input: counted as its JSON text
			return w.rawAsText()
		case "image_url":
			return w.imageURL(&img)
		case "source":
			return w.imageSource(&img)
		case "detail":
			s, err := w.stringOrSkip()
			img.detail = s
			return err
		}
		return w.j.skip()
	})
	if err != nil || !img.present {
		return err
	}
	if w.format == FormatMessages {
		return w.m.add(img.anthropicTokens())
	}
	return w.m.add(img.openAITokens(w.model))
}

func (w *walker) stringOrSkip() (string, error) {
	k, err := w.j.kind()
	if err != nil {
		return "", err
	}
	if k != '"' {
		return "", w.j.skip()
	}
	return w.j.stringValue(64)
}

// rawAsText counts a value's JSON text (a tool input).
func (w *walker) rawAsText() error {
	raw, err := w.j.captureValue(maxToolsJSON)
	if err != nil && !errors.Is(err, errCaptureFull) {
		return err
	}
	// Past maxToolsJSON only the value's start was kept: the rest can only
	// add to a count already past any sane cap.
	return w.m.valueBytes(raw)
}

// promptOrInput counts prompt/input: a string, token ids (one token each),
// or an array of those, or Responses API input items.
func (w *walker) promptOrInput() error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		return w.str()
	case 'n':
		if err := w.j.skip(); err != nil {
			return err
		}
		return w.m.add(1)
	case '[':
		return w.j.array(func(int) error {
			k, err := w.j.kind()
			if err != nil {
				return err
			}
			if k == '{' { // Responses API input item: a message or a tool output
				if err := w.m.add(perMessage); err != nil {
					return err
				}
				return w.responseItem()
			}
			return w.promptOrInput()
		})
	}
	return w.j.skip()
}

// responseItem counts a Responses API input item's text fields.
func (w *walker) responseItem() error {
	return w.j.object(func(key []byte) error {
		switch string(key) {
		case "role", "name", "arguments", "output", "content":
			return w.anyText()
		}
		return w.j.skip()
	})
}

// anthropicMessages counts Anthropic messages: roles are not text the
// model reads as content and Anthropic publishes no per-message overhead,
// so only content is counted.
func (w *walker) anthropicMessages() error {
	return w.eachObject(0, func(key []byte) error {
		if string(key) == "content" {
			return w.anyText()
		}
		return w.j.skip()
	})
}

// tool is the part of an OpenAI or Anthropic tool definition the formula
// reads.
type tool struct {
	Type     string   `json:"type"`
	Function *toolDef `json:"function"`
	toolDef
	InputSchema json.RawMessage `json:"input_schema"`
}

type toolDef struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Parameters  *schema `json:"parameters"`
}

type schema struct {
	Properties orderedProps `json:"properties"`
}

type prop struct {
	Key         string
	Type        any    `json:"type"`
	Description string `json:"description"`
	Enum        []any  `json:"enum"`
}

// orderedProps keeps a schema's properties in document order, as Python's
// dict does in the cookbook's formula.
type orderedProps []prop

func (o *orderedProps) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := t.(string)
		var p prop
		if err := dec.Decode(&p); err != nil {
			return err
		}
		p.Key = key
		*o = append(*o, p)
	}
	return nil
}

// tools counts a tools (or legacy functions) array with the cookbook's
// num_tokens_for_tools formula.
func (w *walker) tools(legacy bool) error {
	raw, err := w.j.captureValue(maxToolsJSON)
	if errors.Is(err, errCaptureFull) {
		return w.m.valueBytes(raw) // too large to decode: counted as text
	}
	if err != nil {
		return err
	}
	var list []tool
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return nil // not an array of tool objects: nothing the formula knows
	}
	if w.format == FormatMessages {
		return w.anthropicTools(list)
	}
	funcInit := 7
	if w.m.c.Name() == CL100KBase {
		funcInit = 10
	}
	const propInit, propKey, enumInit, enumItem, funcEnd = 3, 3, -3, 3, 12
	for _, t := range list {
		f := t.Function
		if legacy || f == nil {
			f = &t.toolDef
		}
		if err := w.m.add(funcInit); err != nil {
			return err
		}
		if err := w.m.value(f.Name + ":" + trimDot(f.Description)); err != nil {
			return err
		}
		if f.Parameters == nil || len(f.Parameters.Properties) == 0 {
			continue
		}
		if err := w.m.add(propInit); err != nil {
			return err
		}
		for _, p := range f.Parameters.Properties {
			if err := w.m.add(propKey); err != nil {
				return err
			}
			if p.Enum != nil {
				if err := w.m.add(enumInit); err != nil {
					return err
				}
				for _, item := range p.Enum {
					if err := w.m.add(enumItem); err != nil {
						return err
					}
					if err := w.m.value(scalarText(item)); err != nil {
						return err
					}
				}
			}
			if err := w.m.value(p.Key + ":" + scalarText(p.Type) + ":" + trimDot(p.Description)); err != nil {
				return err
			}
		}
	}
	return w.m.add(funcEnd)
}

// anthropicTools counts each tool's name, description and input schema
// text (Anthropic publishes no formula).
func (w *walker) anthropicTools(list []tool) error {
	for _, t := range list {
		if err := w.m.value(t.Name + ":" + t.Description + ":" + string(t.InputSchema)); err != nil {
			return err
		}
	}
	return nil
}

func trimDot(s string) string {
	if len(s) > 0 && s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}

func scalarText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case nil:
		return ""
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}
