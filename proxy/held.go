package proxy

import (
	"net/http"
	"time"
)

// A client that leaves while a delay rule holds its request leaves
// uncounted (SPEC §7.3): the hold ends when the request's context is done.
// But Go's server cancels that context on a closed connection only once
// it reads the connection again, which it does after the request's body
// has been read to its end. A request decided before its body was read
// (no rule needs the body) would sit unnoticed until its wait was over,
// then be counted. So the body of a held request is read while it waits,
// as it would be after its admission: within MAX_BODY_BYTES, into the
// spool the guards then take it from.

// heldRead is the body of a held request being read while it waits.
type heldRead struct {
	done chan struct{}
	body *spooled
	err  error
}

// readWhileHeld starts reading r's body while a delay rule holds it, when
// the guards would read it after admission and have not yet: a protected
// route, a body, within MAX_BODY_BYTES as declared, not compressed (those
// are refused unread), on a connection whose reads can be given a
// deadline.
func (x *exchange) readWhileHeld() {
	r := x.r
	if x.apiPath == "" || x.body != nil || x.bodyRead || x.heldRead != nil ||
		r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 ||
		r.ContentLength > x.pol.cfg.MaxBodyBytes || compressed(r) {
		return
	}
	w, limit := x.ResponseWriter, x.pol.cfg.MaxBodyBytes
	// The wall clock's deadline, as readBody's.
	if http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyReadTimeout)) != nil {
		return // a read that could not be cut short: left for after the hold
	}
	h := &heldRead{done: make(chan struct{})}
	x.heldRead = h
	go func() {
		defer close(h.done)
		h.body, h.err = readWithin(w, r, limit)
	}()
}

// endHeldRead waits for the body being read while held, and keeps what
// was read for the guards. With stop (the request is refused or gone), a
// read still under way is cut short: nothing will be forwarded.
func (x *exchange) endHeldRead(stop bool) {
	h := x.heldRead
	if h == nil {
		return
	}
	x.heldRead = nil
	rc := http.NewResponseController(x.ResponseWriter)
	select {
	case <-h.done:
	default:
		if stop {
			_ = rc.SetReadDeadline(time.Unix(1, 0)) // in the past: the read returns at once
		}
		<-h.done
	}
	_ = rc.SetReadDeadline(time.Time{})
	x.body, x.bodyErr, x.bodyRead = h.body, h.err, true
	if h.err != nil {
		// The rest of the body is not read: the connection ends with the
		// answer (else Go's server would wait to drain it first).
		x.Header()["Connection"] = []string{"close"}
	}
}
