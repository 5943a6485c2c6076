package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// maxToolsJSON bounds the tools (or functions) array decoded to apply the
// tools formula; a larger one is counted as JSON text instead.
const maxToolsJSON = 1 << 20

// toolFormatMembers are the member names of the tool-definition format
// itself, which the published formula prices: in the schema count of a
// tools array they are not counted as text (the names of a function's
// properties, and everything else, are).
var toolFormatMembers = map[string]bool{
	"type": true, "function": true, "name": true, "description": true, "parameters": true, "properties": true,
	"required": true, "enum": true, "strict": true, "input_schema": true, "items": true, "additionalproperties": true,
}

// tools counts a tools (or legacy functions) array: the cookbook's
// num_tokens_for_tools formula, never less than the text of every name
// and string in it (the formula reads only the top-level properties: a
// nested schema, a property's other members or a tool of another type
// would otherwise cost nothing). An array too large to decode is counted
// as JSON text.
func (w *walker) tools(legacy bool) error {
	start := w.j.i
	raw, err := w.j.captureValue(maxToolsJSON)
	if errors.Is(err, errCaptureFull) {
		if err := w.m.valueBytes(raw); err != nil {
			return err
		}
		// What did not fit is priced at four bytes a token, about what
		// JSON text costs, without keeping it.
		return w.m.add((w.j.i - start - len(raw) + 3) / 4)
	}
	if err != nil {
		return err
	}
	// Decoding for the formula costs more than reading: it draws a step
	// per workToolsBytes of the array.
	if err := w.m.work.draw(int64(len(raw)/workToolsBytes), LimitedJSON); err != nil {
		return err
	}
	formula, err := w.sub(func(m *meter) error { return w.toolsFormula(raw, legacy, m) })
	if err != nil {
		return err
	}
	text, err := w.sub(func(m *meter) error {
		sw := &walker{j: newJSONReader(raw), m: m, format: w.format, model: w.model}
		sw.j.work = m.work
		return sw.schema(true)
	})
	if err != nil {
		return err
	}
	return w.m.add(max(formula, text))
}

// sub counts with a meter of its own, limited to what w's meter has left,
// and returns its total (past that budget when it stopped early).
func (w *walker) sub(count func(m *meter) error) (int, error) {
	m := &meter{c: w.m.c, limit: w.m.budget(), work: w.m.work}
	err := count(m)
	if errors.Is(err, errStop) {
		err = nil
	}
	return m.total, err
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
func (w *walker) toolsFormula(raw []byte, legacy bool, m *meter) error {
	var list []tool
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return nil // not an array of tool objects: nothing the formula knows
	}
	if w.format == FormatMessages {
		return anthropicTools(list, m)
	}
	funcInit := 7
	if m.c.Name() == CL100KBase {
		funcInit = 10
	}
	const propInit, propKey, enumInit, enumItem, funcEnd = 3, 3, -3, 3, 12
	for _, t := range list {
		f := t.Function
		if legacy || f == nil {
			f = &t.toolDef
		}
		if err := m.add(funcInit); err != nil {
			return err
		}
		if err := m.value(f.Name + ":" + trimDot(f.Description)); err != nil {
			return err
		}
		if f.Parameters == nil || len(f.Parameters.Properties) == 0 {
			continue
		}
		if err := m.add(propInit); err != nil {
			return err
		}
		for _, p := range f.Parameters.Properties {
			if err := m.add(propKey); err != nil {
				return err
			}
			if p.Enum != nil {
				if err := m.add(enumInit); err != nil {
					return err
				}
				for _, item := range p.Enum {
					if err := m.add(enumItem); err != nil {
						return err
					}
					if err := m.value(scalarText(item)); err != nil {
						return err
					}
				}
			}
			if err := m.value(p.Key + ":" + scalarText(p.Type) + ":" + trimDot(p.Description)); err != nil {
				return err
			}
		}
	}
	return m.add(funcEnd)
}

// anthropicTools counts each tool's name, description and input schema
// text (Anthropic publishes no formula).
func anthropicTools(list []tool, m *meter) error {
	for _, t := range list {
		if err := m.value(t.Name + ":" + t.Description + ":" + string(t.InputSchema)); err != nil {
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
