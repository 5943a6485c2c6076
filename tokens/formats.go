package tokens

import (
	"errors"
)

// OpenAI's published chat overhead ("How to count tokens with tiktoken").
const (
	perMessage  = 3 // every message is wrapped in <|start|>{role/name}\n{content}<|end|>\n
	perName     = 1 // a name replaces the role's token and costs one more
	replyPrimed = 3 // every reply is primed with <|start|>assistant<|message|>
)

// jsonModel returns the top-level model of a JSON body ("" if none),
// matching the member name as fold does. It stops at that member, so when
// model comes first it reads almost nothing; a repeated model is found by
// the count that follows.
func jsonModel(body []byte, wk *work) (string, error) {
	j := newJSONReader(body)
	j.work = wk
	j.noUTF8Check = true // the count that follows validates what it reads
	if k, err := j.kind(); err != nil || k != '{' {
		return "", err
	}
	var model string
	var buf [256]byte
	errFound := errors.New("found")
	err := j.object(func(key []byte) error {
		if string(fold(key, buf[:0])) != "model" {
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

// walker counts the text of one JSON body by the tables of shape.go.
type walker struct {
	j      *jsonReader
	m      *meter
	format Format
	model  string
	primed bool // a chat messages array was seen: the reply's priming is owed
	buf    [256]byte
}

// countJSON counts the text a model reads in a JSON body of format f.
func countJSON(body []byte, f Format, model string, m *meter) error {
	w := &walker{j: newJSONReader(body), m: m, format: f, model: model}
	w.j.work = m.work
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '{':
		err = w.top()
	case '[': // a batch of requests: each costs what it would alone
		err = w.j.array(func(int) error {
			m.batch++
			if k, err := w.j.kind(); err != nil || k != '{' {
				if err != nil {
					return err
				}
				return w.content()
			}
			return w.top()
		})
	default:
		err = w.content()
	}
	if err != nil {
		return err
	}
	if err := w.j.end(); err != nil {
		return err
	}
	if w.primed {
		return m.add(replyPrimed)
	}
	return nil
}

// fold folds a member name into w's scratch buffer (see fold); the result
// is valid until the next call.
func (w *walker) fold(key []byte) string { return string(fold(key, w.buf[:0])) }

// top reads a request object: its text members by topMembers, its decided
// members checked for repetition, everything else skipped.
func (w *walker) top() error {
	var seen uint
	return w.j.object(func(key []byte) error {
		name := w.fold(key)
		if bit, ok := decidedIndex[name]; ok {
			if seen&(1<<bit) != 0 {
				return &InvalidError{msg: "duplicate member \"" + decidedMembers[bit] + "\"", final: true}
			}
			seen |= 1 << bit
			return w.j.skip()
		}
		switch topMembers[name] {
		case topMessages:
			return w.messages()
		case topPrompt:
			return w.prompt()
		case topContent:
			return w.content()
		case topSchema:
			return w.schema(false)
		case topTools:
			return w.tools(name == "functions")
		case topImages:
			return w.images()
		}
		if (w.format == FormatSeedChat || w.format == FormatGeneric) && !formParams[name] {
			// /api/chat's fields, and any protected path of no known API:
			// every member but the parameters is text the model may read.
			return w.content()
		}
		return w.j.skip()
	})
}

// content reads a value whose strings are all text: objects as parts.
func (w *walker) content() error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		return w.str()
	case '[':
		return w.j.array(func(int) error { return w.content() })
	case '{':
		return w.part(false)
	}
	return w.j.skip()
}

// str counts the string value next in the stream.
func (w *walker) str() error {
	if err := w.j.str(w.m.stream()); err != nil {
		return err
	}
	return w.m.endText()
}

// messages reads a messages array: OpenAI's per-message overhead and the
// reply's priming on every shape but Anthropic's, which publishes none.
func (w *walker) messages() error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	if k != '[' {
		return w.content()
	}
	chat := w.format != FormatMessages
	w.primed = w.primed || chat
	return w.j.array(func(int) error {
		k, err := w.j.kind()
		if err != nil {
			return err
		}
		if k != '{' {
			return w.content()
		}
		if chat {
			if err := w.m.add(perMessage); err != nil {
				return err
			}
		}
		return w.part(chat)
	})
}

// prompt reads prompt or input: a string, token ids (one token each), a
// batch of those, or Responses API items (each a message's overhead and
// its content).
func (w *walker) prompt() error {
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
			if k == '{' {
				if err := w.m.add(perMessage); err != nil {
					return err
				}
				return w.part(false)
			}
			return w.prompt()
		})
	case '{':
		return w.part(false)
	}
	return w.j.skip()
}

// part reads an object inside content — a message, a content part, a
// block, an item — counting every string but metadata (partKeys), and
// costs the images, files and audio it carries once all its members are
// known. In a chat message (msg) a name costs one token more.
func (w *walker) part(msg bool) error {
	var ps partState
	full := w.j.fullKeys
	w.j.fullKeys = true // a name may be text: read it whole
	defer func() { w.j.fullKeys = full }()
	err := w.j.object(func(key []byte) error {
		name := w.fold(key)
		pk := partKeyOf(name)
		if pk == partText && !formatNames[name] {
			if err := w.m.valueBytes(key); err != nil {
				return err
			}
		}
		k, err := w.j.kind()
		if err != nil {
			return err
		}
		return w.partMember(&ps, pk, name, k, msg)
	})
	if err != nil {
		return err
	}
	return w.finishPart(&ps)
}

// partMember reads the value of a part's member, a name pk is the kind of
// and k the value's kind: a string the part's costing needs is kept in ps,
// anything else is content.
func (w *walker) partMember(ps *partState, pk partKey, name string, k byte, msg bool) (err error) {
	switch pk {
	case partMeta:
		if k == '"' {
			if name == "file_id" || name == "file_url" {
				ps.storedFile = true
			}
			return w.j.skip()
		}
	case partResult:
		if k == '"' {
			ps.result, err = w.readBlob(blobFile)
			return err
		}
	case partDetail:
		if k == '"' {
			d, err := w.j.stringValue(16)
			ps.addDetail(d)
			return err
		}
	case partType, partMediaType, partFormat:
		if k == '"' {
			dst, max := ps.metadata(pk)
			*dst, err = w.j.stringValue(max)
			return err
		}
		if pk == partFormat {
			return w.schema(false)
		}
	case partFilename:
		if k == '"' {
			ps.filename, err = w.countedString(256)
			return err
		}
	case partName:
		if k == '"' && msg {
			if err := w.m.add(perName); err != nil {
				return err
			}
		}
	case partImageURL:
		return w.imageURL(ps)
	case partSource:
		return w.source(ps)
	case partFile:
		return w.file(ps)
	case partFileData:
		if k == '"' {
			b, err := w.readBlob(blobFile)
			ps.files = append(ps.files, b)
			return err
		}
	case partAudio:
		return w.audio()
	case partImages:
		return w.images()
	case partRaw:
		return w.rawAsText()
	}
	return w.content()
}

// countedString counts a string and returns its first max bytes.
func (w *walker) countedString(max int) (string, error) {
	var head []byte
	err := w.j.str(func(p []byte) error {
		if room := max - len(head); room > 0 {
			head = append(head, p[:min(room, len(p))]...)
		}
		return w.m.text(p)
	})
	if err != nil {
		return "", err
	}
	return string(head), w.m.endText()
}

// rawAsText counts a value's JSON text, member names and punctuation
// included (a tool_use input: the model reads it as JSON).
func (w *walker) rawAsText() error {
	if err := w.j.teeValue(w.m.text); err != nil {
		return err
	}
	return w.m.endText()
}

// schema reads a JSON schema (or any value the model is shown as JSON):
// every member name and every string counts. In a tools array (tools),
// the names of the tool format's own members do not: the published
// formula prices those.
func (w *walker) schema(tools bool) error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		return w.str()
	case '[':
		return w.j.array(func(int) error { return w.schema(tools) })
	case '{':
		full := w.j.fullKeys
		w.j.fullKeys = true
		defer func() { w.j.fullKeys = full }()
		return w.j.object(func(key []byte) error {
			name := w.fold(key)
			// A tool format's own member names are priced by the formula;
			// everything else, every value included, is text the model is
			// shown (templates render the tools JSON as it is).
			if !tools || !toolFormatMembers[name] {
				if err := w.m.valueBytes(key); err != nil {
					return err
				}
			}
			return w.schema(tools)
		})
	}
	// Numbers, booleans and nulls are shown to the model as written: an
	// enum of 15,000 numbers is not free.
	return w.j.teeValue(w.m.valueBytes)
}
