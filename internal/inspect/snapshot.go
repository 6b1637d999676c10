package inspect

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Snapshot is the document served at Path. S is framework.Stats: the
// consumer's Stats, serialised field by field through its json tags.
type Snapshot[S any] struct {
	Format     string    `json:"format"` // Format
	Version    int       `json:"version"`
	Pid        int       `json:"pid"` // 0: the file's alone, read with no consumer running
	OffsetFile string    `json:"offset_file"`
	Topics     []string  `json:"topics"`
	Started    time.Time `json:"started"`
	TakenAt    time.Time `json:"taken_at"`
	Stats      S         `json:"stats"`
	// Records are the offset file's durable records.
	Records []offsetfile.Entry `json:"records"`
	// Failures are the failure entries of every record with a failure
	// count, when asked for.
	Failures []Failures `json:"failures,omitempty"`
}

// Failures are the failure entries of one partition.
type Failures struct {
	offsetfile.Key
	Failures []offsetfile.Failure
}

// The snapshot's wire format. Stats and its parts carry json tags
// (snake_case), which pin their names; offsetstore's records are encoded
// through the types below, where outcomes and actions are strings, so that
// renaming a Go field cannot change the protocol (snapshot_test.go pins
// the names; version 2 is the first with them). The conversions of Key,
// Reset and RunState stop compiling when a field is added to them; a field
// added to offsetfile.Record must be added here too, or the round-trip
// test fails.

type snapshotJSON[S any] struct {
	Format     string         `json:"format"`
	Version    int            `json:"version"`
	Pid        int            `json:"pid"`
	OffsetFile string         `json:"offset_file"`
	Topics     []string       `json:"topics"`
	Started    time.Time      `json:"started"`
	TakenAt    time.Time      `json:"taken_at"`
	Stats      S              `json:"stats"`
	Records    []recordJSON   `json:"records"`
	Failures   []failuresJSON `json:"failures,omitempty"`
}

type keyJSON struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

type recordJSON struct {
	keyJSON
	Watermark    int64       `json:"watermark"`
	RecordedAt   time.Time   `json:"recorded_at"`
	Generation   int32       `json:"generation"`
	Member       string      `json:"member"`
	Committed    int64       `json:"committed"`
	CommittedAt  time.Time   `json:"committed_at"`
	LastReset    *resetJSON  `json:"last_reset,omitempty"`
	Run          *runJSON    `json:"run,omitempty"`
	Skipped      int64       `json:"skipped"`
	DeadLettered int64       `json:"dead_lettered"`
	LastCommit   *commitJSON `json:"last_commit,omitempty"`
	// Completed are the offsets completed above Watermark, [from, to).
	Completed [][2]int64 `json:"completed_ranges,omitempty"`
}

type resetJSON struct {
	At     time.Time `json:"at"`
	From   int64     `json:"from"`
	To     int64     `json:"to"`
	Reason string    `json:"reason"`
}

type runJSON struct {
	Open     bool  `json:"open"`
	Inflight int64 `json:"inflight"`
	Crashes  int32 `json:"crashes"`
}

type commitJSON struct {
	Offset     int64     `json:"offset"`
	Generation int32     `json:"generation"`
	At         time.Time `json:"at"`
	Outcome    string    `json:"outcome"` // "ok", "fenced", "error", "unknown"
	LatencyNs  int64     `json:"latency_ns"`
	Error      string    `json:"error,omitempty"`
}

type failuresJSON struct {
	keyJSON
	Failures []failureJSON `json:"failures"`
}

type failureJSON struct {
	Offset     int64     `json:"offset"`
	At         time.Time `json:"at"`
	Action     string    `json:"action"` // "skipped", "dead-lettered"
	Attempts   int32     `json:"attempts"`
	Reason     string    `json:"reason"`
	DeadLetter string    `json:"dead_letter,omitempty"`
}

// MarshalJSON encodes the snapshot in its wire format.
func (s Snapshot[S]) MarshalJSON() ([]byte, error) {
	w := snapshotJSON[S]{Format: s.Format, Version: s.Version, Pid: s.Pid, OffsetFile: s.OffsetFile, Topics: s.Topics,
		Started: s.Started, TakenAt: s.TakenAt, Stats: s.Stats, Records: []recordJSON{}}
	for _, e := range s.Records {
		r := recordJSON{keyJSON: keyJSON(e.Key), Watermark: e.Watermark, RecordedAt: e.RecordedAt, Generation: e.Generation,
			Member: e.Member, Committed: e.Committed, CommittedAt: e.CommittedAt, Skipped: e.Skipped, DeadLettered: e.DeadLettered}
		for _, c := range e.Completed {
			r.Completed = append(r.Completed, [2]int64{c.From, c.To})
		}
		if e.LastReset != nil {
			r.LastReset = (*resetJSON)(e.LastReset)
		}
		if e.Run != nil {
			r.Run = (*runJSON)(e.Run)
		}
		if a := e.LastCommit; a != nil {
			r.LastCommit = &commitJSON{Offset: a.Offset, Generation: a.Generation, At: a.At, Outcome: a.Outcome.String(),
				LatencyNs: int64(a.Latency), Error: a.Error}
		}
		w.Records = append(w.Records, r)
	}
	for _, fs := range s.Failures {
		f := failuresJSON{keyJSON: keyJSON(fs.Key), Failures: []failureJSON{}}
		for _, e := range fs.Failures {
			a, err := ActionName(e.Action)
			if err != nil {
				return nil, fmt.Errorf("failure %s/%d@%d: %w", fs.Topic, fs.Partition, e.Offset, err)
			}
			f.Failures = append(f.Failures, failureJSON{Offset: e.Offset, At: e.At, Action: a,
				Attempts: e.Attempts, Reason: e.Reason, DeadLetter: e.DeadLetter})
		}
		w.Failures = append(w.Failures, f)
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the wire format.
func (s *Snapshot[S]) UnmarshalJSON(b []byte) error {
	var w snapshotJSON[S]
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	out := Snapshot[S]{Format: w.Format, Version: w.Version, Pid: w.Pid, OffsetFile: w.OffsetFile, Topics: w.Topics,
		Started: w.Started, TakenAt: w.TakenAt, Stats: w.Stats}
	for _, r := range w.Records {
		e := offsetfile.Entry{Key: offsetfile.Key(r.keyJSON), Record: offsetfile.Record{Watermark: r.Watermark,
			RecordedAt: r.RecordedAt, Generation: r.Generation, Member: r.Member, Committed: r.Committed,
			CommittedAt: r.CommittedAt, Skipped: r.Skipped, DeadLettered: r.DeadLettered}}
		for _, c := range r.Completed {
			e.Completed = append(e.Completed, offsetfile.Range{From: c[0], To: c[1]})
		}
		if r.LastReset != nil {
			e.LastReset = (*offsetfile.Reset)(r.LastReset)
		}
		if r.Run != nil {
			e.Run = (*offsetfile.RunState)(r.Run)
		}
		if a := r.LastCommit; a != nil {
			o, err := parseOutcome(a.Outcome)
			if err != nil {
				return fmt.Errorf("record %s/%d: %w", r.Topic, r.Partition, err)
			}
			e.LastCommit = &offsetfile.CommitAttempt{Offset: a.Offset, Generation: a.Generation, At: a.At, Outcome: o,
				Latency: time.Duration(a.LatencyNs), Error: a.Error}
		}
		out.Records = append(out.Records, e)
	}
	for _, fs := range w.Failures {
		f := Failures{Key: offsetfile.Key(fs.keyJSON)}
		for _, e := range fs.Failures {
			a, err := ParseAction(e.Action)
			if err != nil {
				return fmt.Errorf("failure %s/%d@%d: %w", fs.Topic, fs.Partition, e.Offset, err)
			}
			f.Failures = append(f.Failures, offsetfile.Failure{Offset: e.Offset, At: e.At, Action: a,
				Attempts: e.Attempts, Reason: e.Reason, DeadLetter: e.DeadLetter})
		}
		out.Failures = append(out.Failures, f)
	}
	*s = out
	return nil
}

func parseOutcome(s string) (offsetfile.CommitOutcome, error) {
	for o := offsetfile.CommitOK; o <= offsetfile.CommitUnknown; o++ {
		if o.String() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown commit outcome %q", s)
}

// The names of the recorded failure actions, on the wire and in the
// command's output: what was done ("skipped"), where the Go constants name
// the policy (FailureAction's String, "skip").
var actionNames = map[offsetfile.FailureAction]string{
	offsetfile.FailureSkip:       "skipped",
	offsetfile.FailureDeadLetter: "dead-lettered",
}

// ActionName is the wire name of a recorded failure's action: "skipped"
// or "dead-lettered"; an error for an action no failure records.
func ActionName(a offsetfile.FailureAction) (string, error) {
	if s, ok := actionNames[a]; ok {
		return s, nil
	}
	return "", fmt.Errorf("failure action %v is never recorded", a)
}

// ParseAction is ActionName's inverse.
func ParseAction(s string) (offsetfile.FailureAction, error) {
	for a, n := range actionNames {
		if n == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown failure action %q", s)
}
