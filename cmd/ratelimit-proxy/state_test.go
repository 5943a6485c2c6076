package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

func stateConfig(path string) config.Config {
	cfg := config.Default()
	cfg.StateFile = path
	return cfg
}

// A save that fails is counted and logged once at error, again at debug,
// and the recovery at info; the metrics pass the exposition linter.
func TestStateFileSaves(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "state") // no such directory yet
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	memory := limits.NewMemory(limits.MemoryOptions{})
	chat := &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: 5, Window: time.Hour}
	out := make([]limits.Decision, 1)
	memory.Decide(context.Background(), []limits.Hit{{Rule: chat, Key: limits.KeyOf("caller", "a"), Cost: 1}}, time.Now(), out)

	st, err := openStateFile(stateConfig(path), memory, reg, log)
	if err != nil || st == nil {
		t.Fatalf("openStateFile: %v, %v", st, err)
	}
	st.flush(slog.LevelDebug)
	st.flush(slog.LevelDebug)
	if n := strings.Count(logs.String(), "level=ERROR msg=\"state file save failed"); n != 1 {
		t.Errorf("%d save failures logged at error, want 1:\n%s", n, logs.String())
	}
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	st.flush(slog.LevelDebug)
	if !strings.Contains(logs.String(), `level=INFO msg="state file saved"`) {
		t.Errorf("the recovery is not logged at info:\n%s", logs.String())
	}
	want := map[string]float64{"ok": 1, "error": 2}
	saves, _ := reg.Gather()
	for _, mf := range saves {
		switch mf.GetName() {
		case "ratelimit_proxy_state_saves_total":
			for _, m := range mf.GetMetric() {
				if r := m.GetLabel()[0].GetValue(); m.GetCounter().GetValue() != want[r] {
					t.Errorf("saves{result=%q} = %v, want %v", r, m.GetCounter().GetValue(), want[r])
				}
			}
		case "ratelimit_proxy_state_saved_keys":
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 1 {
				t.Errorf("saved keys = %v, want 1", v)
			}
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestOpenStateFileOff(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	memory := limits.NewMemory(limits.MemoryOptions{})
	if st, err := openStateFile(stateConfig(""), memory, prometheus.NewRegistry(), log); st != nil || err != nil || logs.Len() != 0 {
		t.Errorf("no STATE_FILE: %v, %v, logs %q", st, err, logs.String())
	}
	cfg := stateConfig(filepath.Join(t.TempDir(), "state"))
	cfg.RedisURL = "redis://127.0.0.1:6379/0"
	if st, err := openStateFile(cfg, memory, prometheus.NewRegistry(), log); st != nil || err != nil || !strings.Contains(logs.String(), "level=WARN msg=\"STATE_FILE ignored") {
		t.Errorf("with Redis: %v, %v, logs %q", st, err, logs.String())
	}
	var none *stateFile // what openStateFile returns when off: does nothing
	none.run(context.Background())
	none.save()
}
