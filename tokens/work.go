package tokens

import "errors"

// Costing is bounded work (the contract: at most 5 ms of CPU plus 25 ms
// per MiB of body). The bound is kept by counting work, never by reading a
// clock: a request's costing draws on one budget of steps, each step a
// piece of work of about a microsecond or less on a current core, and a
// request that reaches the end of its budget is refused as over the cap,
// whatever the machine's load. Readers whose work grows with what the
// bytes say rather than with the bytes (multipart parts, PDF objects and
// decoded streams, audio frames) draw on it; reading JSON and counting
// text are linear in the body and stop at the cap on their own.

// Steps of the budget: a request may spend workBase steps, and workPerMiB
// more for each MiB of body.
const (
	workBase   = 5_000
	workPerMiB = 25_000
)

// Costs, in steps, of the readers' units of work, measured with
// BenchmarkHostile (README: "What a request costs to cost").
const (
	workPart        = 10  // a multipart part: its header parsed, its disposition read
	pdfStepsPerStep = 100 // tokens/pdf's steps (a lexer token, an operator) in one
	workElements    = 16  // JSON containers and members read (~40 ns each when tiny, read in place)
	workToolsBytes  = 16  // bytes of a tools array decoded for the published formula
)

// Reasons a costing was cut short, as ratelimit_proxy_cost_limited_total
// names them.
const (
	LimitedMultipart = "multipart_parts"
	LimitedPDF       = "pdf"
	LimitedAudio     = "audio"
	LimitedImage     = "image"
	LimitedJSON      = "json"
)

// LimitReasons are every reason Estimate.Limited may hold.
var LimitReasons = []string{LimitedMultipart, LimitedPDF, LimitedAudio, LimitedImage, LimitedJSON}

// errWork unwinds a costing whose budget ran out.
var errWork = errors.New("costing work bound reached")

// work is one request's budget.
type work struct {
	left   int64
	reason string // why it ran out
}

func newWork(size int64) *work {
	return &work{left: workBase + workPerMiB*size/(1<<20)}
}

// draw spends n steps for reason; past the budget it returns errWork.
func (w *work) draw(n int64, reason string) error {
	if w == nil {
		return nil
	}
	w.left -= n
	if w.left < 0 {
		w.reason = reason
		return errWork
	}
	return nil
}

// exhaust marks the budget spent by a reader that kept its own count.
func (w *work) exhaust(reason string) error {
	if w != nil {
		w.left, w.reason = -1, reason
	}
	return errWork
}

// steps is what remains, at least 1.
func (w *work) steps() int64 {
	if w == nil {
		return 1 << 62
	}
	return max(w.left, 1)
}
