package usage

import (
	"bytes"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

// counter gathers output text and counts it with fn in batches of max
// bytes, so the text held stays bounded whatever the body holds.
type counter struct {
	fn    func([]byte) int
	max   int
	text  []byte
	total int64
}

// write adds text; every time max bytes are gathered they are counted and
// dropped, so batches fall at the same places however the text arrives.
func (c *counter) write(b []byte) {
	for len(b) > 0 {
		n := min(c.max-len(c.text), len(b))
		c.text = append(c.text, b[:n]...)
		b = b[n:]
		if len(c.text) >= c.max {
			c.flush()
		}
	}
}

// flush counts the text gathered and drops it.
func (c *counter) flush() {
	if len(c.text) == 0 {
		return
	}
	if n := c.fn(c.text); n > 0 {
		c.total += int64(n)
	}
	c.text = c.text[:0]
}

// str adds the contents of v when it is a JSON string (cut short or not),
// its escapes decoded.
func (c *counter) str(v []byte) {
	if len(v) == 0 || v[0] != '"' {
		return
	}
	s := v[1:]
	if e, ok := jsonscan.SkipString(v, 0); ok {
		s = v[1 : e-1]
	}
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			c.write(s)
			return
		}
		c.write(s[:i])
		s = c.escape(s[i:])
	}
}

// escape adds the escape at the start of s and returns what follows it;
// one JSON does not know is taken as it stands.
func (c *counter) escape(s []byte) []byte {
	var buf [8]byte
	out, n, _ := jsonscan.AppendEscape(buf[:0], s)
	c.write(out)
	return s[n:]
}

// arguments adds tool-call arguments: a JSON string's contents, or an
// object (Ollama) as its JSON text.
func (c *counter) arguments(v []byte) {
	if len(v) > 0 && v[0] == '{' {
		c.write(v)
		return
	}
	c.str(v)
}

// eventText adds the output text of one stream event: OpenAI's
// choices[].delta (content, refusal, reasoning, tool-call arguments) and
// choices[].text, the Responses API's text deltas, Anthropic's
// content_block_delta, Ollama's message and response. An error event has
// none.
func eventText(c *counter, p []byte) {
	var typ, choices, delta, message, response []byte
	o := jsonscan.OpenObject(p, 0)
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		v := p[m.VS:m.VE]
		switch string(m.Key) {
		case "error":
			if !jsonscan.IsNull(v) {
				return
			}
		case "type":
			typ = v
		case "choices":
			choices = v
		case "delta":
			delta = v
		case "message":
			message = v
		case "response":
			response = v
		}
	}
	choicesText(c, choices)
	if delta != nil {
		switch t := jsonscan.Unquoted(typ); {
		case isTextType(t):
			c.str(delta)
		case string(t) == "content_block_delta":
			o := jsonscan.OpenObject(delta, 0)
			for m, ok := o.Next(); ok; m, ok = o.Next() {
				switch string(m.Key) {
				case "text", "partial_json", "thinking":
					c.str(delta[m.VS:m.VE])
				}
			}
		}
	}
	messageText(c, message)
	c.str(response)
}

// docText adds the output text of one JSON document: OpenAI's
// choices[].message and choices[].text, the Responses API's output[],
// Anthropic's content[], Ollama's message and response. An error answer
// has none.
func docText(c *counter, doc []byte) {
	var choices, output, content, message, response []byte
	o := jsonscan.OpenObject(doc, 0)
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		v := doc[m.VS:m.VE]
		switch string(m.Key) {
		case "error":
			if !jsonscan.IsNull(v) {
				return
			}
		case "choices":
			choices = v
		case "output":
			output = v
		case "content":
			content = v
		case "message":
			message = v
		case "response":
			response = v
		}
	}
	choicesText(c, choices)
	a := jsonscan.OpenArray(output)
	for item, ok := a.Next(); ok; item, ok = a.Next() {
		o := jsonscan.OpenObject(item, 0)
		for m, ok := o.Next(); ok; m, ok = o.Next() {
			v := item[m.VS:m.VE]
			switch string(m.Key) {
			case "content", "summary":
				partsText(c, v)
			case "arguments", "input":
				c.arguments(v)
			}
		}
	}
	partsText(c, content)
	messageText(c, message)
	c.str(response)
}

// choicesText adds the text of OpenAI's choices: delta or message, and
// text.
func choicesText(c *counter, v []byte) {
	a := jsonscan.OpenArray(v)
	for ch, ok := a.Next(); ok; ch, ok = a.Next() {
		o := jsonscan.OpenObject(ch, 0)
		for m, ok := o.Next(); ok; m, ok = o.Next() {
			switch string(m.Key) {
			case "delta", "message":
				messageText(c, ch[m.VS:m.VE])
			case "text":
				c.str(ch[m.VS:m.VE])
			}
		}
	}
}

// messageText adds the text of a message or delta object: content (a
// string or parts), refusal, reasoning, tool-call arguments.
func messageText(c *counter, v []byte) {
	o := jsonscan.OpenObject(v, 0)
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		val := v[m.VS:m.VE]
		switch string(m.Key) {
		case "content":
			c.str(val)
			partsText(c, val)
		case "refusal", "reasoning_content", "reasoning", "thinking":
			c.str(val)
		case "tool_calls":
			a := jsonscan.OpenArray(val)
			for call, ok := a.Next(); ok; call, ok = a.Next() {
				c.arguments(jsonscan.Lookup(jsonscan.Lookup(call, "function"), "arguments"))
			}
		case "function_call":
			c.arguments(jsonscan.Lookup(val, "arguments"))
		}
	}
}

// partsText adds the text of an array of content parts or blocks: text,
// refusal, thinking, and a tool_use block's input as JSON text.
func partsText(c *counter, v []byte) {
	a := jsonscan.OpenArray(v)
	for part, ok := a.Next(); ok; part, ok = a.Next() {
		o := jsonscan.OpenObject(part, 0)
		for m, ok := o.Next(); ok; m, ok = o.Next() {
			val := part[m.VS:m.VE]
			switch string(m.Key) {
			case "text", "refusal", "thinking":
				c.str(val)
			case "input":
				c.arguments(val)
			}
		}
	}
}
