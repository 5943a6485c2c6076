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
	ranks map[string]int
	err   error
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
		e.ranks, e.err = loader.NewOfflineLoader().LoadTiktokenBpe(e.file)
		if e.err != nil {
			e.err = fmt.Errorf("loading %s: %w", e.name, e.err)
		}
	})
	return e.err
}

// maxPiece bounds the bytes byte-pair encoded as one piece. A longer piece
// (a run of letters with no space, such as base64) is encoded in parts of
// this size: merges across a cut are lost, which can only add tokens, and
// the quadratic merge loop stays bounded.
const maxPiece = 2048

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

// countBytes is Count on loaded ranks.
func (e *Encoding) countBytes(text []byte, limit int) int {
	var buf [chunkBytes]rune
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
	if _, ok := e.ranks[string(piece)]; ok || len(piece) == 1 {
		return 1
	}
	type part struct{ start, rank int }
	var buf [64]part
	parts := buf[:0]
	for i := 0; i <= len(piece); i++ {
		parts = append(parts, part{i, math.MaxInt})
	}
	rank := func(i, skip int) int {
		if i+skip+2 < len(parts) {
			if r, ok := e.ranks[string(piece[parts[i].start:parts[i+skip+2].start])]; ok {
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
