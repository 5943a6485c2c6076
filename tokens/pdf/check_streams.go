package pdf

import (
	"errors"
)

// Stream data as the library would read it, decoded under the budget.

// readStreamData mirrors the library's readXrefStreamData.
func (c *checker) readStreamData(strm streamObj, size int64) error {
	index, _ := strm.hdr["Index"].(array)
	if index == nil {
		index = array{int64(0), size}
	}
	if len(index)%2 != 0 {
		return errSyntax
	}
	ww, ok := strm.hdr["W"].(array)
	if !ok {
		return errSyntax
	}
	var w []int
	wtotal := 0
	for _, x := range ww {
		i, ok := x.(int64)
		if !ok || int64(int(i)) != i {
			return errSyntax
		}
		if i < 0 {
			return errSyntax // the library slices buf[:negative] and panics
		}
		if i > 16 || len(w) >= 16 {
			return errNoLibrary
		}
		w = append(w, int(i))
		wtotal += int(i)
	}
	if len(w) < 3 {
		return errSyntax
	}
	if wtotal == 0 {
		return errNoLibrary // rows of no bytes: the library never reaches the end
	}
	chain, err := libFilters(strm.hdr, derefNull)
	if err != nil {
		return err
	}
	data, err := c.streamData(strm, derefNull(strm.hdr["Length"]), chain)
	if err != nil {
		return err
	}
	for len(index) > 0 {
		start, ok1 := index[0].(int64)
		n, ok2 := index[1].(int64)
		if !ok1 || !ok2 {
			return errSyntax
		}
		index = index[2:]
		for i := 0; i < int(n); i++ {
			if len(data) < wtotal {
				return errSyntax
			}
			row := data[:wtotal]
			data = data[wtotal:]
			v1 := decodeInt(row[0:w[0]])
			if w[0] == 0 {
				v1 = 1
			}
			v2 := decodeInt(row[w[0] : w[0]+w[1]])
			v3 := decodeInt(row[w[0]+w[1] : w[0]+w[1]+w[2]])
			if len(c.ents) >= 2*c.limit {
				return errNoLibrary
			}
			c.ents = append(c.ents, rawEntry{x: int(start) + i, kind: int64(v1), a: int64(v2), b: int64(v3)})
		}
	}
	return nil
}

func decodeInt(b []byte) int {
	x := 0
	for _, c := range b {
		x = x<<8 | int(c)
	}
	return x
}

// libFilters reads a stream dictionary's filter chain as Value.Reader does;
// deref maps each value as Value.Key would resolve it.
func libFilters(hdr dict, deref func(any) any) ([]filter, error) {
	parms := deref(hdr["DecodeParms"])
	switch f := deref(hdr["Filter"]).(type) {
	case nil:
		return nil, nil
	case pdfName:
		return []filter{{string(f), derefDict(parms, deref)}}, nil
	case array:
		chain := make([]filter, 0, len(f))
		pa, _ := parms.(array)
		for i, e := range f {
			n, ok := deref(e).(pdfName)
			if !ok {
				return nil, errSyntax // applyFilter("") panics
			}
			var p any
			if i < len(pa) {
				p = derefDict(deref(pa[i]), deref)
			}
			chain = append(chain, filter{string(n), p})
		}
		return chain, nil
	default:
		return nil, errSyntax
	}
}

// derefDict applies deref to a parameter dictionary's values.
func derefDict(v any, deref func(any) any) any {
	d, ok := v.(dict)
	if !ok {
		return v
	}
	out := make(dict, len(d))
	for k, x := range d {
		out[k] = deref(x)
	}
	return out
}

// streamData returns what the library reads from strm with the given
// /Length value, under the budget.
func (c *checker) streamData(strm streamObj, length any, chain []filter) ([]byte, error) {
	data, _, err := c.streamDataEOF(strm, length, chain)
	return data, err
}

func (c *checker) streamDataEOF(strm streamObj, length any, chain []filter) ([]byte, bool, error) {
	n, _ := length.(int64)
	if n == 0 {
		return nil, true, nil // the library skips the filters of an empty stream
	}
	raw := []byte{}
	if n > 0 {
		end := strm.offset + n
		if end > int64(len(c.view)) || end < 0 {
			end = int64(len(c.view))
		}
		raw = c.view[strm.offset:end]
	}
	for _, f := range chain {
		if p, ok := f.parms.(dict); ok {
			if cols, ok := p["Columns"].(int64); ok && cols > maxColumns && p["Predictor"] != nil {
				return nil, false, errNoLibrary
			}
		}
	}
	out, clean, err := libChain(raw, chain, c.b)
	if errors.Is(err, errOver) {
		return nil, false, errOver
	}
	if err != nil {
		return nil, false, errSyntax
	}
	return out, clean, nil
}
