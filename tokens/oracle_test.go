package tokens

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	tiktoken "github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

// tiktoken-go is the reference this package's own pre-tokenizer and BPE
// must agree with.
var (
	oracleOnce sync.Once
	oracles    map[string]*tiktoken.Tiktoken
)

func oracle(t testing.TB, name string) *tiktoken.Tiktoken {
	oracleOnce.Do(func() {
		tiktoken.SetBpeLoader(loader.NewOfflineLoader())
		oracles = map[string]*tiktoken.Tiktoken{}
		for _, n := range []string{O200KBase, CL100KBase} {
			enc, err := tiktoken.GetEncoding(n)
			if err != nil {
				panic(err)
			}
			oracles[n] = enc
		}
	})
	return oracles[name]
}

var oracleCases = []string{
	"",
	"hello world",
	"Hello, World! How's it going? I'LL be there; we've 12345 apples & 7 pears.",
	"  leading and trailing spaces   ",
	"tabs\tand\nnewlines\r\n\r\n  indented\n\n\nend\n",
	"unicode: café naïve Ελληνικά русский 中文字符 日本語のテキスト 한국어 עברית العربية",
	"emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇮🇹🇪🇸",
	"code: func main() { fmt.Println(\"hi\") }\n\tif x := y[0]; x != nil {\n\t\treturn\n\t}\n",
	"path/to/file.go // comment /* block */ http://example.com/a/b?c=d",
	"numbers 1 12 123 1234 12345678 3.14159 1,000,000 ١٢٣ ½ Ⅻ",
	"MixedCASE camelCase PascalCase SCREAMING_SNAKE kebab-case O'Reilly DON'T 'tis 'S",
	"marks: e\u0301 a\u0308 \u0301start n\u0303o",
	"<|endoftext|> special <|fim_prefix|>",
	strings.Repeat("ab", 3000),
	strings.Repeat("word ", 2000),
	strings.Repeat("x\n", 3000),
	"\x00\x01 control \x7f bytes",
	"invalid utf8 \xff\xfe here",
	"  \n \n  x",
	" \u00a0\u3000 unicode spaces\u2028line",
}

func TestMatchesTiktoken(t *testing.T) {
	for _, name := range []string{O200KBase, CL100KBase} {
		enc := newEncoding(name)
		ref := oracle(t, name)
		for _, text := range oracleCases {
			got, err := enc.Count(text, -1)
			if err != nil {
				t.Fatal(err)
			}
			if want := len(ref.EncodeOrdinary(text)); got != want {
				t.Errorf("%s: %q: %d tokens, tiktoken-go says %d", name, trunc(text), got, want)
			}
		}
	}
}

func trunc(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

func FuzzMatchesTiktoken(f *testing.F) {
	for _, c := range oracleCases {
		if len(c) < 500 {
			f.Add(c)
		}
	}
	encs := map[string]*Encoding{O200KBase: newEncoding(O200KBase), CL100KBase: newEncoding(CL100KBase)}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 256 || !utf8.ValidString(text) {
			// The oracle's backtracking regexp is cubic on long runs of
			// characters in both of o200k's letter classes (marks, Lo):
			// longer inputs hang it, not us. Invalid UTF-8 is compared in
			// TestMatchesTiktoken.
			return
		}
		for name, enc := range encs {
			got, _ := enc.Count(text, -1)
			if want := len(oracle(t, name).EncodeOrdinary(text)); got != want {
				t.Fatalf("%s: %q: %d tokens, tiktoken-go says %d", name, text, got, want)
			}
		}
	})
}

// The heap-ordered merge makes the same merges as tiktoken's loop.
func TestHeapMergeMatchesLoop(t *testing.T) {
	for _, name := range []string{O200KBase, CL100KBase} {
		e := newEncoding(name)
		if err := e.load(); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		alphabets := []string{"abcdefghij", "aeiou", "ab", "0123456789abcdef", "中文字符日本語", "ÀÉÎõü"}
		for i := 0; i < 300; i++ {
			a := []rune(alphabets[i%len(alphabets)])
			var b strings.Builder
			for b.Len() < 64+rng.IntN(700) {
				b.WriteRune(a[rng.IntN(len(a))])
			}
			piece := []byte(b.String())
			if h, l := e.bpeHeap(piece), e.bpeLoop(piece); h != l {
				t.Fatalf("%s: %q: heap %d, loop %d", name, piece, h, l)
			}
		}
	}
}

// BenchmarkCountVsTiktoken counts the same 100 KiB of prose with this
// package's encoder and with tiktoken-go, side by side, per encoding: the
// counter must stay at 30 MB/s or more and at least 8× tiktoken-go.
func BenchmarkCountVsTiktoken(b *testing.B) {
	const para = "The quarterly report, filed on 2024-03-31, shows revenue of $1,234,567 — up 12% year over year. " +
		"Nevertheless, the committee's concerns (see §4.2) remain: café supply costs rose, and naïve forecasts failed.\n"
	text := strings.Repeat(para, 100<<10/len(para)+1)[:100<<10]
	for _, name := range []string{O200KBase, CL100KBase} {
		enc := newEncoding(name)
		ref := oracle(b, name)
		enc.Count(text, -1) // load the ranks outside the timing
		ref.EncodeOrdinary(text)
		b.Run(name+"/ours", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				enc.Count(text, -1)
			}
		})
		b.Run(name+"/tiktoken-go", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				ref.EncodeOrdinary(text)
			}
		})
	}
}
