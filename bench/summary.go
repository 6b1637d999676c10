package main

import (
	"fmt"
	"os"
	"strings"
)

// The summary of BENCHMARKS.md: how many of the targets in the generated
// tables are met, per broker, and which are missed, derived from the tables'
// rows (a row whose last cell is "met" or "**missed**") so that it can never
// disagree with them. updateMarkdown writes it again whenever it writes a
// section; `go run . -summary` writes it alone, from the file's tables.

const (
	summaryBegin = "<!-- bench:summary:begin"
	summaryEnd   = "<!-- bench:summary:end -->\n"
)

// targetRow is one row of a Targets table.
type targetRow struct {
	table, target, measured string
	met                     bool
}

// brokerTargets is one broker section's Targets rows.
type brokerTargets struct {
	key, heading string
	rows         []targetRow
}

// parseTargets reads the Targets rows of every broker section of doc, in
// the order of the sections.
func parseTargets(doc string) []brokerTargets {
	var out []brokerTargets
	for _, key := range []string{"kfake", "kafka"} {
		begin := fmt.Sprintf("<!-- bench:%s:begin", key)
		end := fmt.Sprintf("<!-- bench:%s:end -->", key)
		i := strings.Index(doc, begin)
		if i < 0 {
			continue
		}
		j := strings.Index(doc[i:], end)
		if j < 0 {
			continue
		}
		bt := brokerTargets{key: key, heading: key}
		table := ""
		for _, line := range strings.Split(doc[i:i+j], "\n") {
			switch {
			case strings.HasPrefix(line, "## "):
				bt.heading = strings.TrimPrefix(line, "## ")
			case strings.HasPrefix(line, "### "):
				table = strings.TrimPrefix(line, "### ")
			case strings.HasPrefix(line, "|"):
				cells := splitRow(line)
				if len(cells) < 3 {
					continue
				}
				verdict := cells[len(cells)-1]
				if verdict != "met" && verdict != "**missed**" {
					continue
				}
				bt.rows = append(bt.rows, targetRow{table: table, target: cells[0], measured: cells[len(cells)-2], met: verdict == "met"})
			}
		}
		out = append(out, bt)
	}
	return out
}

// splitRow splits a markdown table row into its trimmed cells. A cell's
// text may hold `|` only inside backquotes, as the tables write it.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	var cells []string
	var cur strings.Builder
	code := false
	for _, r := range line {
		switch {
		case r == '`':
			code = !code
			cur.WriteRune(r)
		case r == '|' && !code:
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// summaryBlock is the summary of doc's Targets rows, with its markers; ""
// when doc has none.
func summaryBlock(doc string) string {
	brokers := parseTargets(doc)
	total := 0
	for _, b := range brokers {
		total += len(b.rows)
	}
	if total == 0 {
		return ""
	}
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	p("%s (written by bench/ from the Targets tables above, do not edit by hand) -->\n", summaryBegin)
	p("## Targets met and missed\n\n")
	p("Counted from the Targets tables of the sections above, as their runs wrote them.\n\n")
	p("| broker | targets | met | missed |\n|---|---:|---:|---:|\n")
	for _, b := range brokers {
		missed := 0
		for _, r := range b.rows {
			if !r.met {
				missed++
			}
		}
		p("| %s | %d | %d | %d |\n", b.heading, len(b.rows), len(b.rows)-missed, missed)
	}
	for _, b := range brokers {
		var lines []string
		for _, r := range b.rows {
			if !r.met {
				lines = append(lines, fmt.Sprintf("- %s (%s): %s\n", r.target, r.table, r.measured))
			}
		}
		if len(lines) == 0 {
			p("\nMissed on %s: none.\n", b.heading)
			continue
		}
		p("\nMissed on %s:\n\n%s", b.heading, strings.Join(lines, ""))
	}
	p("%s", summaryEnd)
	return w.String()
}

// withSummary returns doc with its summary block written again from its
// tables: in place, or after the last broker section when doc has none yet.
// A doc without Targets rows is returned as it is.
func withSummary(doc string) string {
	block := summaryBlock(doc)
	if i := strings.Index(doc, summaryBegin); i >= 0 {
		if j := strings.Index(doc[i:], summaryEnd); j >= 0 {
			return doc[:i] + block + doc[i+j+len(summaryEnd):]
		}
		return doc // a begin marker without its end: left for a person to see
	}
	if block == "" {
		return doc
	}
	at := -1
	for _, key := range []string{"kfake", "kafka"} {
		end := fmt.Sprintf("<!-- bench:%s:end -->\n", key)
		if k := strings.Index(doc, end); k >= 0 && k+len(end) > at {
			at = k + len(end)
		}
	}
	if at < 0 {
		return doc
	}
	return doc[:at] + "\n" + block + doc[at:]
}

// writeSummary writes path's summary block again from its tables
// (`go run . -summary`).
func writeSummary(path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := withSummary(string(old))
	if doc == string(old) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
