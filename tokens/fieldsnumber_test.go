package tokens

import (
	"math/big"
	"testing"
)

func TestCanonicalNumber(t *testing.T) {
	for in, want := range map[string]string{
		"7": "7", "7.0": "7", "7e0": "7", "70e-1": "7", "0.7E1": "7", "0.70e+1": "7", "007": "7",
		"-0": "0", "0.000": "0", "0e5": "0", "-7.50": "-7.5", "0.5": "0.5", "5e-1": "0.5",
		"100": "100", "1e2": "100", "1E+2": "100", "1e20": "100000000000000000000", "1e21": "1e21",
		"1e-25": "1e-25", "0.001": "0.001", "12345678901234567890123": "12345678901234567890123",
		"1e99999999999999999999": "1e99999999999999999999",
	} {
		if got := canonicalNumber(in); got != want {
			t.Errorf("canonicalNumber(%q) = %q, want %q", in, got, want)
		}
	}
}

// Two literals get one spelling exactly when they are the same number.
func FuzzCanonicalNumber(f *testing.F) {
	for _, s := range []string{"7", "7.0", "-0.5e-3", "1e21", "123.456e7"} {
		f.Add(s, "7")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ra, okA := new(big.Rat).SetString(a)
		rb, okB := new(big.Rat).SetString(b)
		if !okA || !okB || !jsonNumber(a) || !jsonNumber(b) || len(a) > 40 || len(b) > 40 {
			return
		}
		if same := ra.Cmp(rb) == 0; same != (canonicalNumber(a) == canonicalNumber(b)) {
			t.Fatalf("%q → %q, %q → %q, equal values: %v", a, canonicalNumber(a), b, canonicalNumber(b), same)
		}
	})
}

// jsonNumber reports whether s is an RFC 8259 number with a small exponent.
func jsonNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if digits() == 0 {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if n := digits(); n == 0 || n > 3 {
			return false
		}
	}
	return i == len(s)
}
