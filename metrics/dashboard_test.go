package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dashboard is examples/grafana's Grafana dashboard.
var dashboard = filepath.Join("..", "examples", "grafana", "tidemark-dashboard.json")

// TestDashboardNamesExportedMetrics reads the Grafana dashboard and checks
// that every tidemark_ identifier in its queries (panel expressions and
// template variables) names a metric the Collector exports (a histogram's
// _bucket, _sum and _count series included): renaming a metric without
// the dashboard fails here. It also checks the dashboard's shape: a
// Prometheus data source variable used by every panel, a group variable
// used by every query, balanced brackets.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	exported := map[string]bool{}
	for _, d := range defs {
		exported[d.name] = true
		if d.kind == histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[d.name+s] = true
			}
		}
	}

	// Every expr, at any depth, and the template variables' queries.
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition" || k == "query") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	ident := regexp.MustCompile(`tidemark_[A-Za-z0-9_]*`)
	used := map[string]bool{}
	panelExprs := 0
	for _, e := range exprs {
		if strings.Contains(e, "$__rate_interval") || strings.Contains(e, "[") || strings.Contains(e, "{") {
			panelExprs++
			if !strings.Contains(e, `group=~"$group"`) {
				t.Errorf("query does not filter on the group variable: %s", e)
			}
		}
		for _, pair := range []string{"()", "[]", "{}"} {
			if strings.Count(e, pair[:1]) != strings.Count(e, pair[1:]) {
				t.Errorf("unbalanced %s in %s", pair, e)
			}
		}
		for _, name := range ident.FindAllString(e, -1) {
			used[name] = true
			if !exported[name] {
				t.Errorf("%s: %s is not a metric the Collector exports, in %s", dashboard, name, e)
			}
		}
	}
	if panelExprs < 10 {
		t.Fatalf("%s: only %d panel queries found", dashboard, panelExprs)
	}
	// The panels the dashboard promises.
	for _, name := range []string{
		"tidemark_handled_messages_total", "tidemark_handler_errors_total", "tidemark_handler_retries_total",
		"tidemark_dead_lettered_messages_total", "tidemark_lag_messages", "tidemark_lag_seconds",
		"tidemark_undurable_messages", "tidemark_uncommitted_messages", "tidemark_handler_duration_seconds_bucket",
		"tidemark_offset_file_flush_duration_seconds_bucket", "tidemark_commits_total", "tidemark_rebalances_total",
		"tidemark_rebalance_seconds_total", "tidemark_partitions", "tidemark_breaker_trips_total",
	} {
		if !used[name] {
			t.Errorf("%s: no panel shows %s", dashboard, name)
		}
	}

	vars := map[string]map[string]any{}
	if tl, ok := doc["templating"].(map[string]any); ok {
		list, _ := tl["list"].([]any)
		for _, v := range list {
			if m, ok := v.(map[string]any); ok {
				name, _ := m["name"].(string)
				vars[name] = m
			}
		}
	}
	if ds := vars["datasource"]; ds == nil || ds["type"] != "datasource" || ds["query"] != "prometheus" {
		t.Errorf("%s: no Prometheus data source variable named datasource: %v", dashboard, ds)
	}
	if g := vars["group"]; g == nil || g["type"] != "query" {
		t.Errorf("%s: no query variable named group: %v", dashboard, g)
	}
	panels, _ := doc["panels"].([]any)
	for _, p := range panels {
		m, _ := p.(map[string]any)
		if m["type"] == "row" {
			continue
		}
		ds, _ := m["datasource"].(map[string]any)
		if ds["uid"] != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable: %v", m["title"], m["datasource"])
		}
		if targets, _ := m["targets"].([]any); len(targets) == 0 {
			t.Errorf("panel %q has no query", m["title"])
		}
	}
}
