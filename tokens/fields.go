package tokens

import (
	"bytes"
	"errors"
	"io"
	"mime"
)

// Body key parts (SPEC §7.2): the fields of a body that rate-limit rules
// key on, read the way §4.6 reads bodies (member names matched after
// unescaping and with simple folding, a decided member repeated in any
// spelling refused) and in the same first pass that finds the model.

// Fields names the body key parts a request's rules need. It is only read:
// one Fields may serve any number of concurrent requests.
type Fields struct {
	// JSON holds dotted paths as written in the rule ("metadata.user_id").
	// Members match as the model member does: after unescaping, with
	// Unicode simple folding. A segment of digits also indexes an array
	// ("messages.0.role").
	JSON []string
	// XML holds local element names ("dRucEm"), namespaces ignored.
	XML []string
	// Form holds form field names, matched exactly.
	Form []string
}

func (f *Fields) none() bool {
	return f == nil || len(f.JSON) == 0 && len(f.XML) == 0 && len(f.Form) == 0
}

// Value is one key part's value; Found is false when the body lacks it
// (or, in JSON, it is null, an object or an array). A JSON string is its
// unescaped value, a number its literal text, a boolean "true" or
// "false"; an XML element its character data, CDATA included, trimmed of
// surrounding white space; a form field its value as sent. Values are
// returned in full whatever their length.
type Value struct {
	S     string
	Found bool
}

// Values are the values found, index for index with Fields' lists.
type Values struct{ JSON, XML, Form []Value }

func newValues(f *Fields) Values {
	if f == nil {
		return Values{}
	}
	return Values{JSON: make([]Value, len(f.JSON)), XML: make([]Value, len(f.XML)), Form: make([]Value, len(f.Form))}
}

// ReadFields reads a body's model and its key parts req.Fields (nil: the
// model alone) without counting tokens, for routes that count none. It
// reads the whole body (a decided member repeated at its end is found)
// and gives the errors Estimate gives: an error wrapping ErrInvalid for a
// body that cannot be parsed as its content type says or that repeats a
// decided member.
func (t *Tokenizer) ReadFields(req Request) (model string, v Values, err error) {
	p := newPass(req)
	if p.kind == bodyNotUTF8 {
		return "", Values{}, invalid(errNotUTF8JSON)
	}
	p.full = true
	if err := p.first(); err != nil {
		if errors.Is(err, errWork) {
			err = &InvalidError{msg: "the body holds more parts than can be read within the work bound"}
		}
		return "", Values{}, invalid(err)
	}
	return p.model, p.values, nil
}

var errNotUTF8JSON = &InvalidError{msg: "a JSON body must be UTF-8 without a byte order mark"}

// pass is one request's reading: how its body is read, and what the first
// pass found.
type pass struct {
	work      *work // the request's costing budget, shared by both passes
	req       Request
	mediaType string
	params    map[string]string
	kind      bodyKind
	// full: no count follows to validate the body and find repeated
	// decided members, so the first pass reads the whole body.
	full   bool
	model  string
	values Values
}

func newPass(req Request) pass {
	p := pass{req: req, mediaType: "application/json", work: newWork(int64(len(req.Body)))}
	if req.ContentType != p.mediaType { // the common case needs no parsing
		p.mediaType, p.params, _ = mime.ParseMediaType(req.ContentType)
	}
	p.kind = bodyKindOf(p.mediaType, p.open())
	p.values = newValues(req.Fields)
	return p
}

func (p *pass) open() io.Reader { return bytes.NewReader(p.req.Body) }

// first is the first pass: the model (unless the request names it) and
// the key parts. Each is read from the reading of the body its kind
// names: JSON paths from a JSON body (also one sent with another type
// that starts like JSON), XML names from an XML body, form fields from a
// multipart or URL-encoded body. A JSON-looking body sent as a form is
// read both ways, as Estimate counts it both ways. A body that only
// looked like JSON (not sent as JSON, and not parsing) is text: its JSON
// paths are not found.
func (p *pass) first() error {
	f := p.req.Fields
	if f == nil {
		f = &Fields{}
	}
	needModel := p.req.Model == ""
	var err error
	switch p.kind {
	case bodyJSON:
		switch {
		case p.full || len(f.JSON) > 0:
			// Duplicates can hide anywhere: the whole document is walked.
			p.model, err = jsonFields(p.req.Body, f.JSON, p.values.JSON, p.full, p.work)
		case needModel:
			p.model, err = jsonModel(p.req.Body, p.work)
		}
		var inv *InvalidError
		if !isJSONType(p.mediaType) && errors.As(err, &inv) && !inv.final {
			// It only looked like JSON: the model reads it as text.
			p.kind, p.model, err = bodyText, "", nil
			clear(p.values.JSON)
		}
		if err == nil && len(f.Form) > 0 && p.mediaType == "application/x-www-form-urlencoded" {
			_, err = readForm(p.open(), int64(len(p.req.Body)), f.Form, p.values.Form, false)
		}
	case bodyMultipart:
		if p.full || len(f.Form) > 0 {
			p.model, err = multipartFields(p.open(), p.params["boundary"], f.Form, p.values.Form, p.work)
		} else if needModel {
			p.model, err = multipartModel(p.open(), p.params["boundary"], p.work)
		}
	case bodyForm:
		if needModel || len(f.Form) > 0 {
			p.model, err = readForm(p.open(), int64(len(p.req.Body)), f.Form, p.values.Form, needModel)
		}
	}
	if err == nil && len(f.XML) > 0 && p.kind != bodyMultipart && !isJSONType(p.mediaType) {
		err = readXML(p.open(), isXMLType(p.mediaType), p.params["charset"], f.XML, p.values.XML)
	}
	if !needModel {
		p.model = p.req.Model
	}
	return err
}
