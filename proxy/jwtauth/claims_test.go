package jwtauth_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy/jwtauth"
)

// claimsOf decodes a payload as Verify does: numbers as json.Number.
func claimsOf(t *testing.T, payload string) jwtauth.Claims {
	t.Helper()
	dec := json.NewDecoder(bytes.NewBufferString(payload))
	dec.UseNumber()
	var c jwtauth.Claims
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClaimsValue(t *testing.T) {
	c := claimsOf(t, `{
		"sub": "user-1",
		"empty": "",
		"int": 1000000,
		"big": 123456789012345678901234567890,
		"neg": -42,
		"float": 0.25,
		"exp_form": 1e3,
		"yes": true,
		"no": false,
		"nothing": null,
		"list": ["a"],
		"obj": {"plan": "pro", "seats": 5, "deep": {"x": true}, "list": [1]},
		"https://example.com/plan": "enterprise",
		"https://example": {"com/plan": "nested"},
		"a.b": "literal",
		"a": {"b": "nested"}
	}`)
	cases := []struct {
		name string
		want string
		ok   bool
	}{
		{"sub", "user-1", true},
		{"empty", "", true},
		{"int", "1000000", true},
		{"big", "123456789012345678901234567890", true},
		{"neg", "-42", true},
		{"float", "0.25", true},
		{"exp_form", "1e3", true}, // as written
		{"yes", "true", true},
		{"no", "false", true},
		{"nothing", "", false},
		{"list", "", false},
		{"obj", "", false},
		{"missing", "", false},
		{"obj.plan", "pro", true},
		{"obj.seats", "5", true},
		{"obj.deep.x", "true", true},
		{"obj.deep", "", false},
		{"obj.list", "", false},
		{"obj.missing", "", false},
		{"sub.x", "", false}, // into a string
		{"obj.", "", false},
		{".obj", "", false},
		{"https://example.com/plan", "enterprise", true}, // the literal name wins
		{"a.b", "literal", true},
		{"", "", false},
	}
	for _, tc := range cases {
		got, ok := c.Value(tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Value(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	// Claims built by hand with float64 numbers never print an exponent.
	hand := jwtauth.Claims{"n": float64(1000000), "f": 2.5}
	if got, _ := hand.Value("n"); got != "1000000" {
		t.Errorf("float64 1e6 = %q", got)
	}
	if got, _ := hand.Value("f"); got != "2.5" {
		t.Errorf("float64 2.5 = %q", got)
	}
}

func TestClaimsSubject(t *testing.T) {
	c := claimsOf(t, `{"sub": "alice", "empty": "", "num": 7, "obj": {"id": "bob"}}`)
	for name, want := range map[string]string{"sub": "alice", "num": "7", "obj.id": "bob"} {
		if got, ok := c.Subject(name); !ok || got != want {
			t.Errorf("Subject(%q) = %q, %v", name, got, ok)
		}
	}
	for _, name := range []string{"empty", "missing", "obj"} {
		if got, ok := c.Subject(name); ok {
			t.Errorf("Subject(%q) = %q", name, got)
		}
	}
}

func TestShaped(t *testing.T) {
	const h = "eyJhbGciOiJIUzI1NiJ9" // {"alg":"HS256"}
	yes := []string{
		"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
		"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk",
		"e30..", // {}
		h + ".b.c==",
		h + ".b.c.",
		h + ".b.c.d",
		h + ".b.c d\n",
		h + "==.b.c",                // padded header
		"eyJhbGciOi JIUzI1NiJ9.b.c", // a space PyJWT and Node skip
		"eyJhbGciOiJIUzI1NiJ9\r\n.b.c",
	}
	no := []string{
		"",
		"sk-proj-abc",
		"sk-ant-api03-abc",
		"abc",
		"a.b",
		h + ".b",
		"a.b.c",
		"a..c",
		"..",
		"a.b.c.d",
		"Bearer a.b.c",
		"Bearer " + h + ".b.c", // the scheme is no part of the token
		"a.é.c",
		"bnVsbA.b.c", // null
		"WzFd.b.c",   // [1]
		"IiI.b.c",    // ""
	}
	for _, s := range yes {
		if !jwtauth.Shaped(s) {
			t.Errorf("Shaped(%q) = false", s)
		}
	}
	for _, s := range no {
		if jwtauth.Shaped(s) {
			t.Errorf("Shaped(%q) = true", s)
		}
	}
}

func ExampleClaims_Value() {
	c := jwtauth.Claims{
		"sub":                      "user-1",
		"https://example.com/plan": "pro",
		"org":                      map[string]any{"id": json.Number("42")},
		"seats":                    json.Number("1000000"),
	}
	for _, name := range []string{"sub", "https://example.com/plan", "org.id", "seats", "org"} {
		v, ok := c.Value(name)
		fmt.Printf("%s: %q %v\n", name, v, ok)
	}
	// Output:
	// sub: "user-1" true
	// https://example.com/plan: "pro" true
	// org.id: "42" true
	// seats: "1000000" true
	// org: "" false
}

func ExampleShaped() {
	fmt.Println(jwtauth.Shaped("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"))
	fmt.Println(jwtauth.Shaped("sk-proj-abc"))
	// Output:
	// true
	// false
}
