package config

import (
	"errors"
	"math"
	"strconv"
	"strings"
)

// Dollar amounts: read exactly (at most 6 decimals) as micro-dollars, and
// written back.

// ErrTooPrecise is an amount of dollars with more than 6 decimals, finer
// than the 10⁻⁶ USD amounts are kept in.
var ErrTooPrecise = errors.New("at most 6 decimals")

// microDollars reads an amount of dollars (a TOML integer, float or
// decimal string) as integers of 10⁻⁶ USD, rounded to the nearest.
func microDollars(v any) (int64, error) {
	f, ok := number(v, true)
	if !ok || math.Abs(f) > 1e12 {
		return 0, errors.New("not an amount of dollars")
	}
	// The shortest decimal that reads back as f is what was written:
	// past 6 decimals it cannot be kept, and is refused, not rounded.
	text := strconv.FormatFloat(f, 'f', -1, 64)
	if _, frac, ok := strings.Cut(text, "."); ok && len(frac) > 6 {
		return 0, ErrTooPrecise
	}
	return int64(math.Round(f * 1e6)), nil
}

// number reads a finite TOML number (an integer or a float; with
// decimalString, a string holding one too).
func number(v any, decimalString bool) (float64, bool) {
	var f float64
	switch x := v.(type) {
	case int64:
		f = float64(x)
	case int:
		f = float64(x)
	case float64:
		f = x
	case string:
		if !decimalString {
			return 0, false
		}
		var err error
		if f, err = strconv.ParseFloat(strings.TrimSpace(x), 64); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	return f, !math.IsNaN(f) && !math.IsInf(f, 0)
}

// Dollars writes integers of 10⁻⁶ USD as dollars with at most 6
// decimals and no trailing zeros: 25000000 is "25", 1 is "0.000001".
func Dollars(micro int64) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	b := make([]byte, 0, 24)
	b = append(b, sign...)
	b = strconv.AppendInt(b, micro/1e6, 10)
	if frac := micro % 1e6; frac != 0 {
		b = append(b, '.')
		for d := int64(100_000); d > 0 && frac > 0; d /= 10 {
			b = append(b, byte('0'+frac/d))
			frac %= d
		}
	}
	return string(b)
}

// ParseDollars reads an amount of dollars written as a decimal ("25",
// "0.5") as integers of 10⁻⁶ USD; one with more than 6 decimals is
// refused (ErrTooPrecise).
func ParseDollars(s string) (int64, error) { return microDollars(s) }
