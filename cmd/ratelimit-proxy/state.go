package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// stateFile keeps the in-memory counters in STATE_FILE across restarts
// (SPEC §7.6): loaded at start, saved every STATE_FLUSH_INTERVAL and at
// shutdown. A nil *stateFile (STATE_FILE unset, or Redis) does nothing.
type stateFile struct {
	path     string
	interval time.Duration
	memory   *limits.Memory
	log      *slog.Logger
	metrics  stateMetrics

	// mu makes saves one at a time: a periodic save that ended after the
	// final one would rename an older snapshot over it.
	mu      sync.Mutex
	failing bool // the last save failed; the next failure is logged at debug
}

// openStateFile loads cfg.StateFile into memory and returns what saves it.
// It never fails on the file: a damaged one is logged and renamed aside
// (<path>.damaged-<unix seconds>), an unreadable one is logged, and the
// proxy starts with empty counters. It returns nil when there is nothing
// to do: no STATE_FILE, or a Redis store (which keeps its own state).
func openStateFile(cfg config.Config, memory *limits.Memory, reg prometheus.Registerer, log *slog.Logger) (*stateFile, error) {
	if cfg.StateFile == "" {
		return nil, nil
	}
	if cfg.RedisURL != "" {
		log.Warn("STATE_FILE ignored: Redis keeps its own state", "state_file", cfg.StateFile)
		return nil, nil
	}
	m, err := registerStateMetrics(reg)
	if err != nil {
		return nil, err
	}
	st := &stateFile{path: cfg.StateFile, interval: cfg.StateFlushInterval, memory: memory, log: log, metrics: m}
	st.load(time.Now())
	return st, nil
}

func (st *stateFile) load(now time.Time) {
	loaded, err := limits.LoadStateFile(st.path, st.memory, now)
	switch {
	case errors.Is(err, limits.ErrDamagedState):
		aside := fmt.Sprintf("%s.damaged-%d", st.path, now.Unix())
		if rerr := os.Rename(st.path, aside); rerr != nil {
			st.log.Error("state file damaged, starting with empty counters; it could not be set aside and the next save replaces it",
				"state_file", st.path, "err", err, "rename_err", rerr)
			return
		}
		st.log.Error("state file damaged, starting with empty counters; set aside", "state_file", st.path, "moved_to", aside, "err", err)
	case err != nil:
		st.log.Error("state file not loaded, starting with empty counters", "state_file", st.path, "err", err)
	case loaded.SavedAt.IsZero():
		st.log.Info("no state file yet, starting with empty counters", "state_file", st.path)
	default:
		st.log.Info("counters restored from the state file", "state_file", st.path, "loaded", loaded.Loaded,
			"expired", loaded.Expired, "dropped", loaded.Dropped, "saved_at", loaded.SavedAt.UTC().Format(time.RFC3339),
			"age", now.Sub(loaded.SavedAt).Round(time.Millisecond))
	}
}

// run saves the counters every interval until ctx ends. A failed save is
// logged and tried again at the next tick.
func (st *stateFile) run(ctx context.Context) {
	if st == nil {
		return
	}
	t := time.NewTicker(st.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			st.flush(slog.LevelDebug)
		}
	}
}

// save is the final save, at shutdown, after the drain: the requests
// admitted while draining are in it.
func (st *stateFile) save() {
	if st == nil {
		return
	}
	st.flush(slog.LevelInfo)
}

// flush saves the counters now and logs a success at level.
func (st *stateFile) flush(level slog.Level) {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := time.Now()
	n, err := limits.SaveStateFile(st.path, st.memory, now)
	if err != nil {
		st.metrics.failed.Inc()
		if st.failing {
			st.log.Debug("state file save failed again", "state_file", st.path, "err", err)
		} else {
			st.log.Error("state file save failed; retrying every interval", "state_file", st.path, "err", err, "interval", st.interval)
		}
		st.failing = true
		return
	}
	st.metrics.ok.Inc()
	st.metrics.lastSave.Set(float64(now.UnixNano()) / 1e9)
	st.metrics.keys.Set(float64(n))
	if st.failing {
		st.failing = false
		level = max(level, slog.LevelInfo)
	}
	st.log.Log(context.Background(), level, "state file saved", "state_file", st.path, "keys", n,
		"took", time.Since(now).Round(time.Microsecond))
}

// stateMetrics are the state file's Prometheus series.
type stateMetrics struct {
	ok, failed prometheus.Counter
	lastSave   prometheus.Gauge
	keys       prometheus.Gauge
}

func registerStateMetrics(reg prometheus.Registerer) (stateMetrics, error) {
	saves := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_proxy_state_saves_total",
		Help: "Saves of STATE_FILE, by result (ok, error).",
	}, []string{"result"})
	last := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimit_proxy_state_last_save_timestamp_seconds",
		Help: "Unix time of the counters the last successful save of STATE_FILE holds (the time they were read).",
	})
	keys := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimit_proxy_state_saved_keys",
		Help: "Counters written by the last successful save of STATE_FILE.",
	})
	for _, c := range []prometheus.Collector{saves, last, keys} {
		if err := reg.Register(c); err != nil {
			return stateMetrics{}, fmt.Errorf("registering state file metrics: %w", err)
		}
	}
	return stateMetrics{ok: saves.WithLabelValues("ok"), failed: saves.WithLabelValues("error"), lastSave: last, keys: keys}, nil
}
