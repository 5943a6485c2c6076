package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/toml/v2"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// setting binds one key (TOML name; the environment variable is its upper
// case) to a Config field. A table of them, instead of reflection-driven
// decoding, lets every error name the key, its source and the bad value.
type setting struct {
	key    string
	secret bool // a URL: its password and query are hidden
	hidden bool // a secret value: never shown, only whether it is set
	decode func(c *Config, v any) error
	show   func(c *Config) any
}

func str(key string, f func(*Config) *string) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			s, ok := v.(string)
			if !ok {
				return errors.New("not a string")
			}
			*f(c) = s
			return nil
		},
		show: func(c *Config) any { return *f(c) }}
}

func integer(key string, f func(*Config) *int64) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			switch x := v.(type) {
			case int64:
				*f(c) = x
			case string:
				n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
				if err != nil {
					return errors.New("not an integer")
				}
				*f(c) = n
			default:
				return errors.New("not an integer")
			}
			return nil
		},
		show: func(c *Config) any { return *f(c) }}
}

func boolean(key string, f func(*Config) *bool) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			switch x := v.(type) {
			case bool:
				*f(c) = x
			case string:
				b, err := strconv.ParseBool(strings.TrimSpace(x))
				if err != nil {
					return errors.New("not a boolean (true or false)")
				}
				*f(c) = b
			default:
				return errors.New("not a boolean (true or false)")
			}
			return nil
		},
		show: func(c *Config) any { return *f(c) }}
}

func duration(key string, f func(*Config) *time.Duration) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			s, ok := v.(string)
			if !ok {
				return errors.New(`missing unit (write "30s", "5m")`)
			}
			d, err := time.ParseDuration(strings.TrimSpace(s))
			if err != nil {
				if _, numErr := strconv.ParseFloat(strings.TrimSpace(s), 64); numErr == nil {
					return errors.New(`missing unit (write "30s", "5m")`)
				}
				return errors.New("not a duration")
			}
			*f(c) = d
			return nil
		},
		show: func(c *Config) any { return durationText(*f(c)) }}
}

// durationText writes whole seconds as seconds ("300s", as SPEC §2 gives
// defaults), anything else as Go does ("50ms", "1.5s").
func durationText(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

func list(key string, f func(*Config) *[]string) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			var out []string
			switch x := v.(type) {
			case string: // the environment's comma-separated form
				for _, p := range strings.Split(x, ",") {
					if p = strings.TrimSpace(p); p != "" {
						out = append(out, p)
					}
				}
			case []any:
				for _, e := range x {
					s, ok := e.(string)
					if !ok {
						return errors.New("not a list of strings")
					}
					out = append(out, strings.TrimSpace(s))
				}
			default:
				return errors.New("not a list of strings")
			}
			*f(c) = out
			return nil
		},
		show: func(c *Config) any { return *f(c) }}
}

func secret(s setting) setting { s.secret = true; return s }

// hidden marks a secret that is shown only as set or not (ADMIN_TOKEN,
// JWT_HS256_SECRET): no part of it is ever printed, logged or served.
func hidden(s setting) setting { s.hidden = true; return s }

// Redacted is how a hidden secret that is set is shown.
const Redacted = "[redacted]"

// OutputReserveLearned is OUTPUT_TOKEN_RESERVE's word for a reserve
// learned from the model's settled outputs.
const OutputReserveLearned = "learned"

// outputReserve reads OUTPUT_TOKEN_RESERVE: a number of tokens, or
// "learned".
func outputReserve(key string) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			switch x := v.(type) {
			case int64:
				c.OutputTokenReserve, c.OutputReserveLearned = x, false
				return nil
			case string:
				x = strings.TrimSpace(x)
				if strings.EqualFold(x, OutputReserveLearned) {
					c.OutputReserveLearned = true
					return nil
				}
				if n, err := strconv.ParseInt(x, 10, 64); err == nil {
					c.OutputTokenReserve, c.OutputReserveLearned = n, false
					return nil
				}
			}
			return errors.New(`must be a number of tokens or "learned"`)
		},
		show: func(c *Config) any {
			if c.OutputReserveLearned {
				return OutputReserveLearned
			}
			return c.OutputTokenReserve
		}}
}

// failMode reads FAIL_OPEN: a boolean, or "local".
func failMode(key string, f func(*Config) *string) setting {
	return setting{key: key,
		decode: func(c *Config, v any) error {
			switch x := v.(type) {
			case bool:
				*f(c) = strconv.FormatBool(x)
				return nil
			case string:
				x = strings.ToLower(strings.TrimSpace(x))
				if x == FailOpenLocal {
					*f(c) = x
					return nil
				}
				if b, err := strconv.ParseBool(x); err == nil {
					*f(c) = strconv.FormatBool(b)
					return nil
				}
			}
			return errors.New(`must be true, false or "local"`)
		},
		show: func(c *Config) any { return *f(c) }}
}

// settings is every key of SPEC §2, in the order -check prints them.
var settings = []setting{
	secret(str("upstream_url", func(c *Config) *string { return &c.UpstreamURL })),
	str("listen_addr", func(c *Config) *string { return &c.ListenAddr }),
	str("admin_addr", func(c *Config) *string { return &c.AdminAddr }),
	integer("chat_rpm", func(c *Config) *int64 { return &c.ChatRPM }),
	integer("max_input_tokens", func(c *Config) *int64 { return &c.MaxInputTokens }),
	integer("max_file_bytes", func(c *Config) *int64 { return &c.MaxFileBytes }),
	integer("max_body_bytes", func(c *Config) *int64 { return &c.MaxBodyBytes }),
	list("protected_paths", func(c *Config) *[]string { return &c.ProtectedPaths }),
	boolean("require_auth", func(c *Config) *bool { return &c.RequireAuth }),
	list("trusted_proxies", func(c *Config) *[]string { return &c.TrustedProxies }),
	integer("ipv6_prefix", func(c *Config) *int64 { return &c.IPv6Prefix }),
	secret(str("redis_url", func(c *Config) *string { return &c.RedisURL })),
	str("redis_prefix", func(c *Config) *string { return &c.RedisPrefix }),
	duration("redis_timeout", func(c *Config) *time.Duration { return &c.RedisTimeout }),
	integer("redis_instances", func(c *Config) *int64 { return &c.RedisInstances }),
	failMode("fail_open", func(c *Config) *string { return &c.FailOpen }),
	boolean("rate_limit_enabled", func(c *Config) *bool { return &c.RateLimitEnabled }),
	integer("max_tracked_keys", func(c *Config) *int64 { return &c.MaxTrackedKeys }),
	integer("refusal_cache_size", func(c *Config) *int64 { return &c.RefusalCacheSize }),
	duration("upstream_timeout", func(c *Config) *time.Duration { return &c.UpstreamTimeout }),
	duration("shutdown_timeout", func(c *Config) *time.Duration { return &c.ShutdownTimeout }),
	str("error_format", func(c *Config) *string { return &c.ErrorFormat }),
	str("log_level", func(c *Config) *string { return &c.LogLevel }),
	str("log_format", func(c *Config) *string { return &c.LogFormat }),
	str("tier_from", func(c *Config) *string { return &c.TierFrom }),
	integer("max_delayed", func(c *Config) *int64 { return &c.MaxDelayed }),
	outputReserve("output_token_reserve"),
	integer("output_token_reserve_min", func(c *Config) *int64 { return &c.OutputTokenReserveMin }),
	hidden(str("admin_token", func(c *Config) *string { return &c.AdminToken })),
	hidden(str("jwt_hs256_secret", func(c *Config) *string { return &c.JWTSecret })),
	secret(str("jwt_jwks", func(c *Config) *string { return &c.JWTJWKS })),
	duration("jwt_jwks_refresh", func(c *Config) *time.Duration { return &c.JWTJWKSRefresh }),
	str("jwt_issuer", func(c *Config) *string { return &c.JWTIssuer }),
	str("jwt_audience", func(c *Config) *string { return &c.JWTAudience }),
	str("jwt_subject_claim", func(c *Config) *string { return &c.JWTSubjectClaim }),
	str("state_file", func(c *Config) *string { return &c.StateFile }),
	duration("state_flush_interval", func(c *Config) *time.Duration { return &c.StateFlushInterval }),
	str("api_keys_file", func(c *Config) *string { return &c.APIKeysFile }),
	hidden(str("upstream_authorization", func(c *Config) *string { return &c.UpstreamAuthorization })),
	boolean("access_log", func(c *Config) *bool { return &c.AccessLog }),
}

// ErrFile wraps a configuration file that cannot be read or parsed; no
// other check is meaningful then.
var ErrFile = errors.New("reading")

// Load reads path (TOML; empty for none), then the environment through
// getenv (os.Getenv when nil), over the defaults. It fails on an unreadable
// file, an unknown key or a value of the wrong type, reporting every such
// problem; semantic checks are Validate's.
func Load(path string, getenv func(string) (string, bool)) (Config, error) {
	if getenv == nil {
		getenv = os.LookupEnv
	}
	k := koanf.New("\x00") // keys are flat; no delimiter may split them
	if path != "" {
		if err := k.Load(file.Provider(path), toml.Parser()); err != nil {
			return Default(), fmt.Errorf("%w %s: %w", ErrFile, path, err)
		}
	}
	origin := map[string]string{}
	var errs []error
	for key := range k.Raw() {
		if key == "rule" || key == "price" || key == "upstream_group" {
			continue // file only: decoded below
		}
		if !known(key) {
			errs = append(errs, fmt.Errorf("%s (in %s): unknown key", key, path))
			continue
		}
		origin[key] = "file"
	}
	env := map[string]any{}
	for _, s := range settings {
		if v, ok := getenv(strings.ToUpper(s.key)); ok {
			env[s.key] = v
			origin[s.key] = "env"
		}
	}
	if err := k.Load(confmap.Provider(env, "\x00"), nil); err != nil {
		return Config{}, fmt.Errorf("merging the environment: %w", err)
	}

	c := Default()
	c.set = origin
	for _, s := range settings {
		if _, ok := origin[s.key]; !ok {
			continue
		}
		v := k.Get(s.key)
		if err := s.decode(&c, v); err != nil {
			shown := quote(v, s.secret)
			if s.hidden {
				shown = Redacted
			}
			errs = append(errs, fmt.Errorf("%s = %s: %w", c.name(s.key), shown, err))
		}
	}
	if raw, ok := k.Raw()["rule"]; ok {
		rules, rerrs := decodeRules(raw)
		c.Rules = rules
		errs = append(errs, rerrs...)
	}
	if raw, ok := k.Raw()["price"]; ok {
		prices, perrs := decodePrices(raw)
		c.Prices = prices
		errs = append(errs, perrs...)
	}
	if raw, ok := k.Raw()["upstream_group"]; ok {
		groups, gerrs := decodeUpstreamGroups(raw)
		c.UpstreamGroups = groups
		errs = append(errs, gerrs...)
	}
	if !c.IsSet("max_body_bytes") {
		c.MaxBodyBytes = c.MaxFileBytes + 1<<20
	}
	return c, errors.Join(errs...)
}

func known(key string) bool {
	for _, s := range settings {
		if s.key == key {
			return true
		}
	}
	return false
}

// name is how errors call key: the environment variable when the value came
// from there, else the TOML key.
func (c *Config) name(key string) string {
	if c.set[key] == "env" {
		return strings.ToUpper(key)
	}
	return key
}

func quote(v any, secret bool) string {
	if s, ok := v.(string); ok {
		if secret {
			s = redactURL(s)
		}
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// Keys are the top-level settings (SPEC §2), in the order -check prints
// them.
func Keys() []string {
	out := make([]string, len(settings))
	for i, s := range settings {
		out[i] = s.key
	}
	return out
}

// Same reports whether a and b have the same value of setting key,
// secrets compared as they are (Show hides them).
func Same(a, b *Config, key string) bool {
	for i := range settings {
		if settings[i].key == key {
			return reflect.DeepEqual(settings[i].show(a), settings[i].show(b))
		}
	}
	return true
}

// Show is the value of setting key (its TOML name) as it may be shown:
// durations as text ("10s"), URLs without their password and query, hidden
// secrets as Redacted. False for an unknown key.
func Show(c *Config, key string) (any, bool) {
	for i := range settings {
		if settings[i].key == key {
			return settings[i].Shown(c), true
		}
	}
	return nil, false
}
