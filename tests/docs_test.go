package tests

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// The user docs: README.md and docs/*.md, from the repository's root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	return append([]string{"../README.md"}, files...)
}

// TestDocsSettings: every setting the config package knows is documented
// in docs/configuration.md by its environment name, as `NAME`.
func TestDocsSettings(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	keys := config.Keys()
	if len(keys) < 20 {
		t.Fatalf("config.Keys() gave %d settings", len(keys))
	}
	for _, k := range keys {
		if env := strings.ToUpper(k); !strings.Contains(string(b), "`"+env+"`") {
			t.Errorf("docs/configuration.md does not document %s", env)
		}
	}
}

// TestDocsNoSpecSections: the user docs say the contract in their own
// words; no SPEC is in the repository to cite.
func TestDocsNoSpecSections(t *testing.T) {
	t.Parallel()
	files := append(docFiles(t), "../config.example.toml", "../prices.example.toml")
	ex, _ := filepath.Glob("../examples/policies/*.toml")
	for _, f := range append(files, ex...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.Index(string(b), "SPEC §"); i >= 0 {
			t.Errorf("%s cites the SPEC at byte %d", f, i)
		}
	}
}

// TestDocsExamplesCheck: every example policy and config.example.toml
// passes -check with the real binary (config/roundtrip_test.go checks that
// what -check prints loads back the same; this checks the command itself).
func TestDocsExamplesCheck(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../examples/policies/*.toml")
	if len(files) == 0 {
		t.Fatal("no examples/policies/*.toml")
	}
	for _, f := range append(files, "../config.example.toml") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			code, _, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1"}, "-check", "-config", f)
			if code != 0 {
				t.Errorf("-check -config %s: exit %d\n%s", f, code, errOut)
			}
		})
	}
}

// docCommand is one `ratelimit-proxy …` line of a ```sh block.
type docCommand struct {
	where string // file:line
	line  string
}

func docCommands(t *testing.T) []docCommand {
	t.Helper()
	var out []docCommand
	for _, f := range docFiles(t) {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		inSh, n := false, 0
		for sc.Scan() {
			n++
			l := sc.Text()
			switch {
			case strings.HasPrefix(l, "```"):
				inSh = !inSh && strings.TrimSpace(strings.TrimPrefix(l, "```")) == "sh"
			case inSh && strings.HasPrefix(l, "ratelimit-proxy "):
				out = append(out, docCommand{strings.TrimPrefix(f, "../") + ":" + strconv.Itoa(n), l})
			}
		}
		fh.Close()
	}
	return out
}

var exitComment = regexp.MustCompile(`#\s*exit\s+(\d+)`)

// TestDocsCommands runs every line of a ```sh block in README.md and
// docs/*.md that starts with "ratelimit-proxy " with the built binary,
// from the repository's root, with UPSTREAM_URL=http://127.0.0.1:1 and
// nothing else in the environment. The rules that make them harmless:
//
//   - a trailing "# …" comment is dropped; "# exit N" in it is the exit
//     code the doc promises (else 0);
//   - "< FILE" is not read: the subcommand gets a harmless standard input
//     ("key": an API key; "tokens": a small chat body; anything else:
//     nothing);
//   - a command that would start the proxy (no subcommand, no -check) is
//     run with -check appended, so it validates instead of serving;
//   - -mock (serves until stopped, has no -check) is skipped;
//   - a -config file that does not exist in the repository is replaced
//     by config.example.toml, unless the doc expects a non-zero exit, in
//     which case a file with a bad value is given.
func TestDocsCommands(t *testing.T) {
	t.Parallel()
	cmds := docCommands(t)
	if len(cmds) < 5 {
		t.Fatalf("found %d ratelimit-proxy commands in ```sh blocks; the docs show more", len(cmds))
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("upstream_url = \"http://127.0.0.1:1\"\nchat_rpm = -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		t.Run(c.where, func(t *testing.T) {
			t.Parallel()
			line, want := c.line, 0
			if i := strings.Index(line, "#"); i >= 0 {
				if m := exitComment.FindStringSubmatch(line[i:]); m != nil {
					want, _ = strconv.Atoi(m[1])
				}
				line = line[:i]
			}
			var stdin string
			if i := strings.Index(line, "<"); i >= 0 {
				line = line[:i]
			}
			args := strings.Fields(line)[1:]
			sub := ""
			if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
				sub = args[0]
			}
			switch sub {
			case "key":
				stdin = "Bearer sk-docs-test-key\n"
			case "tokens":
				stdin = `{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}`
			}
			hasCheck := false
			for i, a := range args {
				switch a {
				case "-mock":
					t.Skip("-mock serves until stopped and has no -check")
				case "-check":
					hasCheck = true
				case "-config":
					if i+1 < len(args) {
						if _, err := os.Stat(filepath.Join("..", args[i+1])); err != nil {
							if want != 0 {
								args[i+1] = bad
							} else {
								args[i+1] = "config.example.toml"
							}
						}
					}
				}
			}
			if sub == "" && !hasCheck {
				args = append(args, "-check")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binPath, args...)
			cmd.Dir = ".."
			cmd.Env = envList(map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1"})
			cmd.Stdin = strings.NewReader(stdin)
			out, err := cmd.CombinedOutput()
			if err != nil && cmd.ProcessState == nil {
				t.Fatalf("%s: %v", c.line, err)
			}
			if got := cmd.ProcessState.ExitCode(); got != want {
				t.Errorf("%s (run as %q): exit %d, want %d\n%s", c.line, args, got, want, out)
			}
		})
	}
}
