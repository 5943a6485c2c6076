package pdf

import (
	"errors"
	"strconv"
)

// Object streams: checked before the library may decode them.

// checkObjectStreams checks every object stream an xref entry points into.
func (c *checker) checkObjectStreams(table []xentry) error {
	checked := map[uint32]bool{}
	for _, e := range table {
		if !e.inStream || checked[e.stream.id] {
			continue
		}
		checked[e.stream.id] = true
		if err := c.checkObjectStream(table, e.stream.id); err != nil {
			return err
		}
	}
	return nil
}

func (c *checker) checkObjectStream(table []xentry, id uint32) error {
	if int(id) >= len(table) {
		return nil // resolves to null: the library panics, harmlessly
	}
	xs := table[id]
	if xs.ptr != (objref{id, 0}) {
		return nil
	}
	if xs.inStream {
		return errNoLibrary // an object stream inside an object stream: unbounded recursion
	}
	if xs.offset == 0 {
		return nil
	}
	def, err := c.objectAt(xs.offset)
	if errors.Is(err, errOver) {
		return err
	}
	if err != nil || def.ref != (objref{id, 0}) {
		return nil
	}
	strm, ok := def.obj.(streamObj)
	if !ok {
		return nil
	}
	for _, k := range []pdfName{"Type", "N", "First", "Filter", "DecodeParms"} {
		if hasRef(strm.hdr[k], 0) {
			return errNoLibrary
		}
	}
	if strm.hdr["Extends"] != nil {
		return errNoLibrary
	}
	length := strm.hdr["Length"]
	if r, ok := length.(objref); ok {
		length = nil
		if int(r.id) < len(table) && table[r.id].ptr == r {
			t := table[r.id]
			if t.inStream {
				return errNoLibrary
			}
			if t.offset != 0 {
				d, err := c.objectAt(t.offset)
				if errors.Is(err, errOver) {
					return err
				}
				if err != nil || d.ref != r {
					return nil
				}
				length = d.obj
			}
		}
	}
	chain, err := libFilters(strm.hdr, func(v any) any { return v })
	if err != nil {
		return nil
	}
	data, clean, err := c.streamDataEOF(strm, length, chain)
	if errors.Is(err, errOver) || errors.Is(err, errNoLibrary) {
		return err
	}
	if err != nil {
		return nil
	}
	if n, _ := strm.hdr["N"].(int64); n > int64(len(data)/4+1) {
		return errNoLibrary
	}
	if clean && lastHexOpen(data) {
		return errNoLibrary
	}
	first, _ := strm.hdr["First"].(int64)
	if !objectStreamSane(data, strm.hdr["N"], first) {
		return errNoLibrary
	}
	return nil
}

// objectStreamSane reads an object stream's index: it must not list an
// object twice (the library takes the first; other readers take the one
// the xref names, which may be the other, and could then read a page the
// library does not), and no object in it may be too large to parse.
func objectStreamSane(data []byte, n any, first int64) bool {
	count, _ := n.(int64)
	seen := map[int64]bool{}
	i := 0
	for k := int64(0); k < count; k++ {
		var tok [2][]byte
		for t := range tok {
			i = skipSpace(data, i)
			j := i
			for j < len(data) && !isSpace(data[j]) && !isDelim(data[j]) {
				j++
			}
			tok[t], i = data[i:j], j
		}
		if len(tok[0]) == 0 {
			return true
		}
		id, err1 := strconv.ParseInt(string(tok[0]), 10, 64)
		off, err2 := strconv.ParseInt(string(tok[1]), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if seen[id] {
			return false
		}
		seen[id] = true
		if at := first + off; at >= 0 && at < int64(len(data)) {
			if tokens, _ := skimObject(data, int(at), 0); tokens > maxObjectTokens {
				return false
			}
		}
	}
	return true
}

// hasRef reports whether v holds an indirect reference.
func hasRef(v any, depth int) bool {
	if depth > 8 {
		return true
	}
	switch v := v.(type) {
	case objref:
		return true
	case array:
		for _, e := range v {
			if hasRef(e, depth+1) {
				return true
			}
		}
	case dict:
		for _, e := range v {
			if hasRef(e, depth+1) {
				return true
			}
		}
	}
	return false
}

// lastHexOpen reports whether a hex string could be open at the end of data:
// the library's lexer, reading an object stream, loops for ever on one.
func lastHexOpen(data []byte) bool {
	for i := len(data) - 1; i >= 0; i-- {
		c := data[i]
		if isSpace(c) || unhex(c) >= 0 {
			continue
		}
		return c == '<'
	}
	return false
}
