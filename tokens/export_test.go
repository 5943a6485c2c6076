package tokens

// CanonicalNumber is canonicalNumber, for the external tests.
var CanonicalNumber = canonicalNumber
