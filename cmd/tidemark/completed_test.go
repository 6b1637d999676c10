package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// completedFixture writes an offset file whose partitions have offsets
// completed above their watermarks, and one without, at fixed times.
func completedFixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "offsets.db")
	st, err := offsetfile.Open(path, nil)
	must(t, err)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	k := func(p int32) offsetfile.Key { return offsetfile.Key{Group: "billing", Topic: "orders", Partition: p} }
	must(t, st.Put(k(0), offsetfile.Record{Watermark: 1000, RecordedAt: at(1), Generation: 3, Member: "tidemark-aaaa",
		Committed: 990, CommittedAt: at(1),
		Completed: []offsetfile.Range{{From: 1001, To: 1200}, {From: 1500, To: 2534}, {From: 5677, To: 5679}}}))
	must(t, st.Put(k(1), offsetfile.Record{Watermark: 7, RecordedAt: at(2), Generation: 3, Member: "tidemark-aaaa",
		Committed: 7, CommittedAt: at(2), Completed: []offsetfile.Range{{From: 9, To: 10}}}))
	must(t, st.Put(k(2), offsetfile.Record{Watermark: 50, RecordedAt: at(3), Generation: 3, Member: "tidemark-aaaa",
		Committed: 50, CommittedAt: at(3)}))
	must(t, st.Close())
	return path
}

func TestGoldenCompleted(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	path := completedFixture(t)
	m := func(s string) string { return mask(s, false, path, "FILE", filepath.Dir(path), "DIR") }

	r := tidemark(t, "inspect", path).want(t, 0,
		"partition 0: completed above watermark: 1,235 offsets in 3 ranges, up to 5678",
		"partition 1: completed above watermark: 1 offset in 1 range, up to 9")
	if strings.Contains(r.stdout, "partition 2:") {
		t.Error("a partition without completed ranges has a completed line")
	}
	golden(t, "inspect-completed", m(r.stdout))
	r = tidemark(t, "inspect", path, "--json").want(t, 0)
	golden(t, "inspect-completed.json", m(r.stdout))

	var raw struct {
		Partitions []map[string]any `json:"partitions"`
	}
	must(t, json.Unmarshal([]byte(r.stdout), &raw))
	p0 := raw.Partitions[0]
	if want := []any{[]any{1001.0, 1200.0}, []any{1500.0, 2534.0}, []any{5677.0, 5679.0}}; !reflect.DeepEqual(p0["completed_ranges"], want) ||
		p0["completed_offsets"] != 1235.0 {
		t.Errorf("partition 0 in JSON: completed_ranges %v, completed_offsets %v", p0["completed_ranges"], p0["completed_offsets"])
	}
	if _, ok := raw.Partitions[2]["completed_ranges"]; ok {
		t.Error("completed_ranges shown for a partition without ranges")
	}
	if _, ok := raw.Partitions[2]["completed_offsets"]; ok {
		t.Error("completed_offsets shown for a partition without ranges")
	}
	if !strings.Contains(r.stdout, `"completed_ranges": [
        [1001, 1200],
        [1500, 2534],
        [5677, 5679]
      ],
      "completed_offsets": 1235,`) {
		t.Errorf("ranges are not one a line:\n%s", r.stdout)
	}

	r = tidemark(t, "export", path).want(t, 0)
	golden(t, "export-completed.json", m(r.stdout))
}

func TestExportImportCompleted(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	src := completedFixture(t)
	exported := tidemark(t, "export", src).want(t, 0).stdout
	in := filepath.Join(t.TempDir(), "offsets.json")
	must(t, os.WriteFile(in, []byte(exported), 0o600))

	dst := filepath.Join(t.TempDir(), "offsets.db")
	tidemark(t, "import", dst, "--from", in).want(t, 0,
		"billing/orders/0: new: watermark 1000, committed 990, 1,235 offsets completed above the watermark",
		"billing/orders/2: new: watermark 50, committed 50\n",
		"3 partitions: 3 new")
	again := tidemark(t, "export", dst).want(t, 0).stdout
	if strings.ReplaceAll(again, dst, src) != exported {
		t.Errorf("export after import differs:\n%s\nwant:\n%s", again, exported)
	}
	tidemark(t, "import", dst, "--from", in).want(t, 0, "billing/orders/1: unchanged: watermark 7, committed 7, 1 offset completed above the watermark",
		"0 new, 0 changed, 3 unchanged")
	tidemark(t, "check", dst).want(t, 0)

	// An input without the ranges replaces the record whole: they are
	// dropped, and the line says so.
	var doc offsetsDoc
	must(t, json.Unmarshal([]byte(exported), &doc))
	doc.Groups[0].Topics[0].Partitions[0].CompletedRanges = nil
	doc.Groups[0].Topics[0].Partitions[1].CompletedRanges = []rangeDoc{{9, 12}}
	b, err := json.Marshal(doc)
	must(t, err)
	in2 := filepath.Join(t.TempDir(), "without.json")
	must(t, os.WriteFile(in2, b, 0o600))
	// Without --force, import never loses completed offsets: dropping the
	// ranges at an unchanged watermark is refused (before, it went through
	// and the consumer would have handled 1,235 offsets again).
	before := hashFile(t, dst)
	tidemark(t, "import", dst, "--from", in2).want(t, 2,
		"billing/orders/0: REFUSED: 1,235 offsets completed in the file would be lost (handled again): watermark 1000 -> 1000, offsets completed above the watermark 1,235 -> 0",
		"billing/orders/1: watermark 7 -> 7, committed 7 -> 7, offsets completed above the watermark 1 -> 3",
		"import refused, nothing written: 1 partition in "+dst+" would lose completed offsets")
	if hashFile(t, dst) != before {
		t.Fatal("a refused import changed the file")
	}
	tidemark(t, "import", dst, "--from", in2, "--force").want(t, 0,
		"billing/orders/0: watermark 1000 -> 1000, committed 990 -> 990, offsets completed above the watermark 1,235 -> 0 (loses 1,235 completed offsets: --force)",
		"billing/orders/1: watermark 7 -> 7, committed 7 -> 7, offsets completed above the watermark 1 -> 3",
		"0 new, 2 changed, 1 unchanged")
	st, err := offsetfile.Open(dst, &offsetfile.Options{ReadOnly: true})
	must(t, err)
	defer st.Close()
	k := func(p int32) offsetfile.Key { return offsetfile.Key{Group: "billing", Topic: "orders", Partition: p} }
	if r, _ := st.Get(k(0)); r.Completed != nil {
		t.Errorf("partition 0 keeps its ranges after an import without them: %v", r.Completed)
	}
	if r, _ := st.Get(k(1)); !reflect.DeepEqual(r.Completed, []offsetfile.Range{{From: 9, To: 12}}) {
		t.Errorf("partition 1 ranges after import: %v", r.Completed)
	}
}

func TestLostOffsets(t *testing.T) {
	rec := func(wm int64, rs ...int64) offsetfile.Record {
		r := offsetfile.Record{Watermark: wm}
		for i := 0; i < len(rs); i += 2 {
			r.Completed = append(r.Completed, offsetfile.Range{From: rs[i], To: rs[i+1]})
		}
		return r
	}
	for _, tc := range []struct {
		name      string
		cur, next offsetfile.Record
		want      int64
	}{
		{"same", rec(10, 12, 20), rec(10, 12, 20), 0},
		{"ranges dropped", rec(10, 12, 20, 30, 31), rec(10), 9},
		{"watermark back", rec(10), rec(4), 6},
		{"watermark back, ranges kept", rec(10, 12, 20), rec(4, 12, 20), 6},
		{"watermark forward over the ranges", rec(10, 12, 20), rec(25), 0},
		{"watermark forward into a gap, ranges dropped", rec(10, 12, 20, 30, 40), rec(15), 15},
		{"ranges grown", rec(10, 12, 20), rec(10, 11, 22), 0},
		{"ranges split", rec(10, 12, 20), rec(10, 12, 14, 16, 20), 2},
		{"no record", rec(-1), rec(0), 0},
		{"to none", rec(10, 12, 13), rec(-1), 11},
	} {
		if got := lostOffsets(tc.cur, tc.next); got != tc.want {
			t.Errorf("%s: lostOffsets = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestImportBadCompleted(t *testing.T) {
	fixedNow(t, t0)
	path := completedFixture(t)
	before := hashFile(t, path)
	dir := t.TempDir()
	valid := tidemark(t, "export", path).stdout
	p1 := `"completed_ranges": [
                [9, 10]
              ]`
	if !strings.Contains(valid, p1) {
		t.Fatalf("export has no %s:\n%s", p1, valid)
	}
	for name, tt := range map[string]struct {
		ranges string
		want   string
	}{
		"at the watermark": {`[[7, 10]]`, "completed range 0 [7, 10): starts at or below the watermark 7"},
		"touching":         {`[[8, 10], [10, 12]]`, "touching ranges must be merged"},
		"overlapping":      {`[[8, 10], [9, 12]]`, "overlaps or is below range 0 [8, 10)"},
		"empty":            {`[[9, 9]]`, "completed range 0 [9, 9): empty or reversed"},
		"three numbers":    {`[[9, 10, 11]]`, "completed range [9, 10, 11]: want [from, to]"},
		"one number":       {`[[9]]`, "completed range [9]: want [from, to]"},
		"not numbers":      {`[["9", "10"]]`, "completed range: json: cannot unmarshal string"},
		"object":           {`{"from": 9}`, "cannot unmarshal object"},
	} {
		t.Run(name, func(t *testing.T) {
			in := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
			must(t, os.WriteFile(in, []byte(strings.Replace(valid, p1, `"completed_ranges": `+tt.ranges, 1)), 0o600))
			tidemark(t, "import", path, "--from", in, "--force").want(t, 2, tt.want)
		})
	}
	if hashFile(t, path) != before {
		t.Fatal("a refused import changed the file")
	}
}

// set clears the completed ranges, and says which.
func TestSetClearsCompleted(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	path := completedFixture(t)
	m := func(s string) string { return mask(s, false, path, "FILE") }
	r := tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "0", "--offset", "1100", "--dry-run").want(t, 0,
		"note: the offsets completed above the old watermark are cleared (1,235 offsets in 3 ranges, up to 5678): the consumer handles every offset from 1100 on")
	golden(t, "set-completed-dry-run", m(r.stdout))
	tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "0", "--offset", "1100").want(t, 0, "written to")
	tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "2", "--offset", "60").want(t, 0, "written to")
	st, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	must(t, err)
	defer st.Close()
	for _, e := range st.Records() {
		want := map[int32]int64{0: 1100, 1: 7, 2: 60}[e.Partition]
		if e.Watermark != want {
			t.Errorf("partition %d: watermark %d, want %d", e.Partition, e.Watermark, want)
		}
		if e.Partition == 1 {
			if len(e.Completed) != 1 {
				t.Errorf("partition 1, not set, lost its ranges: %v", e.Completed)
			}
		} else if e.Completed != nil {
			t.Errorf("partition %d keeps ranges after set: %v", e.Partition, e.Completed)
		}
	}
	if h := tidemark(t, "help", "set"); !strings.Contains(h.stdout+h.stderr, "completed ranges") {
		t.Errorf("set's help does not mention the completed ranges:\n%s", h.stdout+h.stderr)
	}
	if h := tidemark(t, "help", "import"); !strings.Contains(h.stdout+h.stderr, "completed_ranges") {
		t.Errorf("import's help does not mention the completed ranges:\n%s", h.stdout+h.stderr)
	}
}

func TestFmtCount(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234",
		1<<63 - 1: "9,223,372,036,854,775,807"} {
		if got := inspect.FormatCount(n); got != want {
			t.Errorf("inspect.FormatCount(%d) = %q, want %q", n, got, want)
		}
	}
}

// Many ranges: inspect sums them, and export and import carry them all.
func TestCompletedManyRanges(t *testing.T) {
	fixedNow(t, t0)
	path := filepath.Join(t.TempDir(), "offsets.db")
	st, err := offsetfile.Open(path, nil)
	must(t, err)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}
	rec := offsetfile.Record{Watermark: 10, RecordedAt: t0, Committed: -1}
	for i := range int64(100_000) {
		rec.Completed = append(rec.Completed, offsetfile.Range{From: 12 + 3*i, To: 14 + 3*i})
	}
	must(t, st.Put(k, rec))
	must(t, st.Close())

	tidemark(t, "inspect", path).want(t, 0, "partition 0: completed above watermark: 200,000 offsets in 100,000 ranges, up to 300010")
	exported := tidemark(t, "export", path).want(t, 0).stdout
	in := filepath.Join(t.TempDir(), "offsets.json")
	must(t, os.WriteFile(in, []byte(exported), 0o600))
	dst := filepath.Join(t.TempDir(), "offsets.db")
	tidemark(t, "import", dst, "--from", in).want(t, 0, "g/t/0: new: watermark 10, committed -, 200,000 offsets completed above the watermark")
	st, err = offsetfile.Open(dst, &offsetfile.Options{ReadOnly: true})
	must(t, err)
	defer st.Close()
	if got, _ := st.Get(k); !reflect.DeepEqual(got.Completed, rec.Completed) {
		t.Errorf("imported %d ranges, want the %d exported", len(got.Completed), len(rec.Completed))
	}
}

func TestJoinPairs(t *testing.T) {
	for in, want := range map[string]string{
		"[\n  1,\n  2\n]":                 "[1, 2]",
		"[\n  [\n    -1,\n    20\n  ]\n]": "[\n  [-1, 20]\n]",
		"[\n  1,\n  2,\n  3\n]":           "[\n  1,\n  2,\n  3\n]",
		"[\n  1.5,\n  2\n]":               "[\n  1.5,\n  2\n]",
		"[\n  1,\n  \"2\"\n]":             "[\n  1,\n  \"2\"\n]",
		"[\n  -,\n  2\n]":                 "[\n  -,\n  2\n]",
		"[]":                              "[]",
		"[\n  1,\n  2":                    "[\n  1,\n  2",
		`{"s": "[\n  1,\n  2\n]", "e": "\"[1,2]"}`: `{"s": "[\n  1,\n  2\n]", "e": "\"[1,2]"}`,
		"{\"s\": \"\\\\\", \"r\": [\n 3,\n 4\n]}":  "{\"s\": \"\\\\\", \"r\": [3, 4]}",
	} {
		if got := string(joinPairs([]byte(in))); got != want {
			t.Errorf("joinPairs(%q) = %q, want %q", in, got, want)
		}
	}
}
