//go:build unix

package redistest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// exclusive holds, until t ends, a lock that every test binary on this
// machine takes before starting a Cluster or a Sentinel set: go test runs
// packages in parallel, and two clusters of six servers plus their
// failovers on two cores would make each other's timing claims false.
// Other tests run alongside as usual.
func exclusive(t testing.TB) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "ratelimit-proxy-redistest-ha.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("redistest: opening %s: %v", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("redistest: locking %s: %v", path, err)
	}
	t.Cleanup(func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
