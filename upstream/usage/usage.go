// Package usage finds the token usage an LLM API reports in a response body
// while the body passes through the proxy, so that a token budget reserved
// at admission can be settled to what the upstream really used (SPEC §8).
//
// NewReader wraps the upstream body. As bytes pass it finds the usage the
// upstream reports (a JSON body's "usage", the final usage chunk of an
// OpenAI stream, Anthropic's message_start and message_delta, the Responses
// API's response.completed), keeps the output text's raw events, bounded,
// to count them with the request's tokenizer when no usage arrives, and,
// for an OpenAI stream where the proxy itself asked for usage, removes that
// usage so the client gets exactly the bytes it would have got. Nothing is
// buffered beyond one server-sent event, and only when stripping: the
// scanning costs a byte search per event, and JSON is read only where
// "usage" appears.
package usage

import (
	"errors"
	"io"
)

// API is the request's API shape: where the usage and the output text are.
type API uint8

// The API shapes.
const (
	// OpenAIChat is /v1/chat/completions: usage {prompt_tokens,
	// completion_tokens, total_tokens, prompt_tokens_details.cached_tokens,
	// completion_tokens_details.reasoning_tokens}.
	OpenAIChat API = iota
	// OpenAICompletions is /v1/completions: the same usage; text in
	// choices[].text.
	OpenAICompletions
	// OpenAIResponses is /v1/responses: usage {input_tokens, output_tokens,
	// total_tokens, input_tokens_details.cached_tokens,
	// output_tokens_details.reasoning_tokens}; in a stream, in the
	// response.completed (or response.incomplete, response.failed) event's
	// response.usage.
	OpenAIResponses
	// OpenAIEmbeddings is /v1/embeddings: usage {prompt_tokens,
	// total_tokens}; no output.
	OpenAIEmbeddings
	// Anthropic is /v1/messages: usage {input_tokens, output_tokens,
	// cache_read_input_tokens, cache_creation_input_tokens}; in a stream,
	// message_start's message.usage, then message_delta's usage, whose
	// output_tokens is cumulative.
	Anthropic
	// Generic is anything else (/api/chat, Ollama…): an OpenAI- or
	// Anthropic-shaped top-level "usage", or Ollama's top-level
	// prompt_eval_count and eval_count.
	Generic
)

// Usage is what the upstream reported, normalised.
type Usage struct {
	// Input is every input token the model read: OpenAI's prompt_tokens or
	// input_tokens (cached included); Anthropic's input_tokens +
	// cache_read_input_tokens + cache_creation_input_tokens.
	Input int64
	// CachedInput is OpenAI's cached_tokens, Anthropic's
	// cache_read_input_tokens (part of Input).
	CachedInput int64
	// CacheWrite is Anthropic's cache_creation_input_tokens (part of Input).
	CacheWrite int64
	// Output is completion_tokens or output_tokens, reasoning included.
	Output int64
	// Reasoning is reasoning_tokens (part of Output).
	Reasoning int64
}

// Total returns Input + Output.
func (u Usage) Total() int64 { return u.Input + u.Output }

// Options configures a reader.
type Options struct {
	// API is the request's API shape.
	API API
	// Stream says the response is text/event-stream (the proxy decides
	// from the response's Content-Type); otherwise the body is one JSON
	// document, several (NDJSON), or not JSON at all.
	Stream bool
	// Strip says the proxy added stream_options.include_usage to an OpenAI
	// chat or completions streaming request the client sent without it.
	// Then the usage chunk (a data event whose JSON has a non-null
	// top-level "usage" and an empty "choices" array) is removed whole,
	// with its event terminator, and from every other data event a
	// top-level "usage" member is removed (null, as OpenAI adds to every
	// chunk, or non-null on a chunk that also has choices, after recording
	// it) with one adjacent comma and the space between, so the client gets
	// the bytes the upstream would have sent without include_usage. All
	// else passes byte for byte. Strip applies to streams of OpenAIChat and
	// OpenAICompletions only; elsewhere it is ignored.
	Strip bool
	// Count counts output text tokens in the request's model encoding. It
	// is called only when the count can matter (no complete usage, or the
	// body closed early) and on each MaxText of text on the way. Nil counts
	// a token per 4 bytes.
	Count func(text []byte) int
	// MaxText bounds the raw events kept for the fallback count, and the
	// output text extracted from them, each (default 64 KiB): past it, the
	// events kept are read for their text, and text past it is counted
	// with Count and dropped.
	MaxText int
	// MaxEvent bounds one event held while deciding whether to strip it,
	// and the payload kept whole for reading (default 1 MiB). A held event
	// that passes it is released unmodified and stripping stops for the
	// rest of the stream; a longer payload is searched for its usage in its
	// last 64 KiB.
	MaxEvent int
	// MaxBody bounds the copy of a non-stream body kept for parsing when
	// it closes (default 4 MiB). A longer body keeps its head, and its
	// usage is looked for in its last 64 KiB.
	MaxBody int
}

// Result is what the response reported, given once when the body closes.
type Result struct {
	// Usage is the usage reported. It may hold partial figures when
	// Reported is false (Anthropic's message_start without a
	// message_delta).
	Usage Usage
	// Reported says a complete usage was found: an OpenAI JSON usage or
	// final usage chunk; a Responses usage (JSON, or the completed,
	// incomplete or failed event's); an Anthropic JSON usage, or a
	// message_delta usage in a stream (with message_start's input
	// figures); an Ollama eval_count.
	Reported bool
	// Output is the tokens of the output text that passed (content,
	// deltas, tool-call arguments, reasoning or thinking text, refusals;
	// none for an error answer; a body that is not JSON is all text),
	// counted with Count. It is counted when Reported is false or Complete
	// is false, and is then valid whether or not Reported; when the body
	// reached EOF with a complete usage it is not counted and is 0 (the
	// tokenizer pass is the cost the fallback exists to avoid).
	Output int64
	// Complete says the body reached EOF (false: closed early, the client
	// gone or the upstream failing mid-stream).
	Complete bool
}

// Defaults and fixed bounds.
const (
	defaultMaxText  = 64 << 10
	defaultMaxEvent = 1 << 20
	defaultMaxBody  = 4 << 20
	tailWindow      = 64 << 10 // the end of a long body or event searched for its usage
	maxEmptyReads   = 100      // body reads giving 0, nil in a row before io.ErrNoProgress
)

var errClosed = errors.New("usage: read after close")

// action is what stripping does to an event.
type action uint8

const (
	actKeep   action = iota // pass it as it is
	actDrop                 // remove it whole
	actRemove               // remove the spans
)

// span is a range [a, b) of bytes to remove.
type span struct{ a, b int }

var _ io.ReadCloser = (*reader)(nil)

// reader is the io.ReadCloser NewReader returns. Read and Close must not
// be called concurrently (the forwarding calls both from one
// goroutine).
type reader struct {
	body io.ReadCloser
	o    Options
	done func(Result)

	cut   bool // Strip applies to this response
	strip bool // still stripping: false once an event passed MaxEvent

	ps  parser
	doc docScan

	usage    Usage
	reported bool
	anth     anthropic

	keep  []byte // raw payloads kept for the fallback count, each after its length
	cnt   counter
	spans []span

	hold   []byte // the event held while stripping
	out    []byte // bytes released for the client and not yet read
	outPos int
	dropLF bool // the event dropped ended in '\r': drop a '\n' right after it

	err    error
	eof    bool
	closed bool
}

// NewReader wraps body. done (if not nil) is called exactly once, from
// Close, with what was seen; the forwarding always closes the body,
// also after a failed copy. Read returns the bytes for the client: with
// stripping, possibly fewer than were read from body, but never 0 and a
// nil error (it reads on when a whole read was stripped).
func NewReader(body io.ReadCloser, o Options, done func(Result)) io.ReadCloser {
	if o.MaxText <= 0 {
		o.MaxText = defaultMaxText
	}
	if o.MaxEvent <= 0 {
		o.MaxEvent = defaultMaxEvent
	}
	if o.MaxBody <= 0 {
		o.MaxBody = defaultMaxBody
	}
	if o.API > Generic {
		o.API = Generic
	}
	count := o.Count
	if count == nil {
		count = func(b []byte) int { return (len(b) + 3) / 4 }
	}
	r := &reader{body: body, o: o, done: done}
	r.cut = o.Strip && o.Stream && (o.API == OpenAIChat || o.API == OpenAICompletions)
	r.strip = r.cut
	r.ps.maxData = o.MaxEvent
	r.ps.track = r.cut
	r.cnt = counter{fn: count, max: o.MaxText}
	return r
}

// Read implements io.Reader.
func (r *reader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, errClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	if r.cut {
		return r.readStrip(p)
	}
	return r.readPass(p)
}

// readPass reads with every byte passing as read, scanned on the side.
func (r *reader) readPass(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	for empty := 0; ; empty++ {
		n, err := r.body.Read(p)
		if n > 0 {
			if r.o.Stream {
				r.scan(p[:n])
			} else {
				r.feedBody(p[:n])
			}
		}
		if err != nil {
			r.fail(err)
			return n, err
		}
		if n > 0 {
			return n, nil
		}
		if empty+1 >= maxEmptyReads {
			return 0, io.ErrNoProgress
		}
	}
}

// fail records the body's error (io.EOF included); a held event is
// released first, unmodified.
func (r *reader) fail(err error) {
	r.err = err
	if err == io.EOF {
		r.eof = true
	}
	if len(r.hold) > 0 {
		r.out = append(r.out, r.hold...)
		r.hold = r.hold[:0]
	}
}

// scan reads stream bytes that pass unmodified.
func (r *reader) scan(b []byte) {
	for len(b) > 0 {
		k, kind := r.ps.scan(b)
		if kind == kindEvent {
			r.dispatch()
		}
		b = b[k:]
	}
}

// Buffered returns how many bytes Read can return without waiting on the
// upstream: those released and not yet read, and what the wrapped body
// says it has at hand (0 when it cannot tell). The forwarding flushes a
// stream when this is 0. An event held while stripping is not counted: it
// waits for the rest of itself. Must not be called concurrently with Read.
func (r *reader) Buffered() int {
	if r.closed {
		return 0
	}
	n := len(r.out) - r.outPos
	if r.err == nil {
		if b, ok := r.body.(interface{ Buffered() int }); ok {
			n += b.Buffered()
		}
	}
	return n
}

// Push copies the body to w through the wrapped body's own Push (an
// upstream connection's, which then reads no more than it must), each
// byte scanned, and stripped when that applies, on its way, as Read would.
// pushed is false, and nothing was read, when the wrapped body cannot
// push: the caller then reads. The wrapped body must hand its writes
// buffers it does not use again (stripping works in place). Must not be
// called concurrently with Read.
func (r *reader) Push(w io.Writer, flush func() error, buf []byte) (pushed bool, err error) {
	p, ok := r.body.(interface {
		Push(io.Writer, func() error, []byte) (bool, error)
	})
	if !ok || r.closed || r.err != nil || r.outPos < len(r.out) {
		return false, nil
	}
	sw := scanWriter{r: r, w: w}
	if pushed, err = p.Push(&sw, flush, buf); !pushed {
		return false, nil
	}
	if sw.err != nil {
		return true, err // the client's error: the stream stays unfinished
	}
	if err == nil {
		r.fail(io.EOF)
	} else {
		r.fail(err)
	}
	// An event held back while stripping is released, as it is; then the
	// upstream's error, if any.
	if werr := sw.release(); werr != nil {
		return true, werr
	}
	return true, err
}

// scanWriter is what a pushed body writes to: it scans the bytes as
// readPass does, or strips them as readStrip does, and passes on what is
// for the client.
type scanWriter struct {
	r   *reader
	w   io.Writer
	err error // the client's
}

func (s *scanWriter) Write(p []byte) (int, error) {
	r := s.r
	out := p
	switch {
	case r.cut:
		out = p[:r.consume(p, 0)] // in place; more may wait in r.out
	case r.o.Stream:
		r.scan(p)
	default:
		r.feedBody(p)
	}
	if err := s.put(out); err != nil {
		return 0, err
	}
	if err := s.release(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// release writes what stripping left in r.out.
func (s *scanWriter) release() error {
	r := s.r
	if r.outPos == len(r.out) {
		return nil
	}
	err := s.put(r.out[r.outPos:])
	r.out, r.outPos = r.out[:0], 0
	return err
}

func (s *scanWriter) put(b []byte) error {
	if len(b) == 0 || s.err != nil {
		return s.err
	}
	n, err := s.w.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	s.err = err
	return err
}

// Close closes the body and reports the result to done, once.
func (r *reader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	err := r.body.Close()
	res := r.result()
	r.releaseKeep()
	r.hold, r.out, r.ps.data, r.doc.head = nil, nil, nil, nil
	if r.done != nil {
		r.done(res)
	}
	return err
}

// result settles what was seen.
func (r *reader) result() Result {
	if !r.o.Stream {
		r.finishBody()
	}
	res := Result{Usage: r.usage, Reported: r.reported, Complete: r.eof}
	if !res.Reported || !res.Complete {
		if r.o.Stream {
			r.flushKeep()
		} else {
			r.bodyText()
		}
		r.cnt.flush()
		res.Output = r.cnt.total
	}
	return res
}
