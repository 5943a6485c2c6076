package pdf

import (
	"bytes"
	"fmt"
	"strconv"
)

// Finding the encryption dictionary and the objects it applies to.

// openEncryption finds the encryption of the file, if any, and the keys
// that open it with the empty password (s.handlers). s.encrypted says
// whether the file names an encryption at all.
func (s *scan) openEncryption(b *budget) error {
	trailers := s.trailerDicts(b)
	for _, t := range trailers {
		if t["Encrypt"] != nil {
			s.encrypted = true
		}
	}
	if !s.encrypted {
		return b.check()
	}
	x := newObjIndex(s, b)
	var encs []dict
	seenEnc := map[string]bool{}
	ids := [][]byte{nil} // pdf.js reads a file without /ID with an empty id
	seenID := map[string]bool{"": true}
	truncated := false
	addEnc := func(v any) {
		d, ok := v.(dict)
		if !ok {
			return
		}
		// The entries that make the key (others may be large, and do not
		// matter).
		rel := dict{}
		for _, k := range []pdfName{"Filter", "V", "R", "Length", "O", "U", "OE", "UE", "Perms", "P", "EncryptMetadata", "StmF", "CF"} {
			if v, ok := d[k]; ok {
				if size(v, 0) > 256 {
					return // no encryption dictionary is that large
				}
				rel[k] = v
			}
		}
		d = rel
		k := fmt.Sprint(d)
		if seenEnc[k] {
			return
		}
		if len(encs) >= maxCandidates {
			truncated = true
			return
		}
		seenEnc[k] = true
		encs = append(encs, d)
	}
	// The newest first: a reader takes the last trailer of a damaged file.
	for i := len(trailers) - 1; i >= 0; i-- {
		t := trailers[i]
		switch e := t["Encrypt"].(type) {
		case dict:
			addEnc(e)
		case objref:
			for _, o := range x.lookup(e) {
				addEnc(o)
			}
		}
		if a, ok := x.deref(t["ID"]).(array); ok && len(a) > 0 {
			if id, ok := x.deref(a[0]).(string); ok && !seenID[id] {
				if len(ids) >= maxCandidates {
					truncated = true
				} else {
					seenID[id] = true
					ids = append(ids, []byte(id))
				}
			}
		}
		if err := b.check(); err != nil {
			return err
		}
	}
	seenH := map[string]bool{}
	for _, e := range encs {
		tries := ids
		if v, _ := jsNumber(x.deref(e["V"])); v == 5 {
			tries = ids[:1] // AES-256 keys do not depend on the id
		}
		for _, id := range tries {
			if err := b.check(); err != nil {
				return err
			}
			h := newHandler(e, id, x.deref)
			if h == nil || seenH[h.id()] {
				continue
			}
			seenH[h.id()] = true
			s.handlers = append(s.handlers, h)
			if len(s.handlers) > maxHandlers {
				b.over = true
				return errOver
			}
		}
	}
	if len(s.handlers) == 0 && truncated {
		// Too many candidates, none of those tried opens: a file built
		// to hide its key among decoys.
		b.over = true
		return errOver
	}
	return b.check()
}

// size counts the values in v, stopping past 256.
func size(v any, n int) int {
	switch v := v.(type) {
	case array:
		for _, e := range v {
			if n = size(e, n+1); n > 256 {
				break
			}
		}
	case dict:
		for _, e := range v {
			if n = size(e, n+1); n > 256 {
				break
			}
		}
	case string:
		n += len(v) / 64
	}
	return n
}

// trailerDicts returns the dictionaries that may be the trailer: those
// after a `trailer` keyword, and those of cross-reference streams; the
// last maxTrailers of each.
func (s *scan) trailerDicts(b *budget) []dict {
	var out []dict
	var offs []int
	for i := 0; ; {
		k := bytes.Index(s.data[i:], []byte("trailer"))
		if k < 0 {
			break
		}
		offs = append(offs, i+k+7)
		if len(offs) > maxTrailers {
			offs = offs[1:]
		}
		i += k + 7
	}
	work := 1 << 20
	for _, off := range offs {
		if b.check() != nil {
			break
		}
		lx := newLexer(s.data, off)
		lx.lenient, lx.allowStream, lx.work = true, false, &work
		if d, err := parse(func() dict {
			d, ok := lx.readObject().(dict)
			if !ok {
				lx.fail()
			}
			return d
		}); err == nil {
			out = append(out, d)
		}
		work = max(work, 1<<16)
	}
	return append(out, s.xrefDicts...)
}

// objIndex finds objects by number for the encryption search: in the file
// (every `N G obj`, the last first) and in the object streams the scan
// decoded without a key.
type objIndex struct {
	s      *scan
	b      *budget
	direct map[int][]int // object number → offsets of its `N G obj`, last first
	found  map[int][]any // object number → the objects lookup found
	work   int           // bytes the lexers may still read, for all lookups
}

func newObjIndex(s *scan, b *budget) *objIndex {
	return &objIndex{s: s, b: b, direct: map[int][]int{}, found: map[int][]any{}, work: len(s.data) + 1<<20}
}

// lookup returns the objects numbered ref.id (of any generation, as a
// reader rebuilding a damaged file might take), newest first.
func (x *objIndex) lookup(ref objref) []any {
	num := int(ref.id)
	if out, ok := x.found[num]; ok {
		return out
	}
	if len(x.found) >= 1024 || x.b.check() != nil {
		return nil
	}
	out := x.find(num)
	x.found[num] = out
	return out
}

func (x *objIndex) find(num int) []any {
	offs, ok := x.direct[num]
	if !ok {
		offs = findObjects(x.s.data, num, x.b)
		x.direct[num] = offs
	}
	var out []any
	for _, off := range offs {
		if len(out) >= maxObjTries || x.work <= 0 {
			return out
		}
		lx := newLexer(x.s.data, off)
		lx.lenient, lx.allowStream, lx.work = true, false, &x.work
		if d, err := parse(func() objdef {
			d, ok := lx.readObject().(objdef)
			if !ok {
				lx.fail()
			}
			return d
		}); err == nil && int(d.ref.id) == num {
			out = append(out, d.obj)
		}
	}
	for i := len(x.s.streams) - 1; i >= 0 && len(out) < maxObjTries; i-- {
		st := &x.s.streams[i]
		if st.class != classObjects || x.b.check() != nil {
			continue
		}
		for _, v := range st.vars {
			if o, ok := inObjectStream(v.data, st.n, st.first, num, &x.work); ok {
				out = append(out, o)
			}
		}
	}
	return out
}

// deref resolves an indirect value to its newest object (nil if none).
func (x *objIndex) deref(v any) any {
	if r, ok := v.(objref); ok {
		if objs := x.lookup(r); len(objs) > 0 {
			return objs[0]
		}
		return nil
	}
	return v
}

// findObjects returns the offsets of every `num G obj` in data, last first.
func findObjects(data []byte, num int, b *budget) []int {
	var out []int
	for i := 0; ; {
		if b.tick() != nil {
			return out
		}
		k := bytes.Index(data[i:], []byte("obj"))
		if k < 0 {
			break
		}
		p := i + k
		i = p + 3
		if p+3 < len(data) && !isSpace(data[p+3]) && !isDelim(data[p+3]) {
			continue
		}
		if n, start := objNumAt(data, p); n == num {
			out = append(out, start)
		}
	}
	for l, r := 0, len(out)-1; l < r; l, r = l+1, r-1 {
		out[l], out[r] = out[r], out[l]
	}
	return out
}

// objNumAt reads the "N G" before the `obj` keyword at p: N, and where N
// starts (-1 if there is none).
func objNumAt(data []byte, p int) (int, int) {
	j := p
	var nums [2]int
	for n := 1; n >= 0; n-- {
		e := j
		for j > 0 && isSpace(data[j-1]) {
			j--
		}
		if j == e {
			return -1, -1
		}
		e = j
		for j > 0 && isDigit(data[j-1]) && e-j < 10 {
			j--
		}
		if j == e {
			return -1, -1
		}
		v, _ := strconv.Atoi(string(data[j:e]))
		nums[n] = v
	}
	return nums[0], j
}

// inObjectStream parses object num of an object stream's decoded data.
func inObjectStream(data []byte, n, first, num int, work *int) (any, bool) {
	i := 0
	for k := 0; k < n && k < 1<<16 && *work > 0; k++ {
		var tok [2][]byte
		from := i
		for t := range tok {
			i = skipSpace(data, i)
			j := i
			for j < len(data) && isDigit(data[j]) {
				j++
			}
			tok[t], i = data[i:j], j
		}
		*work -= i - from
		if len(tok[0]) == 0 || len(tok[1]) == 0 {
			return nil, false
		}
		id, err1 := strconv.Atoi(string(tok[0]))
		off, err2 := strconv.Atoi(string(tok[1]))
		if err1 != nil || err2 != nil {
			return nil, false
		}
		if id != num {
			continue
		}
		at := first + off
		if at < 0 || at >= len(data) {
			return nil, false
		}
		lx := newLexer(data, at)
		lx.lenient, lx.allowStream, lx.allowObjptr, lx.work = true, false, true, work
		o, err := parse(lx.readObject)
		return o, err == nil
	}
	return nil, false
}
