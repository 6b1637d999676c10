package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The summary counts the Targets rows of each broker section and lists the
// missed ones, whatever table they are in; it is written in place of the
// old one, or after the last section, and text after it is kept.
func TestSummaryFromTables(t *testing.T) {
	doc := mdHeader +
		"<!-- bench:kfake:begin (x) -->\n## In-process broker: kfake\n\n### Targets (ratios from this run)\n\n" +
		"| target | measured | |\n|---|---:|---|\n" +
		"| a >= 1x | 2x | met |\n| b `x|y` <= 10% | 12% | **missed** |\n\n" +
		"### Metrics (tidemark)\n\n| figure | value |\n|---|---:|\n| scrape | 1 ms |\n\n" +
		"### Targets: metrics (from this run)\n\n| target | measured | |\n|---|---|---|\n| c < 1% | 1.2% | **missed** |\n" +
		"<!-- bench:kfake:end -->\n\n" +
		"<!-- bench:kafka:begin (x) -->\n## Real broker: Apache Kafka\n\n### Targets (ratios from this run)\n\n" +
		"| target | measured | |\n|---|---:|---|\n| a >= 1x | 3x | met |\n<!-- bench:kafka:end -->\n\n" +
		"## Notes\n\nhand-written, kept\n"
	got := withSummary(doc)
	for _, want := range []string{
		"| In-process broker: kfake | 3 | 1 | 2 |\n",
		"| Real broker: Apache Kafka | 1 | 1 | 0 |\n",
		"- b `x|y` <= 10% (Targets (ratios from this run)): 12%\n",
		"- c < 1% (Targets: metrics (from this run)): 1.2%\n",
		"Missed on Real broker: Apache Kafka: none.\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary without %q:\n%s", want, got)
		}
	}
	if i, j := strings.Index(got, "<!-- bench:kafka:end -->"), strings.Index(got, summaryBegin); j < i {
		t.Errorf("the summary is not after the last section:\n%s", got)
	}
	if !strings.HasSuffix(got, "<!-- bench:summary:end -->\n\n## Notes\n\nhand-written, kept\n") {
		t.Errorf("the text after the sections was not kept after the summary:\n%s", got)
	}
	// Written again in place: one summary, with the new counts.
	again := withSummary(strings.Replace(got, "| a >= 1x | 3x | met |", "| a >= 1x | 0.5x | **missed** |", 1))
	if strings.Count(again, summaryBegin) != 1 || !strings.Contains(again, "| Real broker: Apache Kafka | 1 | 0 | 1 |\n") {
		t.Errorf("rewritten summary:\n%s", again)
	}
	// No Targets rows: nothing added.
	if plain := mdHeader + "<!-- bench:kafka:begin (x) -->\nkept\n<!-- bench:kafka:end -->\n"; withSummary(plain) != plain {
		t.Errorf("a summary was added to a document without targets")
	}
}

// BENCHMARKS.md's summary is the one its tables give: `go run . -summary`
// has been run since they last changed.
func TestBenchmarksSummaryUpToDate(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.Contains(doc, summaryBegin) {
		t.Fatal("BENCHMARKS.md has no summary block: cd bench && go run . -summary")
	}
	if withSummary(doc) != doc {
		t.Fatal("BENCHMARKS.md's summary disagrees with its tables: cd bench && go run . -summary")
	}
}
