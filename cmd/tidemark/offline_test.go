package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Golden outputs of every subcommand on a file with a partition in each
// state, written at fixed times.
func TestGoldenOffline(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	path := fixture(t)
	dir := filepath.Dir(path)
	m := func(s string) string { return mask(s, false, path, "FILE", dir, "DIR") }
	before := hashFile(t, path)

	r := tidemark(t, "inspect", path).want(t, 0)
	golden(t, "inspect", m(r.stdout))
	r = tidemark(t, "inspect", path, "--json").want(t, 0)
	golden(t, "inspect.json", m(r.stdout))
	snakeCaseKeys(t, "inspect --json", r.stdout)
	r = tidemark(t, "inspect", path, "--group", "billing", "--topic", "payments").want(t, 0)
	golden(t, "inspect-filtered", m(r.stdout))
	r = tidemark(t, "check", path).want(t, 0)
	golden(t, "check", maskLayout(m(r.stdout)))
	r = tidemark(t, "check", "--json", path).want(t, 0)
	golden(t, "check.json", maskLayout(m(r.stdout)))
	snakeCaseKeys(t, "check --json", r.stdout)
	r = tidemark(t, "export", path).want(t, 0)
	golden(t, "export.json", m(r.stdout))
	snakeCaseKeys(t, "export", r.stdout)
	r = tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "1", "--offset", "400", "--dry-run").want(t, 0)
	golden(t, "set-dry-run", m(r.stdout))
	if hashFile(t, path) != before {
		t.Fatal("a read command or a dry run changed the file")
	}

	r = tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "1", "--offset", "400").want(t, 0)
	golden(t, "set", m(r.stdout))
	r = tidemark(t, "inspect", path, "--topic", "orders", "--group", "billing").want(t, 0)
	golden(t, "inspect-after-set", m(r.stdout))
}

// maskLayout hides the bbolt file's size and page size, which follow the
// machine's memory page size, and its transaction id, which follows how
// many flushes group commit made.
func maskLayout(s string) string {
	s = regexp.MustCompile(`\d+ bytes, page size \d+, transaction \d+`).ReplaceAllString(s, "SIZE bytes, page size PAGE, transaction TX")
	return regexp.MustCompile(`"(size|page_size|txid)": \d+`).ReplaceAllString(s, `"$1": N`)
}

func TestExportImportRoundTrip(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	src := fixture(t)
	exported := tidemark(t, "export", src).want(t, 0).stdout
	in := filepath.Join(t.TempDir(), "offsets.json")
	must(t, os.WriteFile(in, []byte(exported), 0o600))

	// Into a new file on the "new host".
	dst := filepath.Join(t.TempDir(), "offsets.db")
	r := tidemark(t, "import", dst, "--from", in).want(t, 0, "6 partitions: 6 new, 0 changed, 0 unchanged; 2 failure entries added")
	golden(t, "import-new", mask(r.stdout, false, dst, "FILE"))
	again := tidemark(t, "export", dst).want(t, 0).stdout
	if strings.ReplaceAll(again, dst, src) != exported {
		t.Errorf("export after import differs:\n%s\nwant:\n%s", again, exported)
	}
	// The imported file is sound: counts agree with the failure entries.
	tidemark(t, "check", dst).want(t, 0, "failures  2 entries")

	// Importing the same again changes nothing and adds no entries.
	tidemark(t, "import", dst, "--from", in).want(t, 0, "0 new, 0 changed, 6 unchanged; 0 failure entries added")
	tidemark(t, "check", dst).want(t, 0, "failures  2 entries")

	// From stdin.
	old := stdin
	stdin = strings.NewReader(exported)
	t.Cleanup(func() { stdin = old })
	dst2 := filepath.Join(t.TempDir(), "offsets.db")
	tidemark(t, "import", dst2).want(t, 0, "6 new")
}

// import refuses to move a watermark back unless --force, naming how many
// offsets would be lost, and a dry run writes nothing.
func TestImportRefusesOlderWatermarks(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	path := fixture(t)
	var doc offsetsDoc
	must(t, json.Unmarshal([]byte(tidemark(t, "export", path).stdout), &doc))
	doc.Groups[1].Topics[0].Partitions[0].Watermark = 450 // billing/orders/0: 500 in the file
	doc.Groups[1].Topics[0].Partitions[2].Watermark = 350 // billing/orders/2: 300, moves forward
	b, _ := json.Marshal(doc)
	in := filepath.Join(t.TempDir(), "older.json")
	must(t, os.WriteFile(in, b, 0o600))
	before := hashFile(t, path)

	r := tidemark(t, "import", path, "--from", in).want(t, 2, "billing/orders/0: REFUSED: watermark 500 -> 450 would move back",
		"50 offsets done in the file would be lost", "import refused, nothing written: 1 partition in", "--force")
	golden(t, "import-refused", mask(r.stdout+r.stderr, false, path, "FILE"))
	tidemark(t, "import", path, "--from", in, "--force", "--dry-run").want(t, 0, "watermark 500 -> 450, committed 500 -> 500 (moves back: --force)",
		"billing/orders/2: watermark 300 -> 350", "dry run, nothing written")
	if hashFile(t, path) != before {
		t.Fatal("a refused import or a dry run changed the file")
	}
	tidemark(t, "import", path, "--from", in, "--force").want(t, 0, "0 new, 2 changed, 4 unchanged")
	st, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	must(t, err)
	defer st.Close()
	if r, _ := st.Get(offsetfile.Key{Group: "billing", Topic: "orders", Partition: 0}); r.Watermark != 450 {
		t.Errorf("watermark after --force: %d, want 450", r.Watermark)
	}
}

func TestImportBadInput(t *testing.T) {
	fixedNow(t, t0)
	path := fixture(t)
	before := hashFile(t, path)
	dir := t.TempDir()
	valid := tidemark(t, "export", path).stdout
	for name, tt := range map[string]struct {
		input string
		want  string
	}{
		"empty":          {"", "no input"},
		"not json":       {"hello", "not a tidemark-offsets document"},
		"unknown field":  {`{"format":"tidemark-offsets","version":1,"groups":[],"extra":1}`, `unknown field "extra"`},
		"other format":   {`{"format":"something","version":1,"groups":[]}`, `format "something"`},
		"newer version":  {`{"format":"tidemark-offsets","version":2,"groups":[]}`, "format version 2, this build reads version 1"},
		"trailing data":  {valid + "{}", "unexpected data after the document"},
		"negative":       {strings.Replace(valid, `"watermark": 500`, `"watermark": -5`, 1), "watermark -5: must be >= -1"},
		"bad outcome":    {strings.Replace(valid, `"outcome": "ok"`, `"outcome": "maybe"`, 1), `outcome "maybe"`},
		"twice":          {strings.Replace(valid, `"partition": 1,`, `"partition": 0,`, 1), "listed twice"},
		"empty topic":    {strings.Replace(valid, `"topic": "payments"`, `"topic": ""`, 1), "empty topic"},
		"failure action": {strings.Replace(valid, `"action": "skipped"`, `"action": "ignored"`, 1), `action "ignored"`},
	} {
		t.Run(name, func(t *testing.T) {
			in := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
			must(t, os.WriteFile(in, []byte(tt.input), 0o600))
			tidemark(t, "import", path, "--from", in).want(t, 2, tt.want)
		})
	}
	if hashFile(t, path) != before {
		t.Fatal("a refused import changed the file")
	}
	// A FIFO as input is refused, not read (it would block).
	tidemark(t, "import", path, "--from", dir).want(t, 2, "not a regular file")
}

func TestSet(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	path := fixture(t)
	before := hashFile(t, path)
	tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "9", "--offset", "1").want(t, 2,
		`has no record of group "billing" topic "orders" partition 9`, "--create")
	tidemark(t, "set", path, "--group", "nope", "--topic", "orders", "--partition", "0", "--offset", "1").want(t, 2, "--create")
	if hashFile(t, path) != before {
		t.Fatal("a refused set changed the file")
	}
	tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "9", "--offset", "1", "--create").want(t, 0,
		"old: none", "new: watermark 1", "written to")
	// Below the last commit: the note says where the consumer resumes. The
	// confirmed commit is cleared, so that a Kafka offset reset below it
	// does not read as moved back at the next start (TestSetUndoesRewind).
	tidemark(t, "set", path, "--group", "audit", "--topic", "orders", "--partition", "0", "--offset", "10").want(t, 0,
		"old: watermark 77 (recorded 2026-03-01 12:00:08.000Z, generation 9, member tidemark-dddd), committed 77",
		"new: watermark 10 (recorded 2026-03-01 13:00:00.000Z, generation 9, member tidemark-set), committed -",
		"unless it is reset in Kafka too, the consumer resumes there, not at 10", "the confirmed commit 77 is cleared")
	st, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	must(t, err)
	recs := st.Records()
	must(t, st.Close())
	got := map[string]int64{}
	for _, e := range recs {
		got[e.Group+"/"+e.Topic+"/"+string(rune('0'+e.Partition))] = e.Watermark
		if e.Group == "audit" && e.Committed != -1 {
			t.Errorf("set kept the confirmed commit %d", e.Committed)
		}
	}
	want := map[string]int64{"audit/orders/0": 10, "billing/orders/0": 500, "billing/orders/1": 480, "billing/orders/2": 300,
		"billing/orders/3": 43, "billing/orders/9": 1, "billing/payments/0": 0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("watermarks after set: %v, want %v", got, want)
	}
}

func TestUsage(t *testing.T) {
	path := fixture(t)
	tidemark(t).want(t, 2, "usage: tidemark SUBCOMMAND")
	tidemark(t, "frobnicate").want(t, 2, `unknown subcommand "frobnicate"`, "usage: tidemark SUBCOMMAND")
	tidemark(t, "help").want(t, 0, "Subcommands:")
	// Help goes to stdout, all of it (before, a subcommand's went to
	// stderr); usage errors below go to stderr.
	for _, args := range [][]string{{"help", "diff"}, {"diff", "-h"}, {"help", "inspect"}, {"inspect", "--help"}, {"help", "set"}} {
		name := args[0]
		if name == "help" {
			name = args[1]
		}
		r := tidemark(t, args...).want(t, 0, "usage: tidemark "+name, "Flags:")
		if r.stderr != "" || !strings.HasPrefix(r.stdout, "usage: tidemark "+name) {
			t.Errorf("%q: help not on stdout alone:\nstdout: %q\nstderr: %q", args, r.stdout, r.stderr)
		}
	}
	tidemark(t, "help", "diff").want(t, 0, "usage: tidemark diff FILE --brokers", "local beyond log end", "-max-pending")
	for _, args := range [][]string{
		{"inspect"},
		{"inspect", path, path},
		{"inspect", path, "--bogus"},
		{"check"},
		{"export"},
		{"import"},
		{"diff", path},
		{"diff", path, "--brokers", "127.0.0.1:1", "--timeout", "0s"},
		{"set", path},
		{"set", path, "--group", "g"},
		{"set", path, "--group", "g", "--topic", "t"},
		{"set", path, "--group", "g", "--topic", "t", "--partition", "0"},
		{"set", path, "--group", "g", "--topic", "t", "--partition", "0", "--offset", "x"},
	} {
		r := tidemark(t, args...).want(t, 2, "usage: tidemark "+args[0])
		if r.stdout != "" || !strings.Contains(r.stderr, "usage: tidemark "+args[0]) {
			t.Errorf("%q: usage error printed to stdout: %q", args, r.stdout)
		}
	}
}
