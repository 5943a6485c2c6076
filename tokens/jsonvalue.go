package tokens

import "math"

// Readers of a whole value's raw JSON text, for members whose text is
// costed as a whole (schemas, tool arguments) or returned (key parts).

// teeValue consumes one value, handing its raw JSON text to sink in pieces
// as it goes: memory stays bounded whatever the value's size.
func (j *jsonReader) teeValue(sink func([]byte) error) error {
	if _, err := j.peek(); err != nil {
		return err
	}
	j.capture, j.capturing, j.captureMax, j.overflow, j.tee = j.capture[:0], true, math.MaxInt, false, sink
	err := j.skip()
	j.capturing, j.tee = false, nil
	if err == nil && len(j.capture) > 0 {
		err = sink(j.capture)
	}
	j.capture = j.capture[:0]
	return err
}

// captureValue consumes one value and returns its raw JSON text; past max
// bytes it returns the first max bytes and errCaptureFull (the value is
// consumed either way).
func (j *jsonReader) captureValue(max int) ([]byte, error) {
	if _, err := j.peek(); err != nil {
		return nil, err
	}
	j.capture, j.capturing, j.captureMax, j.overflow = j.capture[:0], true, max, false
	err := j.skip()
	j.capturing = false
	if err == nil && j.overflow {
		err = errCaptureFull
	}
	return j.capture, err
}
