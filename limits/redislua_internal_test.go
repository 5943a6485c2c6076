package limits

import (
	"strings"
	"testing"
)

// The two scripts share their sliding-window code (the layout of a
// window's keys and how it is read, expired, placed and written) and
// their token-bucket state's: each is copied between "-- NAME begin" and
// "-- NAME end", and must stay the same in both.
func TestScriptsShareTheirCode(t *testing.T) {
	for _, name := range []string{"window", "bucket"} {
		block := func(script, src string) string {
			_, rest, ok1 := strings.Cut(src, "-- "+name+" begin\n")
			body, _, ok2 := strings.Cut(rest, "-- "+name+" end\n")
			if !ok1 || !ok2 || len(body) < 200 {
				t.Fatalf("%s: no %s block", script, name)
			}
			return body
		}
		d, s := block("redis.lua", decideScript), block("settle.lua", settleScript)
		if d == s {
			continue
		}
		dl, sl := strings.Split(d, "\n"), strings.Split(s, "\n")
		for i := range min(len(dl), len(sl)) {
			if dl[i] != sl[i] {
				t.Fatalf("the %s code differs at its line %d:\nredis.lua:  %s\nsettle.lua: %s", name, i+1, dl[i], sl[i])
			}
		}
		t.Fatalf("the %s code differs in length: %d and %d lines", name, len(dl), len(sl))
	}
}
