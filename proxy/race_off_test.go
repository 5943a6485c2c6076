//go:build !race

package proxy_test

const raceOn = false
