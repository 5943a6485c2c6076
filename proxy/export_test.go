package proxy

import "bytes"

// JSONString is writeJSON of a string, for the fuzz test of its fast path.
func JSONString(s string) string {
	var b bytes.Buffer
	writeJSON(&b, s)
	return b.String()
}
