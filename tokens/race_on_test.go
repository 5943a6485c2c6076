//go:build race

package tokens_test

// raceOn: the race detector slows the code some tenfold, so time bounds
// are not checked under it.
const raceOn = true
