package limits

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// SaveStateFile writes the store's live counters (WriteState) to path
// atomically: into a temporary file beside it (mode 0600), synced, then
// renamed over path, and the directory synced. A failed save removes its
// temporary file and leaves path as it was. It returns how many counters
// it saved. Saves to one path must not run concurrently (the last rename
// wins, whichever snapshot is older).
func SaveStateFile(path string, m *Memory, now time.Time) (int, error) {
	return saveStateFile(path, m, now, nil)
}

// tempSuffix marks the temporary files of a save: path + tempSuffix + a
// random part.
const tempSuffix = ".tmp-"

// saveStateFile is SaveStateFile with the file's writer wrapped by wrap
// (nil: none), so tests can make the write fail.
func saveStateFile(path string, m *Memory, now time.Time, wrap func(io.Writer) io.Writer) (n int, err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+tempSuffix+"*")
	if err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close() // a second Close only reports an error
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	var w io.Writer = f
	if wrap != nil {
		w = wrap(f)
	}
	if n, err = m.WriteState(w, now); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	// The rename is durable once the directory is.
	if err := syncDir(dir); err != nil {
		return n, fmt.Errorf("saving state: syncing %s: %w", dir, err)
	}
	return n, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// LoadStateFile loads the counters saved at path into the store
// (ReadState). A missing file loads nothing and is no error (LoadStats
// is zero); a damaged one returns an error wrapping ErrDamagedState and
// loads nothing, and the caller should set it aside. It first removes the
// temporary files a save that was killed midway left beside path (one
// process owns a state file).
func LoadStateFile(path string, m *Memory, now time.Time) (LoadStats, error) {
	removeStaleTemps(path)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return LoadStats{}, nil
	}
	if err != nil {
		return LoadStats{}, fmt.Errorf("loading state: %w", err)
	}
	defer f.Close()
	st, err := m.ReadState(f, now)
	if err != nil {
		return LoadStats{}, fmt.Errorf("loading state from %s: %w", path, err)
	}
	return st, nil
}

func removeStaleTemps(path string) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+tempSuffix
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
