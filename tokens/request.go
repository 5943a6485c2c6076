package tokens

import (
	"bytes"
	"errors"
	"io"
	"strings"
)

// Format is the API whose request shape a body follows.
type Format int

// Formats, chosen by path (FormatForPath).
const (
	FormatGeneric     Format = iota // any known text fields, no overhead
	FormatChat                      // OpenAI /v1/chat/completions
	FormatCompletions               // OpenAI /v1/completions
	FormatEmbeddings                // OpenAI /v1/embeddings
	FormatResponses                 // OpenAI /v1/responses
	FormatMessages                  // Anthropic /v1/messages
	FormatSeedChat                  // /api/chat: JSON or multipart message, system, files; multipart +50
)

// SeedOverhead is the seed's format overhead for a multipart /api/chat.
const SeedOverhead = 50

// FormatForPath maps a request path to its format.
func FormatForPath(path string) Format {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return FormatChat
	case strings.HasSuffix(path, "/completions"):
		return FormatCompletions
	case strings.HasSuffix(path, "/embeddings"):
		return FormatEmbeddings
	case strings.HasSuffix(path, "/responses"):
		return FormatResponses
	case strings.HasSuffix(path, "/messages"):
		return FormatMessages
	case path == "/api/chat":
		return FormatSeedChat
	}
	return FormatGeneric
}

// Request is a body to estimate.
type Request struct {
	Format      Format
	ContentType string
	// Body is the whole body, read more than once (a first pass finds
	// the model) and never written.
	Body  []byte
	Model string // when set, overrides the body's model field
	// Fields, when non-nil, are the body key parts Estimate also reads, in
	// its first pass (see Fields and ReadFields).
	Fields *Fields
}

// Estimate is the result of counting a request.
type Estimate struct {
	Tokens   int
	Model    string // the model counted for ("" when the body names none)
	Encoding string // o200k_base, cl100k_base or Heuristic
	// Stopped reports that counting ended early because Tokens passed the
	// limit; Tokens is then the count reached, a lower bound of the full
	// count and above the limit.
	Stopped bool
	// Values are the key parts of Request.Fields, when it was set.
	Values Values
	// Batch is the number of requests of a JSON body that is a top-level
	// array of them (counted as far as counting went); 0 otherwise.
	Batch int
	// Limited names the reader whose work reached the request's bound
	// (LimitReasons); "" when costing finished within it. A limited
	// estimate is Stopped, and its Tokens are over the limit: what could
	// not be costed is over the cap.
	Limited string
}

// ErrInvalid is wrapped by every error about a body that cannot be parsed
// as its content type says.
var ErrInvalid = errors.New("invalid request body")

// Estimate counts the input tokens of req, stopping once the count passes
// limit (negative: count everything). A body that cannot be parsed as its
// content type says gives an error wrapping ErrInvalid, whose message
// tells where (never what). When req.Fields is set, the key parts it
// names are read in the first pass, the one that finds the model, and
// returned in Values; they change nothing of the count.
func (t *Tokenizer) Estimate(req Request, limit int) (Estimate, error) {
	p := newPass(req)
	if p.kind == bodyNotUTF8 {
		return Estimate{}, invalid(errNotUTF8JSON)
	}
	if req.Model == "" || !req.Fields.none() {
		if err := p.first(); errors.Is(err, errWork) {
			return p.limited(Estimate{Model: p.model}, limit), nil
		} else if err != nil {
			return Estimate{}, invalid(err)
		}
	} else {
		p.model = req.Model
	}
	kind, model, mediaType := p.kind, p.model, p.mediaType
	c := t.counterFor(model)
	if err := load(c); err != nil {
		return Estimate{}, err
	}
	m := &meter{c: c, limit: limit, work: p.work}
	var err error
	switch kind {
	case bodyJSON:
		err = countJSON(req.Body, req.Format, model, m)
	case bodyMultipart:
		err = countMultipart(p.open(), p.params["boundary"], pricing{model: model, anthropic: req.Format == FormatMessages}, m)
	case bodyForm:
		err = countForm(p.open(), int64(len(req.Body)), m)
	default:
		err = countText(p.open(), m)
	}
	if err == nil && req.Format == FormatSeedChat && kind == bodyMultipart {
		err = m.add(SeedOverhead)
	}
	var inv *InvalidError
	if kind == bodyJSON && errors.As(err, &inv) && !inv.final && !isJSONType(mediaType) {
		// It only looked like JSON, and its type never said it was: the
		// model reads it as text, and it has no JSON members.
		m = &meter{c: c, limit: limit, work: p.work}
		err = countText(p.open(), m)
		clear(p.values.JSON)
	}
	if kind == bodyJSON && mediaType == "application/x-www-form-urlencoded" && !errors.As(err, &inv) {
		// JSON sent as a form (curl -d) is also a form to a form parser:
		// {"x":"&message=…&"} holds a message field. The larger reading
		// counts.
		fm := &meter{c: c, limit: limit, work: p.work}
		ferr := countForm(p.open(), int64(len(req.Body)), fm)
		if fm.total > m.total {
			m, err = fm, ferr
		}
	}
	est := Estimate{Tokens: m.total, Model: model, Encoding: c.Name(), Stopped: errors.Is(err, errStop), Values: p.values, Batch: m.batch}
	if p.work.reason != "" {
		// The budget ran out, whichever error it unwound through.
		return p.limited(est, limit), nil
	}
	if err != nil && !est.Stopped {
		return est, invalid(err)
	}
	return est, nil
}

// limited marks est as cut short by the work bound: stopped, and over
// limit when there is one.
func (p *pass) limited(est Estimate, limit int) Estimate {
	est.Limited, est.Stopped = p.work.reason, true
	if limit >= 0 {
		est.Tokens = max(est.Tokens, limit+1)
	}
	return est
}

func invalid(err error) error {
	var inv *InvalidError
	if errors.As(err, &inv) || errors.Is(err, ErrInvalid) {
		return errors.Join(ErrInvalid, err)
	}
	return err
}

type bodyKind int

const (
	bodyText bodyKind = iota
	bodyJSON
	bodyMultipart
	bodyForm
	bodyNotUTF8 // JSON behind a byte order mark, or in UTF-16 or UTF-32
)

// bodyKindOf decides how to read a body: by its media type, and for the
// types clients send carelessly (curl -d's form type, none, text/plain) by
// whether it starts like JSON.
func bodyKindOf(mediaType string, body io.Reader) bodyKind {
	switch {
	case isJSONType(mediaType):
		return bodyJSON
	case mediaType == "multipart/form-data":
		return bodyMultipart
	}
	var head [64]byte
	n, _ := io.ReadFull(body, head[:])
	if jsonInOtherEncoding(head[:n]) {
		return bodyNotUTF8
	}
	if c := bytes.TrimLeft(head[:n], " \t\r\n"); len(c) > 0 && (c[0] == '{' || c[0] == '[') {
		return bodyJSON // a batch of requests sent as a form is JSON too
	}
	if mediaType == "application/x-www-form-urlencoded" {
		return bodyForm
	}
	return bodyText
}

// countText counts a whole body as one text.
func countText(r io.Reader, m *meter) error {
	buf := m.scratch()
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if err := m.text(buf[:n]); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return m.endText()
		}
		if err != nil {
			return err
		}
	}
}

// jsonInOtherEncoding reports whether a body starts like JSON behind a
// byte order mark, or like JSON in UTF-16 or UTF-32, which lenient
// upstreams (Python's json.loads on bytes) decode: the counter reads UTF-8
// only, so such a body is refused rather than misread.
func jsonInOtherEncoding(head []byte) bool {
	rest, bom := bytes.CutPrefix(head, []byte("\xef\xbb\xbf"))
	for _, m := range [][]byte{[]byte("\xfe\xff"), []byte("\xff\xfe")} {
		if r, ok := bytes.CutPrefix(head, m); ok {
			rest, bom = r, true
		}
	}
	// Strip NULs and white space: UTF-16 and UTF-32 pad ASCII with NULs.
	nul := false
	for len(rest) > 0 && (rest[0] == 0 || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '\r' || rest[0] == '\n') {
		nul = nul || rest[0] == 0
		rest = rest[1:]
	}
	if len(rest) == 0 || rest[0] != '{' && rest[0] != '[' {
		return false
	}
	return bom || nul || len(rest) > 1 && rest[1] == 0
}

func isJSONType(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
