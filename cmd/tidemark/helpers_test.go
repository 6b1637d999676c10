package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestMain(m *testing.M) {
	flag.Parse()
	goleak.VerifyTestMain(m)
}

// result is one run of the command.
type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// tidemark runs the command in-process, as main would, and checks that it
// returned within 3 seconds unless allowed longer.
func tidemark(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	start := time.Now()
	err := run(args, &out, &errb)
	r := result{took: time.Since(start)}
	r.code = report(err, &errb)
	r.stdout, r.stderr = out.String(), errb.String()
	t.Logf("tidemark %s: exit %d in %v\n%s%s", strings.Join(args, " "), r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
	return r
}

func (r result) want(t *testing.T, code int, substrs ...string) result {
	t.Helper()
	if r.code != code {
		t.Errorf("exit status %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range substrs {
		if !strings.Contains(r.stdout+r.stderr, s) {
			t.Errorf("output does not contain %q\nstdout: %s\nstderr: %s", s, r.stdout, r.stderr)
		}
	}
	return r
}

// fixedNow pins the command's clock for the test.
func fixedNow(t *testing.T, at time.Time) {
	old := now
	now = func() time.Time { return at }
	t.Cleanup(func() { now = old })
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture writes an offset file with one partition in every state the
// commands show, at fixed times, and returns its path.
func fixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "offsets.db")
	st, err := offsetfile.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := func(g, tp string, p int32) offsetfile.Key { return offsetfile.Key{Group: g, Topic: tp, Partition: p} }
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	must(t, st.Put(k("billing", "orders", 0), offsetfile.Record{Watermark: 500, RecordedAt: at(1), Generation: 3,
		Member: "tidemark-aaaa", Committed: 500, CommittedAt: at(2),
		Run:        &offsetfile.RunState{Inflight: -1},
		LastCommit: &offsetfile.CommitAttempt{Offset: 500, Generation: 3, At: at(2), Outcome: offsetfile.CommitOK, Latency: 3 * time.Millisecond}}))
	must(t, st.Put(k("billing", "orders", 1), offsetfile.Record{Watermark: 480, RecordedAt: at(3), Generation: 3,
		Member: "tidemark-aaaa", Committed: 450, CommittedAt: at(1),
		LastCommit: &offsetfile.CommitAttempt{Offset: 480, Generation: 3, At: at(3), Outcome: offsetfile.CommitFenced,
			Latency: 12 * time.Millisecond, Error: "[22] Illegal Generation"}}))
	must(t, st.Put(k("billing", "orders", 2), offsetfile.Record{Watermark: 300, RecordedAt: at(4), Generation: 2,
		Member: "tidemark-bbbb", Committed: 290, CommittedAt: at(4),
		Run: &offsetfile.RunState{Open: true, Inflight: 300, Crashes: 2}}))
	must(t, st.RecordFailure(k("billing", "orders", 3), offsetfile.Failure{Offset: 41, At: at(5), Action: offsetfile.FailureSkip,
		Attempts: 5, Reason: "invalid JSON"}))
	must(t, st.RecordFailure(k("billing", "orders", 3), offsetfile.Failure{Offset: 42, At: at(6), Action: offsetfile.FailureDeadLetter,
		Attempts: 5, Reason: "timeout", DeadLetter: "orders-dlt/0@7"}))
	must(t, st.SetWatermark(k("billing", "orders", 3), 43, 3, "tidemark-aaaa"))
	must(t, st.Put(k("billing", "payments", 0), offsetfile.Record{Watermark: 0, RecordedAt: at(7), Generation: 1,
		Member: "tidemark-cccc", Committed: -1,
		LastReset: &offsetfile.Reset{At: at(7), From: 120, To: 0, Reason: "offset 120 beyond log end 0 (topic recreated?)"}}))
	must(t, st.Put(k("audit", "orders", 0), offsetfile.Record{Watermark: 77, RecordedAt: at(8), Generation: 9,
		Member: "tidemark-dddd", Committed: 77, CommittedAt: at(8)}))
	must(t, st.Close())
	// RecordFailure and SetWatermark take the wall clock: pin partition 3's
	// record times by rewriting it whole, keeping its failure entries.
	st, err = offsetfile.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := st.Get(k("billing", "orders", 3))
	r.RecordedAt, r.Committed, r.CommittedAt = at(6), 40, at(5)
	must(t, st.Put(k("billing", "orders", 3), r))
	must(t, st.Close())
	return path
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func hashFile(t testing.TB, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

var (
	timeRE   = regexp.MustCompile(`\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?Z`)
	memberRE = regexp.MustCompile(`tidemark-[0-9a-f]{32}`)
	pidRE    = regexp.MustCompile(`pid \d+|"pid": \d+`)
)

// mask replaces what varies between runs: the paths, and with volatile
// set, times, member ids and pids.
func mask(s string, volatile bool, repl ...string) string {
	s = strings.NewReplacer(repl...).Replace(s)
	if volatile {
		s = timeRE.ReplaceAllString(s, "TIME")
		s = memberRE.ReplaceAllString(s, "MEMBER")
		s = pidRE.ReplaceAllString(s, "pid PID")
	}
	return s
}

// golden compares got with testdata/name.golden, or rewrites it with
// -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		must(t, os.MkdirAll("testdata", 0o755))
		must(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/tidemark -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test ./cmd/tidemark -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// snakeCaseKeys fails t unless every object key of the JSON document out,
// at any depth, is snake_case: one naming style for everything the command
// prints (the snapshot's names are pinned in package framework).
func snakeCaseKeys(t *testing.T, what, out string) {
	t.Helper()
	var doc any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%s: not JSON: %v", what, err)
	}
	var bad []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if !snakeCase.MatchString(k) {
					bad = append(bad, path+"."+k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range v {
				walk(path+"[]", e)
			}
		}
	}
	walk("", doc)
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Errorf("%s: %d keys not snake_case: %v", what, len(bad), slices.Compact(bad))
	}
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
