package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeListsEveryMetric: the README's Metrics table names every
// metric the Collector exports, with its type and labels, and no other.
func TestReadmeListsEveryMetric(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		t.Fatal("README.md has no Metrics section")
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	row := regexp.MustCompile("(?m)^\\| `(tidemark_[a-z_]+)` \\| (\\w+) \\| ([^|]*) \\|")
	listed := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		listed[m[1]] = m[2] + " " + strings.TrimSpace(m[3])
	}
	for _, d := range defs {
		var ls []string
		for _, l := range d.labels {
			ls = append(ls, "`"+l+"`")
		}
		want := [...]string{"counter", "gauge", "histogram"}[d.kind] + " " + strings.Join(ls, ", ")
		if got, ok := listed[d.name]; !ok {
			t.Errorf("README's Metrics table lacks %s", d.name)
		} else if got != want {
			t.Errorf("README lists %s as %q, want %q", d.name, got, want)
		}
		delete(listed, d.name)
	}
	for name := range listed {
		t.Errorf("README's Metrics table lists %s, which the Collector does not export", name)
	}
}
