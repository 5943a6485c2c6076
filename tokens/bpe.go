package tokens

import (
	"fmt"
	"math"
	"sync"
	"unicode/utf8"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// Encoding is one of tiktoken's byte-pair encodings.
type Encoding struct {
	name  string
	file  string
	o200k bool // which pre-tokenizer: o200k_base's, else cl100k_base's
	once  sync.Once
	ranks *rankTable
	// longest is the longest token in bytes: a longer pair is never looked
	// up, which keeps merging long runs from hashing ever longer strings.
	longest int
	err     error
}

// Names of the encodings.
const (
	O200KBase  = "o200k_base"
	CL100KBase = "cl100k_base"
)

func newEncoding(name string) *Encoding {
	e := &Encoding{name: name, file: name + ".tiktoken"}
	e.o200k = name == O200KBase
	return e
}

// Name is the encoding's tiktoken name.
func (e *Encoding) Name() string { return e.name }

// load reads the merge ranks embedded by tiktoken-go-loader, once; nothing
// is downloaded.
func (e *Encoding) load() error {
	e.once.Do(func() {
		ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(e.file)
		if err != nil {
			e.err = fmt.Errorf("loading %s: %w", e.name, err)
			return
		}
		for tok := range ranks {
			e.longest = max(e.longest, len(tok))
		}
		e.ranks = newRankTable(ranks)
	})
	return e.err
}

// maxPiece bounds the bytes byte-pair encoded as one piece. A longer piece
// (a run of letters with no space, such as base64) is encoded in parts of
// this size: merges across a cut are lost, which can only add tokens.
const maxPiece = 2048

// heapMergeFrom is the piece length from which bpe uses the heap-ordered
// merge (n log n) instead of tiktoken's rescanning loop (n²), which is
// faster only for short pieces.
const heapMergeFrom = 64

// Count returns the tokens of text, stopping as soon as the count passes
// limit (pass a negative limit for no limit). The result is exact while it
// is at most limit; past it, it is a lower bound of the full count, still
// above limit.
func (e *Encoding) Count(text string, limit int) (int, error) {
	if err := e.load(); err != nil {
		return 0, err
	}
	return e.countBytes(bytesOf(text), limit), nil
}

// chunkBytes is how much text is pre-tokenized at a time. Chunks end only
// where every piece of both patterns ends whatever follows (see safeCut),
// so counting chunk by chunk is exact, the early stop is checked at least
// every chunk, and memory is bounded by the chunk, not the text.
const chunkBytes = 4096

var chunks = sync.Pool{New: func() any { return new([chunkBytes]rune) }}

// countBytes is Count on loaded ranks.
func (e *Encoding) countBytes(text []byte, limit int) int {
	// Most values are short: decode them into a small stack buffer, and
	// only longer text into a pooled chunk-sized one (a [4096]rune on the
	// stack would be zeroed, 16 KiB, for every role and name).
	var small [256]rune
	buf := small[:]
	if len(text) > len(small) {
		pb := chunks.Get().(*[chunkBytes]rune)
		defer chunks.Put(pb)
		buf = pb[:]
	}
	n := 0
	for len(text) > 0 {
		k := len(text)
		if k > chunkBytes {
			k = safeCut(text, chunkBytes)
		}
		t := buf[:0]
		for i := 0; i < k; { // invalid UTF-8 reads as U+FFFD
			r, size := utf8.DecodeRune(text[i:k])
			t = append(t, r)
			i += size
		}
		text = text[k:]
		for i := 0; i < len(t); {
			var j int
			if e.o200k { // a static call: buf stays on the stack
				j = runes(t).nextO200K(i)
			} else {
				j = runes(t).nextCL100K(i)
			}
			n += e.bpeRunes(t[i:j])
			if limit >= 0 && n > limit {
				return n
			}
			i = j
		}
	}
	return n
}

// safeCut returns a byte offset in s, at most max and as late as possible,
// where a piece ends in both patterns whatever follows: a space after a
// letter (a letter run ends there and the space starts the next piece), or
// a non-space after a newline (a newline run, or a punctuation run's
// newline tail, ends there). Without one in the second half of the window
// it cuts at a rune boundary, which may split a piece, as maxPiece does.
func safeCut(s []byte, max int) int {
	for k := max; k > max/2; k-- {
		c := s[k]
		if c == ' ' {
			r, _ := utf8.DecodeLastRune(s[:k])
			if isL(r) {
				return k
			}
		} else if s[k-1] == '\n' && !isS(rune(c)) && c < utf8.RuneSelf {
			return k
		}
	}
	for k := max; k > 0; k-- {
		if utf8.RuneStart(s[k]) {
			return k
		}
	}
	return max
}

// bpeRunes encodes one piece and returns its token count.
func (e *Encoding) bpeRunes(piece runes) int {
	var buf [256]byte
	b := buf[:0]
	for _, r := range piece {
		b = utf8.AppendRune(b, r)
	}
	n := 0
	for len(b) > maxPiece {
		n += e.bpe(b[:maxPiece])
		b = b[maxPiece:]
	}
	return n + e.bpe(b)
}

// bpe is tiktoken's byte-pair merge: repeatedly join the adjacent pair of
// parts whose concatenation has the lowest rank, until none is a token.
func (e *Encoding) bpe(piece []byte) int {
	if len(piece) == 0 {
		return 0
	}
	if _, ok := e.ranks.get(piece); ok || len(piece) == 1 {
		return 1
	}
	if len(piece) >= heapMergeFrom {
		return e.bpeHeap(piece)
	}
	return e.bpeLoop(piece)
}

// bpeLoop is tiktoken's merge loop, for short pieces.
func (e *Encoding) bpeLoop(piece []byte) int {
	type part struct{ start, rank int }
	var buf [64]part
	parts := buf[:0]
	for i := 0; i <= len(piece); i++ {
		parts = append(parts, part{i, math.MaxInt})
	}
	rank := func(i, skip int) int {
		if i+skip+2 < len(parts) && parts[i+skip+2].start-parts[i].start <= e.longest {
			if r, ok := e.ranks.get(piece[parts[i].start:parts[i+skip+2].start]); ok {
				return r
			}
		}
		return math.MaxInt
	}
	for i := 0; i < len(parts)-2; i++ {
		parts[i].rank = rank(i, 0)
	}
	for len(parts) > 1 {
		minRank, minIdx := math.MaxInt, -1
		for i := 0; i < len(parts)-1; i++ {
			if parts[i].rank < minRank {
				minRank, minIdx = parts[i].rank, i
			}
		}
		if minIdx < 0 {
			break
		}
		i := minIdx
		parts[i].rank = rank(i, 1)
		if i > 0 {
			parts[i-1].rank = rank(i-1, 1)
		}
		parts = append(parts[:i+1], parts[i+2:]...)
	}
	return len(parts) - 1
}

// bpeHeap is bpe for long pieces: the same merges in the same order (the
// lowest rank first, the leftmost among equals), found with a min-heap over
// a linked list of parts instead of a scan per merge. Heap entries made
// stale by a merge are recognised and dropped when popped.
func (e *Encoding) bpeHeap(piece []byte) int {
	n := len(piece)
	// Part i starts at byte i while alive; next/prev link the live parts.
	next := make([]int, n)
	prev := make([]int, n)
	alive := make([]bool, n)
	for i := range n {
		next[i], prev[i], alive[i] = i+1, i-1, true
	}
	next[n-1] = -1
	end := func(i int) int { // a part's end: the next live part's start
		if next[i] < 0 {
			return n
		}
		return next[i]
	}
	h := pairHeap{}
	push := func(i int) {
		if i < 0 || next[i] < 0 {
			return
		}
		if end(next[i])-i > e.longest {
			return
		}
		if r, ok := e.ranks.get(piece[i:end(next[i])]); ok {
			h.push(pair{rank: r, start: i, end: end(next[i])})
		}
	}
	for i := 0; i < n-1; i++ {
		push(i)
	}
	live := n
	for len(h) > 0 {
		p := h.pop()
		i := p.start
		if !alive[i] || next[i] < 0 || end(next[i]) != p.end {
			continue // stale: a neighbour merged since this pair was pushed
		}
		j := next[i] // merge j into i
		alive[j] = false
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		live--
		push(prev[i])
		push(i)
	}
	return live
}

type pair struct{ rank, start, end int }

// pairHeap is a binary min-heap by (rank, start).
type pairHeap []pair

func (p pair) less(q pair) bool { return p.rank < q.rank || p.rank == q.rank && p.start < q.start }

func (h *pairHeap) push(p pair) {
	*h = append(*h, p)
	a := *h
	for i := len(a) - 1; i > 0; {
		parent := (i - 1) / 2
		if !a[i].less(a[parent]) {
			break
		}
		a[i], a[parent] = a[parent], a[i]
		i = parent
	}
}

func (h *pairHeap) pop() pair {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].less(a[m]) {
			m = l
		}
		if r < len(a) && a[r].less(a[m]) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
