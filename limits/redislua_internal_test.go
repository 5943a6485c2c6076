package limits

import (
	"strings"
	"testing"
)

// The two scripts share their sliding-window code (the layout of a
// window's keys and how it is read, expired, placed and written): it is
// copied between "-- window begin" and "-- window end", and must stay the
// same in both.
func TestScriptsShareTheWindowCode(t *testing.T) {
	block := func(name, src string) string {
		_, rest, ok1 := strings.Cut(src, "-- window begin\n")
		body, _, ok2 := strings.Cut(rest, "-- window end\n")
		if !ok1 || !ok2 || len(body) < 1000 {
			t.Fatalf("%s: no window block", name)
		}
		return body
	}
	d, s := block("redis.lua", decideScript), block("settle.lua", settleScript)
	if d != s {
		dl, sl := strings.Split(d, "\n"), strings.Split(s, "\n")
		for i := range min(len(dl), len(sl)) {
			if dl[i] != sl[i] {
				t.Fatalf("the window code differs at its line %d:\nredis.lua:  %s\nsettle.lua: %s", i+1, dl[i], sl[i])
			}
		}
		t.Fatalf("the window code differs in length: %d and %d lines", len(dl), len(sl))
	}
}
