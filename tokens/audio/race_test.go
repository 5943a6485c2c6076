//go:build race

package audio

// raceEnabled: the race detector slows code several times over; timing
// tests do not apply.
const raceEnabled = true
