package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/offsetstore"
)

// writeRealFile writes, through the store, a file like a consumer's after a
// while: partitions of two groups and three topics with watermarks,
// commits and their ledger, run states, resets, completed ranges, and
// failure entries (skips and dead letters) recorded over several flushes,
// so that some pages are free. It returns the file's bytes.
func writeRealFile(t testing.TB, path string, partitions int) []byte {
	t.Helper()
	s, err := offsetstore.Open(path, &offsetstore.Options{NoSync: true, KeepFailures: 40})
	must(t, err)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	keys := make([]offsetstore.Key, 0, partitions)
	for i := range partitions {
		g := []string{"billing", "audit"}[i%2]
		topic := []string{"payments", "refunds", "invoices"}[i%3]
		keys = append(keys, offsetstore.Key{Group: g, Topic: topic, Partition: int32(i)})
	}
	for round := range 4 {
		for i, k := range keys {
			wm := int64(1000*round + i + 10)
			switch i % 5 {
			case 0:
				must(t, s.SetWatermark(k, wm, int32(round+1), fmt.Sprintf("member-%d", i%7)))
			case 1:
				must(t, s.Put(k, offsetstore.Record{Watermark: wm, RecordedAt: at, Generation: 3, Member: "m-out-of-order",
					Committed: wm - 5, CommittedAt: at, Completed: []offsetstore.Range{{From: wm + 2, To: wm + 9}, {From: wm + 20, To: wm + 21}}}))
			case 2:
				must(t, s.RecordReset(k, offsetstore.Reset{At: at, From: wm + 50, To: wm, Reason: "offset out of range: retention deleted the records"}))
			case 3:
				must(t, s.SetRun(k, offsetstore.RunState{Open: round%2 == 0, Inflight: wm, Crashes: int32(round)}))
				must(t, s.SetWatermark(k, wm, 2, "member-run"))
			case 4:
				must(t, s.SetCommitAttempt(k, offsetstore.CommitAttempt{Offset: wm, Generation: 2, At: at,
					Outcome: offsetstore.CommitOutcome(1 + round%4), Latency: time.Millisecond, Error: "request timed out"}))
				must(t, s.SetWatermark(k, wm, 2, "member-commit"))
			}
			if i%3 == 0 {
				f := offsetstore.Failure{Offset: wm + 1, At: at, Action: offsetstore.FailureSkipped, Attempts: 3,
					Reason: "handler: decode payment: unexpected end of JSON input"}
				if i%2 == 0 {
					f.Action, f.DeadLetter = offsetstore.FailureDeadLettered, fmt.Sprintf("payments.dlq/%d@%d", i%4, 100*round+i)
				}
				must(t, s.RecordFailure(k, f))
			}
		}
		flush(t, s)
	}
	must(t, s.Close())
	b, err := os.ReadFile(path)
	must(t, err)
	return b
}

// readEverything reads what a consumer and the commands read from an open
// store: every record, every partition's failure entries, and a failure
// recorded again at an offset already in the file (the read at the first
// dead letter that crashed the consumer of issue 27) and at a new one.
func readEverything(s *offsetstore.Store) error {
	for _, e := range s.Records() {
		fs, err := s.Failures(e.Key)
		if err != nil {
			return err
		}
		if len(fs) > 0 {
			f := fs[0]
			if err := s.RecordFailure(e.Key, f); err != nil && !errors.Is(err, offsetstore.ErrReadOnly) {
				return err
			}
		}
		nf := offsetstore.Failure{Offset: e.Watermark + 1<<20, Action: offsetstore.FailureDeadLettered, DeadLetter: "dlq/0@1"}
		if err := s.RecordFailure(e.Key, nf); err != nil && !errors.Is(err, offsetstore.ErrReadOnly) {
			return err
		}
	}
	return nil
}

// TestDamagedPages is the experiment of issue 27: damage one page at a time
// of a real file (overwritten with seeded random bytes) and, for every
// copy, Open (read-write and read-only) either refuses it with an error
// that names the file and wraps ErrDamaged, or opens it and then every
// read, and a flush, succeeds; Open refuses exactly the copies Check finds
// an error in; Salvage reads without panicking. Before the fix Open
// accepted copies Check reported damaged, and RecordFailure panicked in
// durableFailure on two of them.
func TestDamagedPages(t *testing.T) {
	dir := t.TempDir()
	orig := filepath.Join(dir, "orig.db")
	full := writeRealFile(t, orig, 300)
	const pageSize = 4096
	pages := len(full) / pageSize
	if pages < 32 {
		t.Fatalf("the real file has %d pages, want at least 32", pages)
	}
	rng := rand.New(rand.NewPCG(27, 1))
	refused := 0
	for pg := 2; pg < pages; pg++ { // pages 0 and 1 are bbolt's meta pages, which have checksums
		b := append([]byte(nil), full...)
		for i := pg * pageSize; i < (pg+1)*pageSize; i++ {
			b[i] = byte(rng.Uint32())
		}
		path := filepath.Join(dir, fmt.Sprintf("page-%02d.db", pg))
		must(t, os.WriteFile(path, b, 0o600))

		rep, err := offsetstore.Check(path, nil)
		if err != nil {
			t.Fatalf("page %d: Check: %v", pg, err)
		}
		damaged := rep.Worst() == offsetstore.SeverityError
		for _, ro := range []bool{true, false} {
			s, err := offsetstore.Open(path, &offsetstore.Options{ReadOnly: ro, NoSync: true})
			if err != nil {
				if !damaged {
					t.Errorf("page %d, read-only %v: Open refused a file Check finds sound: %v", pg, ro, err)
				}
				if !errors.Is(err, offsetstore.ErrDamaged) || !strings.Contains(err.Error(), path) ||
					!strings.Contains(err.Error(), "tidemark export --salvage") {
					t.Errorf("page %d, read-only %v: %v, want ErrDamaged naming the file and how to recover", pg, ro, err)
				}
				continue
			}
			if damaged {
				t.Errorf("page %d, read-only %v: Open accepted a file Check finds damaged: %v", pg, ro, rep.Findings)
			}
			if err := readEverything(s); err != nil {
				t.Errorf("page %d, read-only %v: reading an accepted file: %v", pg, ro, err)
			}
			if !ro {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := s.Flush(ctx); err != nil {
					t.Errorf("page %d: Flush: %v", pg, err)
				}
				cancel()
			}
			if err := s.Close(); err != nil {
				t.Errorf("page %d, read-only %v: Close: %v", pg, ro, err)
			}
		}
		if damaged {
			refused++
		}
	}
	t.Logf("%d of %d copies refused as damaged", refused, pages-2)
	if refused == 0 {
		t.Error("no copy was found damaged: the experiment damaged only free pages")
	}
}
