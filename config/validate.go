package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// Validate reports every semantic problem of c at once, each naming the key
// and the bad value. It never changes c.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key string, v any, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s = %s: %s", c.name(key), quote(v, isSecret(key)), fmt.Sprintf(format, args...)))
	}
	if err := checkAddr(c.AdminAddr); err == nil && c.AdminToken == "" && !loopbackAddr(c.AdminAddr) {
		bad("admin_addr", c.AdminAddr, "is not a loopback address: set ADMIN_TOKEN (admin_token), which every /admin/ and /debug/pprof/ request must then present, or listen on 127.0.0.1")
	}

	switch {
	case c.UpstreamURL == "" && !c.Demo:
		errs = append(errs, fmt.Errorf("%s: required (the base URL of the protected API), or run with -demo", c.name("upstream_url")))
	case c.UpstreamURL != "":
		if err := checkURL(c.UpstreamURL, "http", "https"); err != nil {
			bad("upstream_url", c.UpstreamURL, "%v", err)
		}
	}
	for _, a := range []struct {
		key, addr string
	}{{"listen_addr", c.ListenAddr}, {"admin_addr", c.AdminAddr}} {
		if err := checkAddr(a.addr); err != nil {
			bad(a.key, a.addr, "%v", err)
		}
	}
	if c.ListenAddr == c.AdminAddr && !strings.HasSuffix(c.ListenAddr, ":0") { // port 0: two distinct ports
		bad("admin_addr", c.AdminAddr, "must differ from listen_addr: the admin endpoints never share the public listener")
	}
	for _, n := range []struct {
		key string
		v   int64
	}{{"chat_rpm", c.ChatRPM}, {"max_input_tokens", c.MaxInputTokens}, {"max_file_bytes", c.MaxFileBytes}, {"max_body_bytes", c.MaxBodyBytes},
		{"refusal_cache_size", c.RefusalCacheSize}} {
		if n.v < 0 {
			bad(n.key, n.v, "must not be negative")
		}
	}
	if c.MaxTrackedKeys < 1 {
		bad("max_tracked_keys", c.MaxTrackedKeys, "must be at least 1")
	}
	if len(c.ProtectedPaths) == 0 {
		bad("protected_paths", c.ProtectedPaths, "empty: list at least one path")
	}
	for _, p := range c.ProtectedPaths {
		if err := checkProtectedPath(p); err != nil {
			bad("protected_paths", p, "%v", err)
		}
	}
	for _, p := range c.TrustedProxies {
		if _, err := ParsePrefix(p); err != nil {
			bad("trusted_proxies", p, "not a CIDR or IP address")
		}
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		bad("ipv6_prefix", c.IPv6Prefix, "must be between 1 and 128")
	}
	if c.RedisURL != "" {
		if _, err := limits.ParseRedisURL(c.RedisURL); err != nil {
			bad("redis_url", c.RedisURL, "%v", err)
		}
	}
	if c.RedisTimeout <= 0 {
		bad("redis_timeout", durationText(c.RedisTimeout), "must be positive")
	}
	if c.RedisInstances < 1 {
		bad("redis_instances", c.RedisInstances, "must be at least 1")
	}
	if c.UpstreamTimeout <= 0 {
		bad("upstream_timeout", durationText(c.UpstreamTimeout), "must be positive")
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown_timeout", durationText(c.ShutdownTimeout), "must not be negative")
	}
	oneOf := func(key, v string, allowed ...string) {
		if !slices.Contains(allowed, v) {
			bad(key, v, "must be one of %s", strings.Join(allowed, ", "))
		}
	}
	oneOf("error_format", c.ErrorFormat, "auto", "flat")
	oneOf("fail_open", c.FailOpen, FailOpenTrue, FailOpenFalse, FailOpenLocal)
	oneOf("log_level", c.LogLevel, "debug", "info", "warn", "error")
	oneOf("log_format", c.LogFormat, "text", "json")
	if c.TierFrom != "" {
		if err := checkTierFrom(c.TierFrom, c.JWT()); err != nil {
			bad("tier_from", c.TierFrom, "%v", err)
		}
	}
	if c.MaxDelayed < 0 {
		bad("max_delayed", c.MaxDelayed, "must not be negative")
	}
	if c.OutputTokenReserve < 0 {
		bad("output_token_reserve", c.OutputTokenReserve, "must not be negative")
	}
	if c.OutputTokenReserveMin < 0 {
		bad("output_token_reserve_min", c.OutputTokenReserveMin, "must not be negative")
	}
	errs = append(errs, c.validateJWT()...)
	if c.StateFlushInterval < 100*time.Millisecond {
		bad("state_flush_interval", durationText(c.StateFlushInterval), "must be at least 100ms")
	}
	if c.APIKeysFile != "" {
		if _, err := LoadAPIKeys(c.APIKeysFile); err != nil {
			bad("api_keys_file", c.APIKeysFile, "%s", strings.ReplaceAll(strings.ReplaceAll(err.Error(), c.APIKeysFile+": ", ""), "\n", "; "))
		}
	}
	if strings.ContainsAny(c.UpstreamAuthorization, "\r\n\x00") {
		bad("upstream_authorization", Redacted, "must be one line (it is sent as a header)")
	}
	errs = append(errs, c.validateRules()...)
	errs = append(errs, c.validateGroups()...)
	return errors.Join(errs...)
}

// checkProtectedPath checks one PROTECTED_PATHS entry (SPEC §3): a path
// from the root, without query, fragment or spaces, where * stands for one
// whole segment, or as the last segment for a prefix.
func checkProtectedPath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") || strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("a path starts with / and has no query, fragment or spaces")
	}
	for seg := range strings.SplitSeq(p[1:], "/") {
		if strings.Contains(seg, "*") && seg != "*" {
			return errors.New("* must be a whole path segment (/openai/deployments/*/chat/completions), or the last one for a prefix (/v1/*)")
		}
	}
	return nil
}

// loopbackAddr reports whether a listener on addr is reachable from this
// machine only: 127.0.0.0/8, ::1 or localhost (an empty host is every
// interface).
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// validateJWT checks the JWT settings (SPEC §7.5): a JWKS is a file path
// or an https:// URL (http:// only to a loopback host, such as a sidecar),
// the refresh at least 1 s, the subject claim named.
func (c *Config) validateJWT() []error {
	var errs []error
	bad := func(key string, v any, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s = %s: %s", c.name(key), quote(v, isSecret(key)), fmt.Sprintf(format, args...)))
	}
	if j := c.JWTJWKS; j != "" && strings.Contains(j, "://") {
		u, err := url.Parse(j)
		switch {
		case err != nil || u.Host == "":
			bad("jwt_jwks", j, "not a URL")
		case u.Scheme == "https":
		case u.Scheme == "http" && loopbackAddr(net.JoinHostPort(u.Hostname(), "0")):
		default:
			bad("jwt_jwks", j, "a key set is fetched over https:// (http:// only from a loopback host), or read from a file path")
		}
	}
	if c.JWTJWKSRefresh < time.Second {
		bad("jwt_jwks_refresh", durationText(c.JWTJWKSRefresh), "must be at least 1s")
	}
	if strings.TrimSpace(c.JWTSubjectClaim) == "" {
		bad("jwt_subject_claim", c.JWTSubjectClaim, "must name a claim (sub)")
	}
	return errs
}

func isSecret(key string) bool {
	for _, s := range settings {
		if s.key == key {
			return s.secret
		}
	}
	return false
}

func checkURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("scheme must be %s", strings.Join(schemes, " or "))
	}
	if u.Host == "" && u.Scheme != "unix" {
		return errors.New("no host")
	}
	return nil
}

func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("not host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return errors.New("bad port")
	}
	return nil
}

// ParsePrefix reads a CIDR, or a bare IP as its single-address prefix.
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// Write prints the effective configuration as TOML, secrets redacted, in
// the order of SPEC §2; each line says where its value came from.
func (c *Config) Write(w io.Writer) error {
	for _, s := range settings {
		v := s.Shown(c)
		line := fmt.Sprintf("%s = %s", s.key, tomlValue(v))
		if s.key == "chat_rpm" && !c.ChatRPMRule() {
			// Printed, it would be set, and a set chat_rpm makes the
			// built-in rule beside the file's rules.
			line = "# " + line + " (unset: the rules below replace the built-in rule)"
		}
		switch c.set[s.key] {
		case "env":
			line += " # from " + strings.ToUpper(s.key)
		case "file":
			line += " # from the file"
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	if err := c.writeRules(w); err != nil {
		return err
	}
	if err := c.writePrices(w); err != nil {
		return err
	}
	return c.writeUpstreamGroups(w)
}

// Shown is the setting's value as it may be shown: a URL's password and
// query hidden, a hidden secret replaced by Redacted when set.
func (s *setting) Shown(c *Config) any {
	v := s.show(c)
	switch {
	case s.hidden:
		if v.(string) != "" {
			return Redacted
		}
	case s.secret:
		return redactURL(v.(string))
	}
	return v
}

var userinfo = regexp.MustCompile(`//[^/@]*@`)

// redactURL hides a URL's password (and query, which may carry tokens).
func redactURL(raw string) string {
	if raw == "" {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		// Unparsable: still show it, less anything that may be a password.
		return userinfo.ReplaceAllString(raw, "//xxxxx@")
	}
	if u.RawQuery != "" {
		u.RawQuery = "redacted"
	}
	return u.Redacted()
}

func tomlValue(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case []string:
		q := make([]string, len(x))
		for i, s := range x {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	default:
		return fmt.Sprint(x)
	}
}
