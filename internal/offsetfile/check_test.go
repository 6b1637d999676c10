package offsetfile_test

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testfs"
)

// checkOK runs Check on path, expecting a report; it checks that the file's
// bytes are unchanged.
func checkOK(t *testing.T, path string) *offsetfile.CheckReport {
	t.Helper()
	before := hashFile(t, path)
	rep, err := offsetfile.Check(path, nil)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if hashFile(t, path) != before {
		t.Errorf("Check changed the bytes of %s", path)
	}
	for _, f := range rep.Findings {
		t.Log(f)
	}
	return rep
}

// findings returns the findings of sev as strings.
func findings(rep *offsetfile.CheckReport, sev offsetfile.Severity) []string {
	var out []string
	for _, f := range rep.Findings {
		if f.Severity == sev {
			out = append(out, f.String())
		}
	}
	return out
}

func wantFinding(t *testing.T, rep *offsetfile.CheckReport, sev offsetfile.Severity, substrs ...string) {
	t.Helper()
	for _, f := range findings(rep, sev) {
		ok := true
		for _, s := range substrs {
			ok = ok && strings.Contains(f, s)
		}
		if ok {
			return
		}
	}
	t.Errorf("no %s finding with %q among %q", sev, substrs, rep.Findings)
}

func TestCheckCleanFile(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	k1 := offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	k2 := offsetfile.Key{Group: "g", Topic: "t", Partition: 2}
	must(t, s.SetWatermark(k0, 10, 1, "m"))
	must(t, s.SetCommitted(k0, 10))
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 3, Action: offsetfile.FailureSkip, Reason: "bad"}))
	must(t, s.RecordFailure(k0, offsetfile.Failure{Offset: 4, Action: offsetfile.FailureDeadLetter, DeadLetter: "dlt/0@0"}))
	must(t, s.SetWatermark(k1, 5, 1, "m"))
	must(t, s.SetRun(k1, offsetfile.RunState{Open: false, Inflight: -1}))
	must(t, s.Put(k2, offsetfile.Record{Watermark: 7, Committed: 7, Completed: []offsetfile.Range{{From: 9, To: 12}, {From: 20, To: 21}}}))
	must(t, s.Close())

	rep := checkOK(t, path)
	if len(rep.Findings) != 0 {
		t.Errorf("findings on a clean file: %v", rep.Findings)
	}
	if rep.SchemaVersion != offsetfile.SchemaVersion || rep.Records[2] != 3 || rep.FailureEntries != 2 ||
		rep.PageSize == 0 || rep.TxID == 0 || rep.Size == 0 {
		t.Errorf("report %+v", rep)
	}
	if rep.Worst() != 0 {
		t.Errorf("Worst = %v", rep.Worst())
	}
}

func TestCheckInvariants(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	k1 := offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	// Counts without entries (Put writes counts only), committed ahead of
	// the watermark, an open run, a failed last commit.
	must(t, s.Put(k0, offsetfile.Record{Watermark: 5, RecordedAt: at, Committed: 9, CommittedAt: at, Skipped: 2,
		Run:        &offsetfile.RunState{Open: true, Inflight: 5, Crashes: 2},
		LastCommit: &offsetfile.CommitAttempt{Offset: 5, At: at, Outcome: offsetfile.CommitFenced}}))
	must(t, s.Put(k1, offsetfile.Record{Watermark: 1, Committed: -1, RecordedAt: time.Now().Add(48 * time.Hour)}))
	must(t, s.Close())

	rep := checkOK(t, path)
	wantFinding(t, rep, offsetfile.SeverityWarning, "g/t/0", "2 skipped, 0 dead-lettered", "(0 skipped, 0 dead-lettered)")
	wantFinding(t, rep, offsetfile.SeverityInfo, "g/t/0", "last confirmed commit 9 is ahead of the watermark 5")
	wantFinding(t, rep, offsetfile.SeverityInfo, "g/t/0", "run open")
	wantFinding(t, rep, offsetfile.SeverityInfo, "g/t/0", "2 unclean ends in a row while handling offset 5")
	wantFinding(t, rep, offsetfile.SeverityInfo, "g/t/0", "ended fenced")
	wantFinding(t, rep, offsetfile.SeverityInfo, "g/t/1", "in the future")
	if rep.Worst() != offsetfile.SeverityWarning || rep.Findings[0].Severity != offsetfile.SeverityWarning {
		t.Errorf("Worst = %v, first %v: want warnings first", rep.Worst(), rep.Findings[0])
	}

	// Failure entries of a partition without a record, an unknown bucket.
	writeBolt(t, path, nil, func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("extra")); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists([]byte("failures"))
		if err == nil {
			b, err = b.CreateBucketIfNotExists([]byte("g"))
		}
		if err == nil {
			b, err = b.CreateBucketIfNotExists([]byte("other"))
		}
		if err != nil {
			return err
		}
		key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, 3), 7)
		return b.Put(key, []byte{1, 0, 1, 0, 0, 0})
	})
	rep = checkOK(t, path)
	wantFinding(t, rep, offsetfile.SeverityWarning, "g/other/3", "1 failure entries but no record")
	wantFinding(t, rep, offsetfile.SeverityWarning, `unknown top-level bucket "extra"`)
}

func TestCheckBadValues(t *testing.T) {
	path, _ := storeFile(t)
	pk := func(p uint32) []byte { return binary.BigEndian.AppendUint32(nil, p) }
	writeBolt(t, path, nil, func(tx *bolt.Tx) error {
		tb := tx.Bucket([]byte("groups")).Bucket([]byte("g")).Bucket([]byte("t"))
		if err := tb.Put(pk(7), []byte{1, 0, 0xff}); err != nil {
			return err
		}
		if err := tb.Put(pk(8), []byte{9, 0, 0, 0, 0, 0}); err != nil {
			return err
		}
		if err := tb.Put([]byte{1, 2, 3}, []byte{2, 0, 0, 0, 0, 0}); err != nil {
			return err
		}
		fb, err := tx.CreateBucket([]byte("failures"))
		if err == nil {
			fb, err = fb.CreateBucket([]byte("g"))
		}
		if err == nil {
			fb, err = fb.CreateBucket([]byte("t"))
		}
		if err != nil {
			return err
		}
		return fb.Put(binary.BigEndian.AppendUint64(pk(1), 3), []byte{7})
	})
	rep := checkOK(t, path)
	wantFinding(t, rep, offsetfile.SeverityError, "g/t/7", "record does not decode")
	wantFinding(t, rep, offsetfile.SeverityError, "g/t/8", "unknown value encoding version 9")
	wantFinding(t, rep, offsetfile.SeverityError, `group "g" topic "t"`, "partition key is 3 bytes")
	wantFinding(t, rep, offsetfile.SeverityError, "g/t/1", "failure entry does not decode", "unknown failure encoding version 7")
	// Every other record still decoded and is counted by version.
	if rep.Records[2] != 48 || rep.Records[1] != 1 || rep.Records[9] != 1 {
		t.Errorf("records by version: %v", rep.Records)
	}
}

func TestCheckDamagedFile(t *testing.T) {
	_, full := storeFile(t)
	t.Run("truncated", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "truncated.db")
		must(t, os.WriteFile(path, full[:12288], 0o600))
		rep := checkOK(t, path)
		wantFinding(t, rep, offsetfile.SeverityError, "truncated or corrupt bbolt database")
	})
	t.Run("meta pages", func(t *testing.T) {
		b := append([]byte(nil), full...)
		b[16+8] ^= 0xff
		b[4096+16+8] ^= 0xff
		path := filepath.Join(t.TempDir(), "corrupt.db")
		must(t, os.WriteFile(path, b, 0o600))
		rep := checkOK(t, path)
		wantFinding(t, rep, offsetfile.SeverityError, "both meta pages are invalid")
	})
	t.Run("data pages", func(t *testing.T) {
		// Overwrite every page past the meta pages with a pattern: the tree
		// and the freelist are garbage.
		for _, fill := range []byte{0x00, 0xff, 0x10} {
			b := append([]byte(nil), full...)
			for i := 2 * 4096; i < len(b); i++ {
				b[i] = fill
			}
			path := filepath.Join(t.TempDir(), "pages.db")
			must(t, os.WriteFile(path, b, 0o600))
			rep := checkOK(t, path)
			if rep.Worst() != offsetfile.SeverityError {
				t.Errorf("fill %#x: worst finding %v, want error: %v", fill, rep.Worst(), rep.Findings)
			}
		}
	})
}

func TestCheckRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	must(t, syscall.Mkfifo(fifo, 0o600))
	garbage := filepath.Join(dir, "garbage.db")
	must(t, os.WriteFile(garbage, []byte(strings.Repeat("not bbolt ", 1000)), 0o600))
	noBuckets := filepath.Join(dir, "nobuckets.db")
	writeBolt(t, noBuckets, nil, nil)
	v2 := filepath.Join(dir, "v2.db")
	writeBolt(t, v2, nil, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return b.Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 2))
	})
	huge := filepath.Join(dir, "huge.db")
	f, err := os.Create(huge)
	must(t, err)
	must(t, f.Truncate(10<<30)) // sparse
	must(t, f.Close())

	tests := []struct {
		path     string
		sentinel error
		want     string
	}{
		{filepath.Join(dir, "missing.db"), fs.ErrNotExist, "file does not exist"},
		{dir, nil, "is a directory"},
		{fifo, nil, "not a regular file"},
		{garbage, offsetfile.ErrSchema, "not a bbolt database"},
		{noBuckets, offsetfile.ErrSchema, "no buckets"},
		{v2, offsetfile.ErrSchema, "schema version 2"},
		{huge, offsetfile.ErrSchema, "not a bbolt database"},
	}
	for _, tt := range tests {
		start := time.Now()
		rep, err := offsetfile.Check(tt.path, nil)
		if err == nil {
			t.Errorf("Check(%s) = %+v, want an error", tt.path, rep)
			continue
		}
		t.Log(err)
		var fe *offsetfile.FileError
		if !errors.As(err, &fe) || fe.Op != "check" || !strings.Contains(err.Error(), tt.path) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Check(%s): %v, want a *FileError naming the path and %q", tt.path, err, tt.want)
		}
		if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
			t.Errorf("Check(%s): %v, want %v", tt.path, err, tt.sentinel)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Check(%s) took %v", tt.path, d)
		}
	}
}

func TestCheckInUse(t *testing.T) {
	path := tempPath(t)
	mustOpen(t, path, nil)
	_, err := offsetfile.Check(path, &offsetfile.Options{Timeout: 50 * time.Millisecond})
	if !errors.Is(err, offsetfile.ErrInUse) {
		t.Errorf("Check of a file in use: %v, want ErrInUse", err)
	}
}

func TestCheckUnreadable(t *testing.T) {
	path, _ := storeFile(t)
	must(t, os.Chmod(path, 0))
	var err error
	testfs.AsUnprivileged(t, func() { _, err = offsetfile.Check(path, nil) })
	if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), path) {
		t.Errorf("Check of an unreadable file: %v, want a permission error naming the file", err)
	}
}
