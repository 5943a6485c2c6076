package jsonscan_test

import (
	"encoding/json"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

func TestObjectMembers(t *testing.T) {
	b := []byte(` {"a": 1, "b" : {"c":[1,2,{"d":"}"}]}, "e":"x\"y" } tail`)
	o := jsonscan.OpenObject(b, 0)
	var keys []string
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		keys = append(keys, string(m.Key))
		if m.Truncated {
			t.Fatalf("%s truncated", m.Key)
		}
	}
	if o.Bad || len(keys) != 3 || keys[1] != "b" || string(b[o.Closing()]) != "}" {
		t.Fatalf("keys %v bad %v closing %d", keys, o.Bad, o.Closing())
	}
	if v := jsonscan.Lookup(b, "e"); string(v) != `"x\"y"` {
		t.Fatalf("e = %s", v)
	}
	if v := jsonscan.LastObject(b, `"b"`); string(v) != `{"c":[1,2,{"d":"}"}]}` {
		t.Fatalf("last b = %s", v)
	}
	cut := b[:20]
	o = jsonscan.OpenObject(cut, 0)
	for _, ok := o.Next(); ok; _, ok = o.Next() {
	}
	if !o.Bad || o.Closing() != -1 {
		t.Fatal("a cut object reads as whole")
	}
}

// FuzzScan: every walk ends, every offset lies inside the input, and on
// valid JSON objects the members are encoding/json's.
func FuzzScan(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":[1,{"b":"c"}],"d":null}`, `[1,2`, `{"a":"\"}"}`, `{`, `"x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		o := jsonscan.OpenObject(b, 0)
		n := 0
		for m, ok := o.Next(); ok; m, ok = o.Next() {
			if m.KS < 0 || m.VS < m.KS || m.VE < m.VS || m.VE > len(b) {
				t.Fatalf("offsets %+v in %d bytes", m, len(b))
			}
			if n++; n > len(b) {
				t.Fatal("more members than bytes")
			}
		}
		a := jsonscan.OpenArray(b)
		for e, ok := a.Next(); ok; e, ok = a.Next() {
			if len(e) == 0 {
				t.Fatal("an empty element")
			}
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) == nil && !o.Bad {
			o := jsonscan.OpenObject(b, 0)
			count := 0
			for mem, ok := o.Next(); ok; mem, ok = o.Next() {
				count++
				_ = mem
			}
			if count < len(m) {
				t.Fatalf("%d members, encoding/json reads %d", count, len(m))
			}
		}
		jsonscan.Whole(b)
		jsonscan.LastObject(b, `"usage"`)
		jsonscan.LastNumber(b, `"total_tokens"`)
	})
}

func TestAppendEscape(t *testing.T) {
	for _, c := range []struct {
		in, want string
		n        int
		ok       bool
	}{
		{`\n`, "\n", 2, true}, {`\/x`, "/", 2, true}, {`\u00e9`, "é", 6, true},
		{`\ud83d\ude00`, "😀", 12, true}, {`\ud83d`, "\uFFFD", 6, true}, {`\ud83d\u0041`, "\uFFFD", 6, true},
		{`\ude00\ud83d`, "\uFFFD", 6, true}, {`\q`, "q", 2, false}, {`\u12x4`, "\uFFFD", 2, false}, {`\`, "", 1, false},
	} {
		out, n, ok := jsonscan.AppendEscape(nil, []byte(c.in))
		if string(out) != c.want || n != c.n || ok != c.ok {
			t.Errorf("%s: %q %d %v, want %q %d %v", c.in, out, n, ok, c.want, c.n, c.ok)
		}
	}
}
