// Command ratelimit-proxy is a reverse proxy that identifies each caller of
// a chat/LLM API, rate-limits them and answers 429/413 itself.
//
//	ratelimit-proxy -demo                    # in front of a built-in mock API
//	ratelimit-proxy -config config.toml      # normal start
//	ratelimit-proxy -check -config config.toml
//	ratelimit-proxy -mock                    # only the mock API, on LISTEN_ADDR
//	ratelimit-proxy tokens [-model M] < body.json
//	ratelimit-proxy key [-json] < key     # the public form and SHA-256 of an API key
//
// main only wires: load the configuration, build the components, start the
// listeners, wait for a signal, drain.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // calendar rules load their time zone on a host without a zoneinfo database

	"github.com/lmittmann/tint"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/quiet"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/mockapi"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "tokens":
			os.Exit(runTokens(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
		case "key":
			os.Exit(runKey(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
		}
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// demoListenAddr is LISTEN_ADDR's default under -demo: loopback only.
const demoListenAddr = "127.0.0.1:8080"

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "TOML configuration `file`; environment variables override it")
	check := fs.Bool("check", false, "validate the configuration, print the effective settings and exit")
	demo := fs.Bool("demo", false, "run in front of a built-in OpenAI-compatible mock API on loopback")
	mock := fs.Bool("mock", false, "serve only the built-in mock API on LISTEN_ADDR (a demo upstream for compose)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ratelimit-proxy: unexpected argument %q\n", fs.Arg(0))
		return 2
	}

	cfg, err := config.Load(*cfgPath, nil)
	cfg.Demo = *demo || *mock
	if *demo && !cfg.IsSet("listen_addr") {
		cfg.ListenAddr = demoListenAddr // a demo is not a proxy to the network unless asked
	}
	// Report every problem at once: what did not decode, and what decoded
	// but is out of range (unless the file itself could not be read).
	if !errors.Is(err, config.ErrFile) {
		err = errors.Join(err, cfg.Validate())
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-proxy: invalid configuration: %s\n", oneLine(err))
		return 1
	}
	if *check {
		if err := cfg.Write(stdout); err != nil {
			return 1
		}
		fmt.Fprintln(stderr, "configuration OK")
		return 0
	}

	level := new(slog.LevelVar)
	log := newLogger(cfg, level, stderr)
	if _, set := os.LookupEnv("GOGC"); !set {
		paceGC() // see gc.go
	}
	if *mock {
		err = serveMock(cfg, log)
	} else {
		err = serve(cfg, *cfgPath, level, log)
	}
	if err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	return 0
}

// oneLine joins the problems of a (joined) error with "; ".
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// newLogger writes to w at cfg's level, which a reload may change through
// level.
func newLogger(cfg config.Config, level *slog.LevelVar, w io.Writer) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(cfg.LogLevel)) // validated
	level.Set(lv)
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.DateTime, NoColor: !isTerminal(w)}))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// serve runs the proxy until SIGINT or SIGTERM, then drains; SIGHUP
// reloads the configuration file (cfgPath) and the environment.
func serve(cfg config.Config, cfgPath string, level *slog.LevelVar, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if cfg.Demo {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("starting the demo upstream: %w", err)
		}
		mock := &http.Server{Handler: mockapi.New(), ReadHeaderTimeout: 10 * time.Second}
		go mock.Serve(ln)
		defer mock.Close()
		cfg.UpstreamURL = "http://" + ln.Addr().String()
		log.Info("demo upstream (OpenAI-compatible mock) started", "url", cfg.UpstreamURL)
	}

	tk := tokens.New()
	start := time.Now()
	if err := tk.Preload(); err != nil { // once, at start: never on a request
		return err
	}
	log.Debug("token encodings loaded", "took", time.Since(start))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	memory := limits.NewMemory(limits.MemoryOptions{MaxKeys: int(cfg.MaxTrackedKeys)})
	st, err := openStateFile(cfg, memory, reg, log)
	if err != nil {
		return err
	}
	opts := proxy.Options{Config: cfg, Store: memory, Logger: log, Registerer: reg, Stats: memory.Stats, Tokenizer: tk,
		ConfigPath: cfgPath, LogLevel: level}
	if cfg.RedisURL != "" {
		shared, err := newRedisStore(cfg, reg, log, memory)
		if err != nil {
			return err
		}
		defer shared.close()
		opts.Store, opts.StoreName, opts.Places = shared.store, "redis", shared.places
		opts.StoreUp = func() bool { return shared.redis.Check(context.Background()) }
		opts.GateRedis = &gate.RedisOptions{Client: shared.client, Prefix: cfg.RedisPrefix, Timeout: cfg.RedisTimeout,
			Instances: cfg.RedisInstances, FailClosed: cfg.FailOpen == config.FailOpenFalse}
		opts.LearnedShare = proxy.NewLearnedShare(shared.client, cfg.RedisPrefix, cfg.RedisTimeout)
	}
	// Outermost: a remembered refusal is answered before the store (or its
	// FAIL_OPEN fallback) is asked.
	var remember *limits.Remember
	if cfg.RefusalCacheSize > 0 {
		remember = limits.NewRemember(opts.Store, int(cfg.RefusalCacheSize)).(*limits.Remember)
		opts.Store, opts.Refusals = remember, remember.Stats
		opts.Forget = remember.Forget
	}
	// A reset, live change or reload is forgotten by every instance that
	// shares the store (SPEC §4.2).
	if opts.GateRedis != nil {
		bus := limits.NewForgetBus(opts.GateRedis.Client, cfg.RedisPrefix, remember)
		bus.OnError = func(op string, err error) { log.Debug("refusal forgetting over redis failed", "op", op, "err", err) }
		opts.Forget = bus.Forget
		go bus.Run(ctx)
	}
	p, err := proxy.New(opts)
	if err != nil {
		return err
	}
	defer p.Close()

	public, err := listen(cfg.ListenAddr, p.Handler(), log, "public")
	if err != nil {
		return err
	}
	admin, err := listen(cfg.AdminAddr, p.AdminHandler(reg), log, "admin")
	if err != nil {
		public.Close()
		return err
	}
	go sweep(ctx, memory, remember, log)
	go reloadOnHangup(ctx, p)
	go st.run(ctx)

	<-ctx.Done()
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout)
	drain, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	admin.Shutdown(drain)
	if err := public.Shutdown(drain); err != nil {
		log.Warn("drain timed out; closing remaining connections", "err", err)
		public.Close()
	}
	st.save()
	log.Info("stopped")
	return nil
}

// reloadOnHangup reloads the configuration on each SIGHUP until ctx ends.
// A refused file is logged by Reload and changes nothing.
func reloadOnHangup(ctx context.Context, p *proxy.Proxy) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			p.Reload("SIGHUP")
		}
	}
}

// listen binds addr (so a taken port fails the start) and serves h on it.
// The timeouts stop slow clients from holding connections open without
// ever cutting a long response stream: no write timeout, and the read
// timeout covers only the headers.
func listen(addr string, h http.Handler, log *slog.Logger, name string) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w", name, err)
	}
	ln = quiet.Listener(ln) // raw reads and writes: internal/quiet says why
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("listener failed", "listener", name, "err", err)
		}
	}()
	log.Info("listening", "listener", name, "addr", ln.Addr().String())
	return srv, nil
}

// sweep drops idle counters every 10 s so memory follows active callers,
// and remembered refusals whose wait has ended every second.
func sweep(ctx context.Context, store *limits.Memory, remember *limits.Remember, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if remember != nil {
				remember.Sweep(now)
			}
			if i%10 != 0 {
				continue
			}
			if n := store.Sweep(now); n > 0 {
				log.Debug("dropped idle rate-limit counters", "count", n)
			}
		}
	}
}

// serveMock serves the built-in mock API alone on LISTEN_ADDR until
// SIGINT or SIGTERM.
func serveMock(cfg config.Config, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := listen(cfg.ListenAddr, mockapi.New(), log, "mock")
	if err != nil {
		return err
	}
	<-ctx.Done()
	drain, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return srv.Shutdown(drain)
}

// sharedStore is the Redis store and what it is wrapped in.
type sharedStore struct {
	redis  *limits.Redis
	store  limits.Store // redis, or the local fallback around it
	places *limits.RedisPlaces
	client redis.UniversalClient
}

func (s *sharedStore) close() {
	s.places.Close()
	s.redis.Close()
	s.client.Close()
}

// newRedisStore connects to REDIS_URL. An unreachable Redis does not stop
// the start: the breaker and FAIL_OPEN decide, and the probe notices when
// it comes.
func newRedisStore(cfg config.Config, reg prometheus.Registerer, log *slog.Logger, memory *limits.Memory) (*sharedStore, error) {
	redis.SetLogger(redisLog{log}) // go-redis's own lines go through slog, not raw stderr
	client, err := limits.NewRedisClient(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("redis_url: %w", err)
	}
	sm, err := proxy.NewStoreMetrics(reg, log)
	if err != nil {
		return nil, err
	}
	rs := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: cfg.RedisPrefix, Timeout: cfg.RedisTimeout,
		OnCall: sm.Call, OnStateChange: sm.StateChange})
	s := &sharedStore{redis: rs, store: rs, client: client}
	// Concurrency rules' places, shared by leases.
	po := limits.RedisPlacesOptions{Client: client, Prefix: cfg.RedisPrefix, Timeout: cfg.RedisTimeout, OnCall: sm.Call}
	if cfg.FailOpen == config.FailOpenLocal {
		fb := limits.NewFallback(rs, memory, cfg.RedisInstances)
		fb.OnFallback = sm.Fallback
		s.store = fb
		po.Local, po.Instances = limits.NewMemoryPlaces(), cfg.RedisInstances
	}
	s.places = limits.NewRedisPlaces(po)
	// Open the connections and load the scripts before serving, so the
	// first burst is decided within REDIS_TIMEOUT.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := rs.Warm(ctx); err != nil {
		log.Warn("redis not reachable at start; FAIL_OPEN applies until it is", "err", err, "fail_open", cfg.FailOpen)
		rs.MarkDown(err)
	} else {
		log.Info("shared state in redis", "prefix", cfg.RedisPrefix, "fail_open", cfg.FailOpen, "warmed_in", time.Since(start).Round(time.Millisecond))
	}
	return s, nil
}

// redisLog routes go-redis's internal log lines (reconnects, pool errors)
// through slog at debug level: failures that matter are reported once by
// the store's state changes.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
