package tokens

import (
	"testing"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// TestRankTableIsTheMap: every token of both encodings has its rank in the
// table, and strings that are no token (a token with a byte more, or one
// changed) are not found.
func TestRankTableIsTheMap(t *testing.T) {
	for _, name := range []string{O200KBase, CL100KBase} {
		ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(name + ".tiktoken")
		if err != nil {
			t.Fatal(err)
		}
		tab := newRankTable(ranks)
		found := 0
		for _, s := range tab.slots {
			if s.n != 0 {
				found++
			}
		}
		if found != len(ranks) {
			t.Fatalf("%s: %d tokens in the table, %d in the file", name, found, len(ranks))
		}
		for tok, r := range ranks {
			if got, ok := tab.get([]byte(tok)); !ok || got != r {
				t.Fatalf("%s: %q has rank %d, the table says %d %v", name, tok, r, got, ok)
			}
			longer := []byte(tok + "\x00\xff")
			if _, inMap := ranks[string(longer)]; !inMap {
				if _, ok := tab.get(longer); ok {
					t.Fatalf("%s: %q found, and is no token", name, longer)
				}
			}
		}
		if _, ok := tab.get(nil); ok {
			t.Fatalf("%s: the empty string found", name)
		}
	}
}
