package offsetfile_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Failure entries are listed per partition in offset order, counted in the
// record, persist across a reopen, and become durable together with the
// watermark queued after them.
func TestRecordFailure(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, nil)
	k1 := offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	at := time.Date(2026, 11, 29, 10, 0, 0, 5, time.UTC)
	must(t, s.SetWatermark(k0, 10, 1, "m"))
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 10, At: at, Action: offsetfile.FailureSkip, Attempts: 3, Reason: "bad json"}))
	must(t, s.SetWatermark(k0, 11, 1, "m"))
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 4, At: at, Action: offsetfile.FailureDeadLetter, Attempts: 5, Reason: "boom", DeadLetter: "dlt/0@0"}))
	must(t, s.RecordFailure(k1, offsetfile.Failure{Offset: 4, Action: offsetfile.FailureSkip, Reason: "other partition"}))
	if r, _ := s.Get(k0); r.Skipped != 1 || r.DeadLettered != 1 || r.Watermark != 11 {
		t.Fatalf("Get before flush = %+v", r)
	}
	flush(t, s)
	got, err := s.Failures(k0)
	must(t, err)
	want := []offsetfile.Failure{
		{Offset: 4, At: at.Local(), Action: offsetfile.FailureDeadLetter, Attempts: 5, Reason: "boom", DeadLetter: "dlt/0@0"},
		{Offset: 10, At: at.Local(), Action: offsetfile.FailureSkip, Attempts: 3, Reason: "bad json"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Failures = %+v\nwant %+v", got, want)
	}
	must(t, s.Close())
	if _, err := s.Failures(k0); err == nil {
		t.Fatal("Failures after Close succeeded")
	}

	s = mustOpen(t, path, &offsetfile.Options{ReadOnly: true})
	got, err = s.Failures(k0)
	must(t, err)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen: Failures = %+v\nwant %+v", got, want)
	}
	if r, _ := s.Durable(k0); r.Skipped != 1 || r.DeadLettered != 1 {
		t.Fatalf("counts after reopen: %+v", r)
	}
	if f, err := s.Failures(k1); err != nil || len(f) != 1 || f[0].At.IsZero() {
		t.Fatalf("partition 1: %+v, %v (a zero At is set to now)", f, err)
	}
	if f, err := s.Failures(offsetfile.Key{Group: "g", Topic: "none"}); err != nil || len(f) != 0 {
		t.Fatalf("unknown topic: %+v, %v", f, err)
	}
}

func TestRecordFailureRejects(t *testing.T) {
	s := mustOpenStore(t, nil)
	for _, tt := range []struct {
		f    offsetfile.Failure
		want string
	}{
		{offsetfile.Failure{Offset: -1, Action: offsetfile.FailureSkip}, "failure offset -1"},
		{offsetfile.Failure{Offset: 1}, "action retry is not recorded"},
		{offsetfile.Failure{Offset: 1, Action: offsetfile.FailureStop}, "action stop is not recorded"},
		{offsetfile.Failure{Offset: 1, Action: offsetfile.FailureSkip, Attempts: -2}, "negative attempts"},
		{offsetfile.Failure{Offset: 1, Action: offsetfile.FailureSkip, Reason: strings.Repeat("x", 1<<17)}, "failure reason is"},
	} {
		if err := s.RecordFailure(k0, tt.f); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("RecordFailure(%+v) = %v, want %q", tt.f, err, tt.want)
		}
	}
	if err := s.RecordFailure(offsetfile.Key{Topic: "t"}, offsetfile.Failure{Action: offsetfile.FailureSkip}); err == nil {
		t.Error("empty group accepted")
	}
}

// The run state and the commit ledger are fields of the record like the
// others: merged field-wise, durable after a flush, kept across a reopen.
func TestRunStateAndCommitLedger(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, nil)
	must(t, s.SetWatermark(k0, 7, 2, "m"))
	must(t, s.SetRun(k0, offsetfile.RunState{Open: true, Inflight: 7, Crashes: 2}))
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	must(t, s.SetCommitAttempt(k0, offsetfile.CommitAttempt{Offset: 7, Generation: 2, At: at, Outcome: offsetfile.CommitUnknown, Latency: time.Second, Error: "i/o timeout"}))
	if r, _ := s.Get(k0); r.Committed != -1 {
		t.Fatalf("an unknown outcome set Committed: %+v", r)
	}
	flush(t, s)
	must(t, s.SetCommitAttempt(k0, offsetfile.CommitAttempt{Offset: 7, Generation: 2, Outcome: offsetfile.CommitOK, Latency: time.Millisecond}))
	must(t, s.SetRun(k0, offsetfile.RunState{Inflight: -1}))
	must(t, s.Close())

	s = mustOpen(t, path, &offsetfile.Options{ReadOnly: true})
	r, _ := s.Durable(k0)
	if r.Watermark != 7 || r.Run == nil || r.Run.Open || r.Run.Inflight != -1 || r.Committed != 7 || r.CommittedAt.IsZero() {
		t.Fatalf("record = %+v, run %+v", r, r.Run)
	}
	if c := r.LastCommit; c == nil || c.Outcome != offsetfile.CommitOK || c.Offset != 7 || c.Generation != 2 || c.Latency != time.Millisecond || c.At.IsZero() {
		t.Fatalf("last commit = %+v", c)
	}
	if offsetfile.CommitUnknown.String() != "unknown" || offsetfile.FailureDeadLetter.String() != "dead-letter" {
		t.Fatal("outcome and action names")
	}
	for _, bad := range []offsetfile.CommitAttempt{{Offset: -1, Outcome: offsetfile.CommitOK}, {Outcome: 0}, {Outcome: offsetfile.CommitOK, Latency: -1}} {
		if err := mustOpenStore(t, nil).SetCommitAttempt(k0, bad); err == nil {
			t.Errorf("SetCommitAttempt(%+v) accepted", bad)
		}
	}
	if err := mustOpenStore(t, nil).SetRun(k0, offsetfile.RunState{Inflight: -2}); err == nil {
		t.Error("SetRun with in-flight -2 accepted")
	}
}

// An offset recorded twice (a revoke during the dead-letter write, then the
// next owner dead-lettered it again) is counted once, whether the first
// entry is still queued or already durable; a changed action moves the
// count.
func TestRecordFailureCountsAnOffsetOnce(t *testing.T) {
	s := mustOpenStore(t, nil)
	dl := offsetfile.Failure{Offset: 7, Action: offsetfile.FailureDeadLetter, Attempts: 3, Reason: "boom", DeadLetter: "dlt/0@0"}
	must(t, s.RecordFailure(k0, dl))
	must(t, s.RecordFailure(k0, dl)) // still queued
	if r, _ := s.Get(k0); r.DeadLettered != 1 {
		t.Fatalf("queued twice: DeadLettered = %d, want 1", r.DeadLettered)
	}
	flush(t, s)
	dl.DeadLetter = "dlt/0@1"
	must(t, s.RecordFailure(k0, dl)) // durable before
	flush(t, s)
	if r, _ := s.Durable(k0); r.DeadLettered != 1 || r.Skipped != 0 {
		t.Fatalf("recorded again after a flush: %+v, want 1 dead-lettered", r)
	}
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 7, Action: offsetfile.FailureSkip, Reason: "breaker"}))
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 8, Action: offsetfile.FailureDeadLetter, Reason: "boom", DeadLetter: "dlt/0@2"}))
	flush(t, s)
	if r, _ := s.Durable(k0); r.DeadLettered != 1 || r.Skipped != 1 {
		t.Fatalf("7 skipped after dead-lettered, 8 dead-lettered: %+v, want 1 and 1", r)
	}
	got, err := s.Failures(k0)
	must(t, err)
	if len(got) != 2 || got[0].Offset != 7 || got[0].Action != offsetfile.FailureSkip || got[1].Offset != 8 {
		t.Fatalf("Failures = %+v", got)
	}
}

// Failure entries are pruned to the newest KeepFailures per partition, only
// below the durable watermark; the counts keep the totals.
func TestFailuresPruned(t *testing.T) {
	s := mustOpenStore(t, &offsetfile.Options{KeepFailures: 3})
	k1 := offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	must(t, s.RecordFailure(k1, offsetfile.Failure{Offset: 0, Action: offsetfile.FailureSkip}))
	for o := int64(0); o < 6; o++ {
		must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: o, Action: offsetfile.FailureSkip}))
	}
	must(t, s.SetWatermark(k0, 1, 1, "m")) // only offset 0 is below it
	flush(t, s)
	offs := func(k offsetfile.Key) []int64 {
		t.Helper()
		fs, err := s.Failures(k)
		must(t, err)
		var out []int64
		for _, f := range fs {
			out = append(out, f.Offset)
		}
		return out
	}
	if got := offs(k0); !reflect.DeepEqual(got, []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("watermark 1: entries %v, want 1..5 (only 0 below the watermark)", got)
	}
	must(t, s.SetWatermark(k0, 100, 1, "m"))
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 50, Action: offsetfile.FailureSkip}))
	flush(t, s)
	if got := offs(k0); !reflect.DeepEqual(got, []int64{4, 5, 50}) {
		t.Fatalf("watermark 100: entries %v, want the newest 3: 4 5 50", got)
	}
	if r, _ := s.Durable(k0); r.Skipped != 7 {
		t.Fatalf("Skipped = %d after pruning, want the total 7", r.Skipped)
	}
	if got := offs(k1); !reflect.DeepEqual(got, []int64{0}) {
		t.Fatalf("partition 1: entries %v, want 0 (pruned per partition)", got)
	}
}

// With the default bound, a partition pruned to DefaultKeepFailures entries
// keeps its total counts, and Check does not take that for a disagreement.
func TestFailuresPrunedDefaultBound(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, nil)
	const n = offsetfile.DefaultKeepFailures + 5
	for o := int64(0); o < n; o++ {
		must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: o, Action: offsetfile.FailureSkip}))
	}
	must(t, s.SetWatermark(k0, n, 1, "m"))
	flush(t, s)
	fs, err := s.Failures(k0)
	must(t, err)
	if len(fs) != offsetfile.DefaultKeepFailures || fs[0].Offset != 5 {
		t.Fatalf("%d entries from offset %d, want %d from 5", len(fs), fs[0].Offset, offsetfile.DefaultKeepFailures)
	}
	must(t, s.Close())
	rep, err := offsetfile.Check(path, nil)
	must(t, err)
	for _, f := range rep.Findings {
		if strings.Contains(f.Message, "disagree") {
			t.Errorf("Check after pruning: %v", f)
		}
	}
}

// Entries flushed before the watermark passed them are pruned once it does,
// not only when the next failure is written.
func TestFailuresPrunedWhenTheWatermarkPassesThem(t *testing.T) {
	s := mustOpen(t, tempPath(t), &offsetfile.Options{KeepFailures: 3})
	for o := int64(0); o < 6; o++ {
		must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: o, Action: offsetfile.FailureSkip}))
	}
	flush(t, s) // every entry at or above the watermark: none pruned
	must(t, s.SetWatermark(k0, 6, 1, "m"))
	flush(t, s)
	fs, err := s.Failures(k0)
	must(t, err)
	if len(fs) != 3 || fs[0].Offset != 3 {
		t.Fatalf("%d entries (first %+v), want the newest 3 from offset 3", len(fs), fs)
	}
}
