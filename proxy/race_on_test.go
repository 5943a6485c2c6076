//go:build race

package proxy_test

// raceOn: the race detector changes what allocates (sync.Pool drops
// items at random), so allocation counts are not checked under it.
const raceOn = true
