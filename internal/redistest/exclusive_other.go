//go:build !unix

package redistest

import "testing"

// exclusive is a no-op where flock is not available.
func exclusive(testing.TB) {}
