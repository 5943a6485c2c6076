package jwtauth

// ParseKeySet exposes the key-set parser to the fuzz and bound tests: how
// many keys it kept, how many it skipped.
func ParseKeySet(data []byte) (kept, skipped int, err error) {
	set, sk, err := parseKeySet(data)
	if set != nil {
		kept = len(set.keys)
	}
	return kept, sk.n, err
}

// DecodeSegment exposes the two readings of a segment (PyJWT's, Node's).
func DecodeSegment(seg string) (py, node []byte) { return decodeSegment(seg) }
