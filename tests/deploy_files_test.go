package tests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The rules load, and their unit tests pass; deploy/prometheus.yml (the
// compose Prometheus's configuration) loads them by its relative path.
func TestDeployPromtool(t *testing.T) {
	promtool := requireProm(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", alertsPath},
		{"test", "rules", alertsTestPath},
		{"check", "config", promConfigPath},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, promtool, args...).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// grafanaDashboard is the part of the dashboard JSON the tests read.
type grafanaDashboard struct {
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// queryPanels are the dashboard's panels that run queries, rows' included.
func (d grafanaDashboard) queryPanels() []grafanaPanel {
	var out []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// variableQueries are the label_values(metric, label) queries of the
// dashboard's query variables, keyed by variable name.
func (d grafanaDashboard) variableQueries(t *testing.T) map[string][2]string {
	t.Helper()
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	out := map[string][2]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
		}
		out[v.Name] = [2]string{m[1], m[2]}
	}
	return out
}

// Every panel queries the ${datasource} variable's Prometheus, and every
// selector of our families follows the job and instance variables.
func TestDeployDashboardFile(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, schemaVersion %d: want a uid and a schema of Grafana 10 or later", d.UID, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"datasource": "datasource", "job": "query", "instance": "query"} {
		if vars[name] != typ {
			t.Errorf("template variable %q: type %q, want %q", name, vars[name], typ)
		}
	}
	d.variableQueries(t)

	selector := regexp.MustCompile(`\bratelimit_proxy_\w+(\{[^}]*\})?`)
	ids := map[int]string{}
	var all []grafanaPanel
	all = append(all, d.Panels...)
	for _, p := range d.Panels {
		all = append(all, p.Panels...)
	}
	for _, p := range all {
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
		}
	}
	for _, p := range d.queryPanels() {
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(m[1], `job=~"$job"`) || !strings.Contains(m[1], `instance=~"$instance"`) {
					t.Errorf("panel %q, query %s: %s does not select $job and $instance", p.Title, tg.RefID, m[0])
				}
			}
		}
	}
}

// compose.yaml mounts files that exist, the Grafana provider reads the
// directory the dashboard is mounted in, and the data source is the
// compose Prometheus. (No YAML parser here: compose.yaml is checked by
// the lines an operator would read.)
func TestDeployComposeFiles(t *testing.T) {
	compose := readText(t, composePath)
	mount := regexp.MustCompile(`(?m)^\s*-\s*(\./[^:\s]+):([^:\s]+)(:ro)?\s*$`)
	targets := map[string]string{}
	for _, m := range mount.FindAllStringSubmatch(compose, -1) {
		if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
			t.Errorf("compose.yaml mounts %s, which does not exist: %v", m[1], err)
		}
		targets[m[1]] = m[2]
	}
	for _, src := range []string{"./deploy/prometheus.yml", "./deploy/prometheus",
		"./deploy/grafana/provisioning/datasources", "./deploy/grafana/provisioning/dashboards",
		"./deploy/grafana/ratelimit-proxy.json"} {
		if targets[src] == "" {
			t.Errorf("compose.yaml does not mount %s", src)
		}
	}
	if !regexp.MustCompile(`(?m)^\s*-\s*prometheus/alerts\.yml\s*$`).MatchString(readText(t, promConfigPath)) ||
		targets["./deploy/prometheus"] != "/etc/prometheus/prometheus" {
		t.Errorf("the compose Prometheus does not load the rules: deploy/prometheus.yml must name prometheus/alerts.yml and compose.yaml mount ./deploy/prometheus at /etc/prometheus/prometheus (got %q)", targets["./deploy/prometheus"])
	}
	provider := readText(t, "../deploy/grafana/provisioning/dashboards/dashboards.yaml")
	m := regexp.MustCompile(`(?m)^\s*path:\s*(\S+)\s*$`).FindStringSubmatch(provider)
	if m == nil || filepath.Dir(targets["./deploy/grafana/ratelimit-proxy.json"]) != m[1] {
		t.Errorf("the dashboard provider reads %v, the dashboard is mounted at %q", m, targets["./deploy/grafana/ratelimit-proxy.json"])
	}
	ds := readText(t, "../deploy/grafana/provisioning/datasources/prometheus.yaml")
	if !strings.Contains(ds, "url: http://prometheus:9090") || !strings.Contains(ds, "type: prometheus") {
		t.Errorf("the data source is not the compose Prometheus:\n%s", ds)
	}
	for _, port := range regexp.MustCompile(`(?m)^\s*-\s*"([^"]+:\d+:\d+)"`).FindAllStringSubmatch(compose, -1) {
		if !strings.HasPrefix(port[1], "127.0.0.1:") {
			t.Errorf("compose.yaml publishes %s beyond loopback", port[1])
		}
	}
	if !strings.Contains(compose, `"127.0.0.1:3000:3000"`) {
		t.Error("compose.yaml does not publish Grafana on 127.0.0.1:3000")
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
