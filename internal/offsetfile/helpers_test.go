package offsetfile_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// tempPath returns a path for a new store file in a fresh directory.
func tempPath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "offsets.db")
}

// mustOpen opens the store at path and registers a cleanup that closes it
// (Close errors fail the test) and checks the file's consistency with bbolt's
// tx.Check.
func mustOpen(t testing.TB, path string, opts *offsetfile.Options) *offsetfile.Store {
	t.Helper()
	s, err := offsetfile.Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		checkFile(t, path)
	})
	return s
}

// mustOpenStore opens a new store in t.TempDir(); see mustOpen.
func mustOpenStore(t testing.TB, opts *offsetfile.Options) *offsetfile.Store {
	t.Helper()
	return mustOpen(t, tempPath(t), opts)
}

// checkFile runs bbolt's consistency check on a closed store file and
// checks its schema version.
func checkFile(t testing.TB, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Errorf("check %s: %v", path, err)
		return
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		if meta := tx.Bucket([]byte("meta")); meta == nil {
			errs = append(errs, errors.New("no meta bucket"))
		} else if v := meta.Get([]byte("schema")); len(v) != 4 || binary.BigEndian.Uint32(v) != offsetfile.SchemaVersion {
			errs = append(errs, errors.New("bad schema value"))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Errorf("check %s: %v", path, err)
	}
}

func flush(t testing.TB, s *offsetfile.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
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

// wantOpenError opens path, expecting an error that names the path and
// contains each of substrs; it checks that the file's bytes are unchanged.
func wantOpenError(t *testing.T, path string, opts *offsetfile.Options, substrs ...string) error {
	t.Helper()
	var before [32]byte
	fi, statErr := os.Stat(path)
	regular := statErr == nil && fi.Mode().IsRegular()
	if regular {
		before = hashFile(t, path)
	}
	s, err := offsetfile.Open(path, opts)
	if err == nil {
		s.Close()
		t.Fatalf("Open(%s) succeeded, want an error", path)
	}
	msg := err.Error()
	t.Log(msg)
	if !strings.Contains(msg, path) {
		t.Errorf("error %q does not name the path", msg)
	}
	for _, sub := range substrs {
		if !strings.Contains(msg, sub) {
			t.Errorf("error %q does not contain %q", msg, sub)
		}
	}
	var fe *offsetfile.FileError
	if !errors.As(err, &fe) || fe.Path != path || fe.Op != "open" {
		t.Errorf("error %#v is not a *FileError{Path: %q, Op: \"open\"}", err, path)
	}
	if regular && hashFile(t, path) != before {
		t.Errorf("Open changed the bytes of %s", path)
	}
	return err
}

// writeBolt creates a bbolt file at path and runs fn in an update
// transaction, for files tidemark did not write.
func writeBolt(t testing.TB, path string, opts *bolt.Options, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		t.Fatal(err)
	}
	if fn != nil {
		if err := db.Update(fn); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// recordsEqual compares records, times with Equal.
func recordsEqual(a, b offsetfile.Record) bool {
	if (a.LastReset == nil) != (b.LastReset == nil) {
		return false
	}
	if a.LastReset != nil {
		ra, rb := *a.LastReset, *b.LastReset
		if !ra.At.Equal(rb.At) || ra.From != rb.From || ra.To != rb.To || ra.Reason != rb.Reason {
			return false
		}
	}
	return a.Watermark == b.Watermark && a.RecordedAt.Equal(b.RecordedAt) &&
		a.Generation == b.Generation && a.Member == b.Member &&
		a.Committed == b.Committed && a.CommittedAt.Equal(b.CommittedAt)
}
