package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A run keeps what it observed in its work directory, next to the ledgers,
// so that Recheck can check it again later (after a change to the checker,
// or with another Margin): facts.json (everything but the ledgers and the
// log) and log.txt (the final log, one "partition offset value" line per
// record).
const (
	factsFile = "facts.json"
	logFile   = "log.txt"
)

type facts struct {
	Topic        string
	Partitions   int
	Keys         int `json:",omitempty"`
	Acked        []int64
	Txn          map[string]TxnOutcome `json:",omitempty"`
	LogCommitted map[string]bool       // null: not read (no transactions, or an older run)
	Incarnations []Incarnation
	Faults       []Fault
	Commits      []CommitSample
	Files        []FileWatermark
	State        bool              `json:",omitempty"`
	Changelog    []ChangelogMarker `json:",omitempty"` // Input.ChangelogMarkers
	Margin       time.Duration
	Report       *Report `json:",omitempty"`
}

// saveFacts writes in (but its ledgers, which are files already) to dir.
func saveFacts(dir string, in *Input, rep *Report) error {
	f := facts{Topic: in.Topic, Partitions: in.Partitions, Keys: in.Keys, Acked: in.Acked, Txn: in.Txn, LogCommitted: in.LogCommitted,
		Incarnations: in.Incarnations, Faults: in.Faults, Commits: in.Commits, Files: in.Files, State: in.State, Changelog: in.ChangelogMarkers,
		Margin: in.Margin, Report: rep}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return fmt.Errorf("chaos: encoding the run's facts: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, factsFile), b, 0o644); err != nil {
		return fmt.Errorf("chaos: saving the run's facts: %w", err)
	}
	out, err := os.Create(filepath.Join(dir, logFile))
	if err != nil {
		return fmt.Errorf("chaos: saving the log: %w", err)
	}
	w := bufio.NewWriter(out)
	for p, values := range in.Log {
		for o, v := range values {
			fmt.Fprintf(w, "%d %d %s\n", p, o, v)
		}
	}
	if err := w.Flush(); err != nil {
		out.Close()
		return fmt.Errorf("chaos: saving the log: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("chaos: saving the log: %w", err)
	}
	return nil
}

// Recheck checks a finished run again from its work directory. margin > 0
// replaces the run's Margin. The report's run description (broker, seed,
// ...) is the original's.
func Recheck(dir string, margin time.Duration) (*Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, factsFile))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	var f facts
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("chaos: %s: %w", filepath.Join(dir, factsFile), err)
	}
	in := &Input{Topic: f.Topic, Partitions: f.Partitions, Keys: f.Keys, Acked: f.Acked, Txn: f.Txn, LogCommitted: f.LogCommitted, Incarnations: f.Incarnations,
		Faults: f.Faults, Commits: f.Commits, Files: f.Files, State: f.State, ChangelogMarkers: f.Changelog, Margin: f.Margin,
		Log: make([][]string, f.Partitions)}
	if margin > 0 {
		in.Margin = margin
	}
	logData, err := os.ReadFile(filepath.Join(dir, logFile))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	for i, line := range strings.Split(strings.TrimRight(string(logData), "\n"), "\n") {
		if line == "" {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) == 2 {
			fs = append(fs, "") // no record at the offset: a transaction marker
		}
		var p, o int
		if len(fs) == 3 {
			p, err = strconv.Atoi(fs[0])
			if err == nil {
				o, err = strconv.Atoi(fs[1])
			}
		}
		if len(fs) != 3 || err != nil || p < 0 || p >= f.Partitions || o != len(in.Log[p]) {
			return nil, fmt.Errorf("chaos: %s line %d: %q", logFile, i+1, line)
		}
		in.Log[p] = append(in.Log[p], fs[2])
	}
	paths, err := filepath.Glob(filepath.Join(dir, "ledger-*.log"))
	if err != nil {
		return nil, err
	}
	for _, path := range paths {
		l, err := ReadLedger(path)
		if err != nil {
			return nil, err
		}
		in.Ledgers = append(in.Ledgers, l)
	}
	rep := Check(in)
	if o := f.Report; o != nil {
		rep.Broker, rep.Seed, rep.Duration, rep.Consumers, rep.Partitions, rep.Rate, rep.Mix, rep.Dir, rep.CaughtUp, rep.Elapsed =
			o.Broker, o.Seed, o.Duration, o.Consumers, o.Partitions, o.Rate, o.Mix, dir, o.CaughtUp, o.Elapsed
		rep.Static, rep.Keys, rep.State, rep.Txns, rep.TxnErrors = o.Static, o.Keys, o.State, o.Txns, o.TxnErrors
	}
	return rep, nil
}
