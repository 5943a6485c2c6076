//go:build !race

package tokens_test

const raceOn = false
