package tokens

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzJSONReader holds the validating reader to encoding/json: on valid
// UTF-8 within its depth, it accepts exactly what json.Valid accepts, and
// a string's pieces are json.Unmarshal's string, escapes decoded.
func FuzzJSONReader(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,-2.5e+3,true,false,null,"x\u00e9\ud83d\ude00\n"]}`, `"\ud800"`, `"\ud800\u0041"`, `"\udc00\ud800"`,
		`"a\/b\\\""`, `[1,]`, `{"a" 1}`, `01`, `-`, `1.`, `1e`, `"\x"`, `"\u12"`, `"` + strings.Repeat("é", 300) + `"`,
		`[` + strings.Repeat(`"\u4e2d"`+",", 200) + `0]`, " \t\n[]", `{"a":1}x`, `nul`, `"a` + "\x01" + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || strings.Count(s, "[")+strings.Count(s, "{") > maxDepth {
			return
		}
		j := newJSONReader([]byte(s))
		err := j.skip()
		if err == nil {
			err = j.end()
		}
		if got, want := err == nil, json.Valid([]byte(s)); got != want {
			t.Fatalf("%q: reader accepts %v, json.Valid %v (%v)", s, got, want, err)
		}
		var want string
		if json.Unmarshal([]byte(s), &want) != nil {
			return
		}
		var got []byte
		j = newJSONReader([]byte(s))
		if err := j.str(func(p []byte) error { got = append(got, p...); return nil }); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if string(got) != want {
			t.Fatalf("%q: read %q, json.Unmarshal %q", s, got, want)
		}
	})
}
