package config

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Price is one [price."…"] table (SPEC §8.1): what a model's tokens cost.
// Amounts are kept as integers of 10⁻⁶ USD per million tokens — which is
// also 10⁻¹² USD (a picodollar) per token — so that charges add up
// exactly and round once, up, to whole micro-dollars.
type Price struct {
	Pattern     string // as written: an exact model name, or a prefix ending in *
	Input       int64  // fresh input
	CachedInput int64  // cache reads (default: Input)
	CacheWrite  int64  // cache writes (default: Input)
	Output      int64  // output, reasoning included
	// LongAbove > 0: when a request's input passes LongAbove tokens, its
	// input and output cost LongInput and LongOutput instead (cached input
	// and cache writes have one price only).
	LongAbove             int64
	LongInput, LongOutput int64
}

// Prices are the price tables, longest pattern first, so that the first
// match is the longest one.
type Prices []Price

// Match returns the price of model: the exact entry, else the longest
// prefix entry that matches; false when none does.
func (ps Prices) Match(model string) (*Price, bool) {
	for i := range ps {
		p := &ps[i]
		if prefix, ok := strings.CutSuffix(p.Pattern, "*"); ok {
			if strings.HasPrefix(model, prefix) {
				return p, true
			}
		} else if p.Pattern == model {
			return p, true
		}
	}
	return nil, false
}

// PriceScale is how many units of a Price amount make one USD per million
// tokens.
const PriceScale = 1_000_000

// maxPrice bounds a price (USD per million tokens) so that tokens × price
// never overflows: 10⁹ tokens at 10⁶ USD per million fit in an int64.
const maxPrice = 1_000_000

var priceFields = []string{"input", "cached_input", "cache_write", "output", "long_context"}

// decodePrices reads the [price."…"] tables; each problem is one error
// naming the entry and the field, like `price "gpt-4o*": input "abc": not a number`.
func decodePrices(raw any) (Prices, []error) {
	tables, ok := raw.(map[string]any)
	if !ok {
		return nil, []error{errors.New("price: not a table of [price.\"MODEL\"] tables")}
	}
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)
	var ps Prices
	var errs []error
	for _, name := range names {
		p, perrs := decodePrice(name, tables[name])
		errs = append(errs, perrs...)
		if len(perrs) == 0 {
			ps = append(ps, p)
		}
	}
	// Longest pattern first: the first match is the longest; among
	// patterns of one length an exact name before a prefix.
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := strings.TrimSuffix(ps[i].Pattern, "*"), strings.TrimSuffix(ps[j].Pattern, "*")
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return !strings.HasSuffix(ps[i].Pattern, "*") && strings.HasSuffix(ps[j].Pattern, "*")
	})
	return ps, errs
}

func decodePrice(name string, raw any) (Price, []error) {
	label := "price " + strconv.Quote(name)
	var errs []error
	bad := func(field string, v any, msg string) {
		where := field
		if v != nil {
			where += " " + showValue(v)
		}
		errs = append(errs, fmt.Errorf("%s: %s: %s", label, where, msg))
	}
	p := Price{Pattern: name}
	if name == "" || strings.Contains(strings.TrimSuffix(name, "*"), "*") {
		errs = append(errs, fmt.Errorf("%s: a model name, or a prefix ending in one *", label))
	}
	t, ok := raw.(map[string]any)
	if !ok {
		return p, append(errs, fmt.Errorf("%s: not a table", label))
	}
	for _, k := range unknownKeys(t, priceFields) {
		bad(k, nil, "unknown field (a price has "+strings.Join(priceFields, ", ")+")")
	}
	amount := func(field string, v any, dst *int64) bool {
		n, err := priceAmount(v)
		if err != nil {
			bad(field, v, err.Error())
			return false
		}
		*dst = n
		return true
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"input", &p.Input}, {"output", &p.Output}} {
		if v, ok := t[f.name]; ok {
			amount(f.name, v, f.dst)
		} else {
			bad(f.name, nil, "required (USD per million tokens)")
		}
	}
	p.CachedInput, p.CacheWrite = p.Input, p.Input
	if v, ok := t["cached_input"]; ok {
		amount("cached_input", v, &p.CachedInput)
	}
	if v, ok := t["cache_write"]; ok {
		amount("cache_write", v, &p.CacheWrite)
	}
	if v, ok := t["long_context"]; ok {
		lc, isTable := v.(map[string]any)
		if !isTable {
			bad("long_context", v, "not a table { above = TOKENS, input = USD, output = USD }")
			return p, errs
		}
		for k := range lc {
			if k != "above" && k != "input" && k != "output" {
				bad("long_context."+k, nil, "unknown field (long_context has above, input, output)")
			}
		}
		above, err := wholeNumber(lc["above"])
		if _, given := lc["above"]; !given || err != nil || above <= 0 {
			bad("long_context.above", lc["above"], "a number of input tokens above 0 is required")
		}
		p.LongAbove = above
		for _, f := range []struct {
			name string
			dst  *int64
		}{{"input", &p.LongInput}, {"output", &p.LongOutput}} {
			if v, ok := lc[f.name]; ok {
				amount("long_context."+f.name, v, f.dst)
			} else {
				bad("long_context."+f.name, nil, "required (USD per million tokens)")
			}
		}
	}
	return p, errs
}

// priceAmount reads a price in USD per million tokens: a number ≥ 0 (a
// TOML integer, float or decimal string) with at most 6 decimals, as
// integers of 10⁻⁶ — the scale of a usd rule's amounts.
func priceAmount(v any) (int64, error) {
	n, err := microDollars(v)
	switch {
	case errors.Is(err, ErrTooPrecise):
		return 0, err
	case err != nil:
		return 0, errors.New("not a number")
	case n < 0:
		return 0, errors.New("must not be negative")
	case n > maxPrice*PriceScale:
		return 0, fmt.Errorf("must be at most %d (USD per million tokens)", maxPrice)
	}
	return n, nil
}

// writePrices prints the price tables as TOML, every field filled in (the
// defaults applied), longest pattern first as they are matched.
func (c *Config) writePrices(w io.Writer) error {
	var b strings.Builder
	amount := func(n int64) string { return Dollars(n) } // same scale: 10⁻⁶ per unit
	for _, p := range c.Prices {
		fmt.Fprintf(&b, "\n[price.%s]\ninput = %s\ncached_input = %s\ncache_write = %s\noutput = %s\n",
			strconv.Quote(p.Pattern), amount(p.Input), amount(p.CachedInput), amount(p.CacheWrite), amount(p.Output))
		if p.LongAbove > 0 {
			fmt.Fprintf(&b, "long_context = { above = %d, input = %s, output = %s }\n", p.LongAbove, amount(p.LongInput), amount(p.LongOutput))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
