package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The example file documents every key with its default value.
func TestExampleMatchesDefaults(t *testing.T) {
	c, err := config.Load("../config.example.toml", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.UpstreamURL = c.UpstreamURL
	var got strings.Builder
	var exp strings.Builder
	c.Write(&got)
	want.Write(&exp)
	// Compare what -check prints, minus the provenance comments.
	strip := func(s string) string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			out = append(out, strings.SplitN(l, " #", 2)[0])
		}
		return strings.Join(out, "\n")
	}
	if strip(got.String()) != strip(exp.String()) {
		t.Fatalf("example differs from defaults:\n%s\nwant:\n%s", got.String(), exp.String())
	}
	for _, key := range config.Keys() {
		if !c.IsSet(key) {
			t.Errorf("config.example.toml does not document %s", key)
		}
	}
}

func TestEnvOverridesFile(t *testing.T) {
	p := writeFile(t, "upstream_url = \"http://up:1\"\nchat_rpm = 5\ntrusted_proxies = [\"10.0.0.0/8\"]\n")
	c, err := config.Load(p, env(map[string]string{"CHAT_RPM": "7", "TRUSTED_PROXIES": "192.168.0.0/16, 127.0.0.1", "UPSTREAM_TIMEOUT": "2s"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.ChatRPM != 7 || c.UpstreamURL != "http://up:1" || c.UpstreamTimeout != 2*time.Second {
		t.Fatalf("got %+v", c)
	}
	if !reflect.DeepEqual(c.TrustedProxies, []string{"192.168.0.0/16", "127.0.0.1"}) {
		t.Fatalf("trusted proxies %q", c.TrustedProxies)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestMaxBodyBytesFollowsMaxFileBytes(t *testing.T) {
	c, err := config.Load("", env(map[string]string{"MAX_FILE_BYTES": "1000"}))
	if err != nil || c.MaxBodyBytes != 1000+1<<20 {
		t.Fatalf("%v %d", err, c.MaxBodyBytes)
	}
	c, err = config.Load("", env(map[string]string{"MAX_FILE_BYTES": "1000", "MAX_BODY_BYTES": "5"}))
	if err != nil || c.MaxBodyBytes != 5 {
		t.Fatalf("%v %d", err, c.MaxBodyBytes)
	}
}

// Every problem is reported at once, each naming its key and value.
func TestErrorsNameKeyAndValue(t *testing.T) {
	p := writeFile(t, "chat_rpm = -1\nupstream_timeout = 10\nbogus = 1\nlog_format = \"xml\"\n")
	_, err := config.Load(p, env(map[string]string{"MAX_FILE_BYTES": "ten", "REQUIRE_AUTH": "maybe"}))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`upstream_timeout = 10: missing unit`,
		`bogus (in ` + p + `): unknown key`,
		`MAX_FILE_BYTES = "ten": not an integer`,
		`REQUIRE_AUTH = "maybe": not a boolean`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	c, _ := config.Load(writeFile(t, "chat_rpm = -1\nlog_format = \"xml\"\n"), env(map[string]string{
		"UPSTREAM_URL": "ftp://x", "TRUSTED_PROXIES": "10.0.0.0/33", "IPV6_PREFIX": "0", "LISTEN_ADDR": "nope",
		"UPSTREAM_TIMEOUT": "0s",
	}))
	err = c.Validate()
	for _, want := range []string{
		`chat_rpm = -1: must not be negative`,
		`log_format = "xml": must be one of text, json`,
		`UPSTREAM_URL = "ftp://x": scheme must be http or https`,
		`TRUSTED_PROXIES = "10.0.0.0/33": not a CIDR`,
		`IPV6_PREFIX = 0: must be between 1 and 128`,
		`LISTEN_ADDR = "nope": not host:port`,
		`UPSTREAM_TIMEOUT = "0s": must be positive`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

func TestUpstreamRequiredUnlessDemo(t *testing.T) {
	c, err := config.Load("", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "upstream_url: required") {
		t.Fatalf("got %v", err)
	}
	c.Demo = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteRedactsSecrets(t *testing.T) {
	c, err := config.Load("", env(map[string]string{"UPSTREAM_URL": "https://user:hunter2@api.example/v1?key=sk-123", "REDIS_URL": "redis://:s3cret@redis:6379/0"}))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	c.Write(&b)
	if strings.Contains(b.String(), "hunter2") || strings.Contains(b.String(), "sk-123") || strings.Contains(b.String(), "s3cret") {
		t.Fatalf("secret printed:\n%s", b.String())
	}
	if !strings.Contains(b.String(), `upstream_url = "https://user:xxxxx@api.example/v1?redacted" # from UPSTREAM_URL`) {
		t.Fatalf("got:\n%s", b.String())
	}
}

func TestFailOpenModes(t *testing.T) {
	for in, want := range map[string]string{"true": "true", "1": "true", "FALSE": "false", "local": "local"} {
		c, err := config.Load("", env(map[string]string{"FAIL_OPEN": in}))
		if err != nil || c.FailOpen != want {
			t.Errorf("%q: %q %v", in, c.FailOpen, err)
		}
	}
	if _, err := config.Load("", env(map[string]string{"FAIL_OPEN": "maybe"})); err == nil || !strings.Contains(err.Error(), `FAIL_OPEN = "maybe": must be true, false or "local"`) {
		t.Errorf("got %v", err)
	}
	c, _ := config.Load(writeFile(t, "fail_open = false\n"), env(nil))
	if c.FailOpen != "false" {
		t.Errorf("TOML boolean: %q", c.FailOpen)
	}
}

func TestUnreadableFileIsTheOnlyError(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "missing.toml"), env(nil))
	if !errors.Is(err, config.ErrFile) || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("got %v", err)
	}
	_, err = config.Load(writeFile(t, "upstream_url = \n"), env(nil))
	if !errors.Is(err, config.ErrFile) {
		t.Fatalf("TOML syntax error: %v", err)
	}
}

func TestBadURLIsShownWithoutItsPassword(t *testing.T) {
	c, _ := config.Load("", env(map[string]string{"UPSTREAM_URL": "ht!tp://user:pw@x y", "REDIS_URL": "redis://h:notaport"}))
	err := c.Validate()
	for _, want := range []string{`UPSTREAM_URL = "ht!tp://xxxxx@x y": not a URL`, `REDIS_URL = "redis://h:notaport"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("password shown: %v", err)
	}
}

// A * in PROTECTED_PATHS stands for one whole segment, or ends a prefix;
// anywhere else it is an error naming the key and the value.
func TestProtectedPathWildcards(t *testing.T) {
	good := "/v1/chat/completions,/openai/deployments/*/chat/completions,/v2/*,/*,/a/*/b/*"
	c, err := config.Load("", env(map[string]string{"UPSTREAM_URL": "http://up", "PROTECTED_PATHS": good}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("%s: %v", good, err)
	}
	c, err = config.Load("", env(map[string]string{"UPSTREAM_URL": "http://up", "PROTECTED_PATHS": "/v1/chat*,/openai/*deployments/x,/v2/**,v1/x,/a b,/x?y=1"}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{
		`PROTECTED_PATHS = "/v1/chat*": * must be a whole path segment`,
		`PROTECTED_PATHS = "/openai/*deployments/x": * must be a whole path segment`,
		`PROTECTED_PATHS = "/v2/**": * must be a whole path segment`,
		`PROTECTED_PATHS = "v1/x": a path starts with /`,
		`PROTECTED_PATHS = "/a b": a path starts with /`,
		`PROTECTED_PATHS = "/x?y=1": a path starts with /`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// OUTPUT_TOKEN_RESERVE is a number or "learned", in either place, and
// -check prints what it read back.
func TestOutputTokenReserveLearned(t *testing.T) {
	for _, in := range []string{"learned", " LEARNED "} {
		c, err := config.Load("", env(map[string]string{"OUTPUT_TOKEN_RESERVE": in, "OUTPUT_TOKEN_RESERVE_MIN": "64"}))
		if err != nil || !c.OutputReserveLearned || c.OutputTokenReserveMin != 64 {
			t.Errorf("%q: learned %v, min %d, %v", in, c.OutputReserveLearned, c.OutputTokenReserveMin, err)
		}
	}
	c, err := config.Load(writeFile(t, "output_token_reserve = \"learned\"\n"), env(nil))
	if err != nil || !c.OutputReserveLearned || c.OutputTokenReserveMin != 256 {
		t.Fatalf("TOML: learned %v, min %d, %v", c.OutputReserveLearned, c.OutputTokenReserveMin, err)
	}
	var out strings.Builder
	c.Write(&out)
	if !strings.Contains(out.String(), "output_token_reserve = \"learned\"") {
		t.Fatalf("-check prints:\n%s", out.String())
	}
	back, err := config.Load(writeFile(t, out.String()), env(nil))
	if err != nil || !back.OutputReserveLearned {
		t.Fatalf("round trip: %v %v", back.OutputReserveLearned, err)
	}
	c, err = config.Load(writeFile(t, "output_token_reserve = 300\n"), env(map[string]string{}))
	if err != nil || c.OutputReserveLearned || c.OutputTokenReserve != 300 {
		t.Fatalf("a number: %v %d %v", c.OutputReserveLearned, c.OutputTokenReserve, err)
	}
	for in, want := range map[string]string{
		"lots": `OUTPUT_TOKEN_RESERVE = "lots": must be a number of tokens or "learned"`,
		"-1":   `OUTPUT_TOKEN_RESERVE = -1: must not be negative`,
	} {
		c, err := config.Load("", env(map[string]string{"OUTPUT_TOKEN_RESERVE": in, "UPSTREAM_URL": "http://127.0.0.1:1"}))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %s", in, err, want)
		}
	}
}
