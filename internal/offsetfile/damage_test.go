package offsetfile_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// writeRealFile writes, through the store, a file like a consumer's after a
// while: partitions of two groups and three topics with watermarks,
// commits and their ledger, run states, resets, completed ranges, and
// failure entries (skips and dead letters) recorded over several flushes,
// so that some pages are free. It returns the file's bytes.
func writeRealFile(t testing.TB, path string, partitions int) []byte {
	t.Helper()
	// A fixed clock: the same bytes each run, so that a fuzz input that
	// damages them reproduces.
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	defer offsetfile.SetClock(func() time.Time { return at })()
	s, err := offsetfile.Open(path, &offsetfile.Options{NoSync: true, KeepFailures: 40})
	must(t, err)
	keys := make([]offsetfile.Key, 0, partitions)
	for i := range partitions {
		g := []string{"billing", "audit"}[i%2]
		topic := []string{"payments", "refunds", "invoices"}[i%3]
		keys = append(keys, offsetfile.Key{Group: g, Topic: topic, Partition: int32(i)})
	}
	for round := range 4 {
		for i, k := range keys {
			wm := int64(1000*round + i + 10)
			switch i % 5 {
			case 0:
				must(t, s.SetWatermark(k, wm, int32(round+1), fmt.Sprintf("member-%d", i%7)))
			case 1:
				must(t, s.Put(k, offsetfile.Record{Watermark: wm, RecordedAt: at, Generation: 3, Member: "m-out-of-order",
					Committed: wm - 5, CommittedAt: at, Completed: []offsetfile.Range{{From: wm + 2, To: wm + 9}, {From: wm + 20, To: wm + 21}}}))
			case 2:
				must(t, s.RecordReset(k, offsetfile.Reset{At: at, From: wm + 50, To: wm, Reason: "offset out of range: retention deleted the records"}))
			case 3:
				must(t, s.SetRun(k, offsetfile.RunState{Open: round%2 == 0, Inflight: wm, Crashes: int32(round)}))
				must(t, s.SetWatermark(k, wm, 2, "member-run"))
			case 4:
				must(t, s.SetCommitAttempt(k, offsetfile.CommitAttempt{Offset: wm, Generation: 2, At: at,
					Outcome: offsetfile.CommitOutcome(1 + round%4), Latency: time.Millisecond, Error: "request timed out"}))
				must(t, s.SetWatermark(k, wm, 2, "member-commit"))
			}
			if i%3 == 0 {
				f := offsetfile.Failure{Offset: wm + 1, At: at, Action: offsetfile.FailureSkip, Attempts: 3,
					Reason: "handler: decode payment: unexpected end of JSON input"}
				if i%2 == 0 {
					f.Action, f.DeadLetter = offsetfile.FailureDeadLetter, fmt.Sprintf("payments.dlq/%d@%d", i%4, 100*round+i)
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
func readEverything(s *offsetfile.Store) error {
	for _, e := range s.Records() {
		fs, err := s.Failures(e.Key)
		if err != nil {
			return err
		}
		if len(fs) > 0 {
			f := fs[0]
			if err := s.RecordFailure(e.Key, f); err != nil && !errors.Is(err, offsetfile.ErrReadOnly) {
				return err
			}
		}
		nf := offsetfile.Failure{Offset: e.Watermark + 1<<20, Action: offsetfile.FailureDeadLetter, DeadLetter: "dlq/0@1"}
		if err := s.RecordFailure(e.Key, nf); err != nil && !errors.Is(err, offsetfile.ErrReadOnly) {
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
	// Salvage reads a sound file whole: every record and failure entry.
	want := salvage(t, orig)
	if len(want.Problems) != 0 || len(want.Records) != 300 || len(want.Failures) == 0 {
		t.Fatalf("Salvage of the sound file: %d records, failures of %d partitions, problems %q",
			len(want.Records), len(want.Failures), want.Problems)
	}
	s := mustOpen(t, orig, &offsetfile.Options{ReadOnly: true})
	for _, e := range s.Records() {
		fs, err := s.Failures(e.Key)
		must(t, err)
		if got := want.Failures[e.Key]; len(got) != len(fs) {
			t.Errorf("%v: Salvage read %d failure entries, Failures %d", e.Key, len(got), len(fs))
		}
	}
	must(t, s.Close())

	rng := rand.New(rand.NewPCG(27, 1))
	refused, counted := 0, 0
	for pg := 2; pg < pages; pg++ { // pages 0 and 1 are bbolt's meta pages, which have checksums
		b := append([]byte(nil), full...)
		for i := pg * pageSize; i < (pg+1)*pageSize; i++ {
			b[i] = byte(rng.Uint32())
		}
		path := filepath.Join(dir, fmt.Sprintf("page-%02d.db", pg))
		must(t, os.WriteFile(path, b, 0o600))

		rep, err := offsetfile.Check(path, nil)
		if err != nil {
			t.Fatalf("page %d: Check: %v", pg, err)
		}
		damaged := rep.Worst() == offsetfile.SeverityError
		for _, ro := range []bool{true, false} {
			s, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: ro, NoSync: true})
			if err != nil {
				if !damaged {
					t.Errorf("page %d, read-only %v: Open refused a file Check finds sound: %v", pg, ro, err)
				}
				if !errors.Is(err, offsetfile.ErrDamaged) || !strings.Contains(err.Error(), path) ||
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
			// Check still counts what the sound pages hold.
			n := 0
			for _, c := range rep.Records {
				n += c
			}
			rootLost := slices.ContainsFunc(rep.Findings, func(f offsetfile.Finding) bool { return strings.Contains(f.Message, "root bucket") })
			if !rootLost && rep.SchemaVersion != offsetfile.SchemaVersion {
				t.Errorf("page %d: Check of a damaged file reads schema version %d", pg, rep.SchemaVersion)
			}
			if n > 0 {
				counted++
			}
			got := salvage(t, path)
			if len(got.Problems) == 0 {
				t.Errorf("page %d: Salvage of a damaged file reports no problem", pg)
			}
			for _, e := range got.Records {
				if !slices.ContainsFunc(want.Records, func(w offsetfile.Entry) bool { return w.Key == e.Key && recordsEqual(w.Record, e.Record) }) {
					t.Errorf("page %d: Salvage returned a record not in the file: %+v", pg, e)
				}
			}
		}
	}
	t.Logf("%d of %d copies refused as damaged", refused, pages-2)

	if refused == 0 {
		t.Error("no copy was found damaged: the experiment damaged only free pages")
	}
	if counted < refused/2 {
		t.Errorf("Check counted records in %d of %d damaged copies", counted, refused)
	}
}

// salvage runs Salvage, which must not fail on a file with sound meta pages.
func salvage(t *testing.T, path string) *offsetfile.Salvaged {
	t.Helper()
	got, err := offsetfile.Salvage(path, nil)
	if err != nil {
		t.Fatalf("Salvage(%s): %v", path, err)
	}
	return got
}

// FuzzOpenDamagedFile damages a real file and feeds it to everything that
// reads one. The file is written by the store (partitions, failure
// entries, dead letters, resets, runs, commits, completed ranges, free
// pages), with a fixed clock, so the same bytes each run. The fuzzer's
// input is the damage, as patches: a page (byte, modulo the file's pages),
// an offset in it (2 bytes, modulo the page size), a length (byte), and
// that many bytes to write there, over and over. Patches keep the input
// small, so it mutates and minimizes fast, while the file stays whole.
// Check, Open (read-only, then read-write), every read of an opened store,
// a flush, and Salvage (what `tidemark export --salvage` reads) may fail,
// never panic; and Open refuses what Check finds damaged.
func FuzzOpenDamagedFile(f *testing.F) {
	full := writeRealFile(f, filepath.Join(f.TempDir(), "seed.db"), 60)
	// Without the pages past bbolt's high-water mark, which bbolt
	// allocated but never wrote.
	hwm := max(binary.NativeEndian.Uint64(full[16+40:]), binary.NativeEndian.Uint64(full[4096+16+40:]))
	full = full[:hwm*4096]
	pages := len(full) / 4096
	patch := func(pg, off int, b []byte) []byte {
		return append([]byte{byte(pg), byte(off >> 8), byte(off), byte(len(b))}, b...)
	}
	f.Add([]byte(nil)) // the sound file
	rng := rand.New(rand.NewPCG(27, 2))
	for pg := range pages {
		b := make([]byte, 64)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		f.Add(patch(pg, rng.IntN(4096-64), b))
		f.Add(patch(pg, 0, b[:16])) // the page header
	}
	f.Add(append(patch(0, 0, []byte{9}), patch(1, 0, []byte{9})...))
	f.Fuzz(func(t *testing.T, damage []byte) {
		b := append([]byte(nil), full...)
		for len(damage) >= 4 {
			pg, off, n := int(damage[0])%pages, (int(damage[1])<<8|int(damage[2]))%4096, int(damage[3])
			damage = damage[4:]
			n = min(n, len(damage), 4096-off)
			copy(b[pg*4096+off:], damage[:n])
			damage = damage[n:]
		}
		path := filepath.Join(t.TempDir(), "offsets.db")
		must(t, os.WriteFile(path, b, 0o600))
		rep, checkErr := offsetfile.Check(path, nil)
		damaged := checkErr == nil && rep.Worst() == offsetfile.SeverityError
		for _, ro := range []bool{true, false} {
			s, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: ro, NoSync: true})
			if err != nil {
				if errors.Is(err, offsetfile.ErrDamaged) && checkErr == nil && !damaged && ro {
					t.Errorf("Open refused a file Check finds sound: %v", err)
				}
				continue
			}
			if damaged {
				t.Errorf("read-only %v: Open accepted a file Check finds damaged: %v", ro, rep.Findings)
			}
			_ = readEverything(s)
			if !ro {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = s.Flush(ctx)
				cancel()
			}
			_ = s.Close()
		}
		_, _ = offsetfile.Salvage(path, nil)
	})
}

// The check at Open logs its warnings (the file opens but holds what the
// framework never writes), at most ten and then a count.
func TestOpenLogsWarnings(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	for p := range int32(12) {
		// Counts without failure entries, as after a salvage that lost them.
		must(t, s.Put(offsetfile.Key{Group: "g", Topic: "t", Partition: p}, offsetfile.Record{Watermark: 10, Committed: -1, Skipped: 3}))
	}
	must(t, s.Close())
	core, logs := observer.New(zapcore.WarnLevel)
	mustOpen(t, path, &offsetfile.Options{Logger: zap.New(core)})
	var msgs []string
	for _, e := range logs.All() {
		msgs = append(msgs, e.Message)
	}
	if len(msgs) != 11 || !strings.Contains(msgs[0], "failure counts (3 skipped, 0 dead-lettered) disagree") ||
		!strings.Contains(msgs[10], "2 more warnings; `tidemark check "+path+"` lists them") {
		t.Errorf("logged %q", msgs)
	}
}
