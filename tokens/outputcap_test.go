package tokens_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

func TestCapOutput(t *testing.T) {
	for _, c := range []struct {
		in, want string
		changed  bool
	}{
		{`{"model":"m","max_tokens":5000}`, `{"model":"m","max_tokens":100}`, true},
		{`{"model":"m","max_tokens":50}`, `{"model":"m","max_tokens":50}`, false},
		{`{"model":"m","max_tokens":100}`, `{"model":"m","max_tokens":100}`, false},
		{`{"model":"m"}`, `{"model":"m","max_tokens":100}`, true},
		{`{}`, `{"max_tokens":100}`, true},
		{" {\n \"model\" : \"m\" ,\n \"max_tokens\" :\t5000 \n} \n", " {\n \"model\" : \"m\" ,\n \"max_tokens\" :\t100 \n} \n", true},
		{"{\"model\":\"m\"\n}", "{\"model\":\"m\"\n,\"max_tokens\":100}", true},
		// Disguised names: escapes and Unicode folding (K is the Kelvin sign).
		{`{"max\u005ftokens":5000}`, `{"max\u005ftokens":100}`, true},
		{`{"MAX_TOKENS":5000}`, `{"MAX_TOKENS":100}`, true},
		{`{"max_to` + "\u212a" + `ens":5000}`, `{"max_to` + "\u212a" + `ens":100}`, true},
		{`{"max_output_tokenſ":5000}`, `{"max_output_tokenſ":100}`, true},
		// Numbers in every dress: kept only from 1 to the cap.
		{`{"max_tokens":1e3}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":1e1}`, `{"max_tokens":1e1}`, false},
		{`{"max_tokens":100.0}`, `{"max_tokens":100.0}`, false},
		{`{"max_tokens":100.5}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":-1}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":0}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":0.5}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":1e400}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":99999999999999999999999999}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":"50"}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":null}`, `{"max_tokens":100}`, true},
		{`{"max_tokens":{"a":1}}`, `{"max_tokens":100}`, true},
		// Every copy and every cap member is capped.
		{`{"max_tokens":5000,"max_completion_tokens":7,"Max_Tokens":300}`, `{"max_tokens":100,"max_completion_tokens":7,"Max_Tokens":100}`, true},
		// A nested member of the same name is not the cap: a cap is added.
		{`{"options":{"max_tokens":5000},"metadata":{"max_tokens":"x"}}`, `{"options":{"max_tokens":5000},"metadata":{"max_tokens":"x"},"max_tokens":100}`, true},
		{`{"messages":[{"max_tokens":5000}]}`, `{"messages":[{"max_tokens":5000}],"max_tokens":100}`, true},
	} {
		got, changed, err := tokens.CapOutput([]byte(c.in), "max_tokens", 100)
		if err != nil || string(got) != c.want || changed != c.changed {
			t.Errorf("%s: got %s %v %v, want %s %v", c.in, got, changed, err, c.want, c.changed)
		}
		if !json.Valid(got) {
			t.Errorf("%s: %s is not JSON", c.in, got)
		}
	}
	for _, bad := range []string{``, `[]`, `{"a":1`, `{"a":1} {}`, `{"a":1}x`, `"max_tokens"`, `{"max_tokens":}`} {
		if _, _, err := tokens.CapOutput([]byte(bad), "max_tokens", 100); err == nil || tokens.Editable([]byte(bad)) {
			t.Errorf("%q: edited", bad)
		}
	}
	// The input is not written to (it may be a read-only mapping).
	in := []byte(`{"max_tokens":5000}`)
	tokens.CapOutput(in, "max_tokens", 1)
	if string(in) != `{"max_tokens":5000}` {
		t.Fatalf("input changed: %s", in)
	}
}

// FuzzCapOutput: for any JSON object, the capped body is JSON, every
// top-level cap member (in any spelling) holds a number from 1 to the
// cap, there is at least one, and every other byte is the original's.
func FuzzCapOutput(f *testing.F) {
	for _, s := range []string{`{"model":"m","max_tokens":5000}`, `{"max\u005ftokens":1e3,"n":2}`, `{}`, ` { "a" : [1,{"max_tokens":9}] } `,
		`{"max_tokens":-1,"MAX_COMPLETION_TOKENS":"7","max_output_tokens":100.0}`, `{"max_tokens":1,"max_tokens":2}`} {
		f.Add([]byte(s), int64(100))
	}
	f.Fuzz(func(t *testing.T, body []byte, limit int64) {
		if limit < 1 || limit > 1<<50 || !json.Valid(body) || !tokens.Editable(body) {
			return
		}
		orig := append([]byte(nil), body...)
		out, changed, err := tokens.CapOutput(body, "max_tokens", limit)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if !bytes.Equal(body, orig) {
			t.Fatal("the input was written to")
		}
		if !json.Valid(out) {
			t.Fatalf("%s capped to %s: not JSON", body, out)
		}
		if changed == bytes.Equal(out, body) {
			t.Fatalf("changed %v for %s -> %s", changed, body, out)
		}
		a, b := capMembers(t, body), capMembers(t, out)
		if len(b) != len(a) && len(b) != len(a)+1 {
			t.Fatalf("%d members became %d", len(a), len(b))
		}
		caps := 0
		for i := range b {
			if b[i].cap {
				caps++
				v, err := strconv.ParseFloat(string(b[i].value), 64)
				if err != nil || v < 1 || v > float64(limit) || !json.Valid([]byte(b[i].value)) {
					t.Fatalf("%s -> %s: cap %s over %d", body, out, b[i].value, limit)
				}
			}
			if i == len(a) {
				if sep := strings.TrimSpace(b[i].before); !b[i].cap || sep != "," && (sep != "" || i > 0) {
					t.Fatalf("%s -> %s: added %+v", body, out, b[i])
				}
				continue
			}
			if a[i].name != b[i].name || a[i].before != b[i].before || !a[i].cap && a[i].value != b[i].value {
				t.Fatalf("%s -> %s: member %d %+v became %+v", body, out, i, a[i], b[i])
			}
		}
		if caps == 0 {
			t.Fatalf("%s -> %s: no cap", body, out)
		}
	})
}

type capMember struct {
	name, before, value string // raw name, the bytes between the previous value and the name, the raw value
	cap                 bool
}

func capMembers(t *testing.T, b []byte) []capMember {
	var ms []capMember
	o := jsonscan.OpenObject(b, 0)
	prev := jsonscan.SkipSpace(b, 0) + 1
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		c := false
		probe, changed, _ := tokens.CapOutput([]byte(`{"`+string(m.Key)+`":0}`), "x", 1)
		c = changed && !bytes.Contains(probe, []byte(`"x"`))
		ms = append(ms, capMember{name: string(m.Key), before: string(b[prev:m.KS]), value: string(b[m.VS:m.VE]), cap: c})
		prev = m.VE
	}
	if o.Bad {
		t.Fatalf("%s: not an object", b)
	}
	return ms
}
