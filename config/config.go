// Package config loads the proxy's settings: a TOML file, then environment
// variables of the same names in upper case, into one Config; Validate
// reports every problem at once, naming the key and the bad value.
package config

import (
	"time"
)

// Config is the effective configuration. Load fills it; Validate checks it;
// constructors of the other packages take what they need from it.
type Config struct {
	UpstreamURL      string
	ListenAddr       string
	AdminAddr        string
	ChatRPM          int64
	MaxInputTokens   int64
	MaxFileBytes     int64
	MaxBodyBytes     int64
	ProtectedPaths   []string
	RequireAuth      bool
	TrustedProxies   []string
	IPv6Prefix       int64
	RedisURL         string
	RedisPrefix      string
	RedisTimeout     time.Duration
	RedisInstances   int64
	FailOpen         string // FailOpenTrue, FailOpenFalse or FailOpenLocal
	RateLimitEnabled bool
	MaxTrackedKeys   int64
	RefusalCacheSize int64
	UpstreamTimeout  time.Duration
	ShutdownTimeout  time.Duration
	ErrorFormat      string
	LogLevel         string
	LogFormat        string
	TierFrom         string // where a caller's plan comes from: header:NAME (SPEC §7.4)
	MaxDelayed       int64  // most requests held by delay rules at once
	// OutputTokenReserve is the output a total_tokens or usd rule
	// reserves for a request that names no max_tokens (SPEC §8). With
	// OutputReserveLearned (OUTPUT_TOKEN_RESERVE = "learned") it is not
	// used: the reserve is the 95th percentile of the model's recent
	// settled outputs, never below OutputTokenReserveMin.
	OutputTokenReserve    int64
	OutputReserveLearned  bool
	OutputTokenReserveMin int64

	// AdminToken, when set, is required as a bearer token on every
	// /admin/ and /debug/pprof/ request (SPEC §10).
	AdminToken string
	// JWT verification (SPEC §7.5): configured when JWTSecret or JWTJWKS
	// is set.
	JWTSecret       string        // HMAC secret of HS256/384/512 tokens
	JWTJWKS         string        // a JWKS file or https:// URL
	JWTJWKSRefresh  time.Duration // how often the key set is fetched again
	JWTIssuer       string        // iss required when set
	JWTAudience     string        // aud must contain it when set
	JWTSubjectClaim string        // the claim naming the caller
	// StateFile, when set, keeps the in-memory counters across restarts
	// (SPEC §7.6), saved every StateFlushInterval and at shutdown.
	StateFile          string
	StateFlushInterval time.Duration
	// APIKeysFile, when set, names the keys the proxy knows (SPEC §7.7):
	// only they are API keys, each counted as its caller.
	APIKeysFile string
	// UpstreamAuthorization, when set, replaces the caller's credential
	// headers on every forwarded request (SPEC §7.7).
	UpstreamAuthorization string
	// AccessLog logs one line per proxied request (SPEC §2).
	AccessLog bool

	// Rules are the file's [[rule]] tables (SPEC §7), in file order.
	Rules []Rule
	// Prices are the file's [price."…"] tables (SPEC §8.1), longest
	// pattern first.
	Prices Prices
	// UpstreamGroups are the file's [[upstream_group]] tables (SPEC §9),
	// in file order, their defaults applied.
	UpstreamGroups []UpstreamGroup

	// Demo is set by -demo: the upstream is the built-in mock, so
	// UpstreamURL is not required.
	Demo bool

	// set records the keys the file or the environment gave, and where.
	set map[string]string
}

// FAIL_OPEN modes: what a request gets while the shared store is down.
const (
	FailOpenTrue  = "true"  // admitted, without rate-limit headers
	FailOpenFalse = "false" // 503 rate_limiter_unavailable
	FailOpenLocal = "local" // decided in memory, limit ÷ REDIS_INSTANCES
)

// DefaultProtectedPaths are the routes whose POSTs go through the guards
// (SPEC §3).
var DefaultProtectedPaths = []string{
	"/api/chat",
	"/v1/chat/completions",
	"/v1/completions",
	"/v1/responses",
	"/v1/embeddings",
	"/v1/messages",
}

// Default returns the configuration with every default of SPEC §2 applied
// and nothing set. It is the single place defaults live.
func Default() Config {
	return Config{
		ListenAddr:            ":8080",
		AdminAddr:             "127.0.0.1:9090",
		ChatRPM:               20,
		MaxInputTokens:        2000,
		MaxFileBytes:          10 << 20,
		MaxBodyBytes:          10<<20 + 1<<20,
		ProtectedPaths:        append([]string(nil), DefaultProtectedPaths...),
		IPv6Prefix:            64,
		RedisPrefix:           "ratelimit-proxy:",
		RedisTimeout:          50 * time.Millisecond,
		RedisInstances:        1,
		FailOpen:              FailOpenTrue,
		RateLimitEnabled:      true,
		MaxTrackedKeys:        1_000_000,
		RefusalCacheSize:      100_000,
		UpstreamTimeout:       300 * time.Second,
		ShutdownTimeout:       30 * time.Second,
		ErrorFormat:           "auto",
		LogLevel:              "info",
		LogFormat:             "text",
		MaxDelayed:            1000,
		OutputTokenReserve:    1024,
		OutputTokenReserveMin: 256,
		JWTJWKSRefresh:        10 * time.Minute,
		JWTSubjectClaim:       "sub",
		StateFlushInterval:    10 * time.Second,
	}
}

// plans reports whether callers can have a plan: from tier_from, or from
// the tier of a known key (api_keys_file).
func (c *Config) plans() bool { return c.TierFrom != "" || c.APIKeysFile != "" }

// JWT reports whether JWT verification is configured (SPEC §7.5).
func (c *Config) JWT() bool { return c.JWTSecret != "" || c.JWTJWKS != "" }

// IsSet reports whether key (the TOML name, e.g. "chat_rpm") was given by
// the file or the environment rather than defaulted.
func (c *Config) IsSet(key string) bool {
	_, ok := c.set[key]
	return ok
}
