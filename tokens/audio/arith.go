package audio

import (
	"math"
	"math/bits"
)

// mulDivCeil returns ⌈a×b/c⌉ for a, b ≥ 0 and c > 0, saturated at
// math.MaxInt64.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem != 0 {
		q++
	}
	if q == 0 && rem != 0 || q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// bytesNs is how long n bytes last at rate bytes a second, in nanoseconds,
// rounded up.
func bytesNs(n, rate int64) int64 {
	if n <= 0 {
		return 0
	}
	return mulDivCeil(n, 1e9, rate)
}

// addSat adds two non-negative durations, saturated at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// mulSat returns a×b for a, b ≥ 0, saturated at math.MaxInt64.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}
