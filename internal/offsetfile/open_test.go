package offsetfile_test

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testfs"
	"github.com/tidemark/tidemark/internal/testsupport"
)

func TestNewFileMode(t *testing.T) {
	s := mustOpenStore(t, nil)
	fi, err := os.Stat(s.Path())
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("new file mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestLockedBySecondOpen(t *testing.T) {
	path := tempPath(t)
	mustOpen(t, path, nil)

	start := time.Now()
	err := wantOpenError(t, path, &offsetfile.Options{Timeout: 100 * time.Millisecond},
		"file is in use by another process (", "lock not acquired within 100ms)")
	if !errors.Is(err, offsetfile.ErrInUse) {
		t.Errorf("second Open: %v, want ErrInUse", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 2*time.Second {
		t.Errorf("second Open gave up after %v, want about 100ms", d)
	}
	// Read-only opens are refused too while a writer holds the file.
	err = wantOpenError(t, path, &offsetfile.Options{Timeout: 50 * time.Millisecond, ReadOnly: true})
	if !errors.Is(err, offsetfile.ErrInUse) {
		t.Errorf("read-only Open: %v, want ErrInUse", err)
	}
}

func TestLockDefaultTimeout(t *testing.T) {
	path := tempPath(t)
	mustOpen(t, path, nil)
	start := time.Now()
	_, err := offsetfile.Open(path, nil)
	// On Linux the error names the holder: this process.
	holder := ""
	if runtime.GOOS == "linux" {
		holder = fmt.Sprintf("pid %d holds its lock; ", os.Getpid())
	}
	want := "offsetstore: open " + path + ": file is in use by another process (" + holder + "lock not acquired within 1s)"
	if err == nil || err.Error() != want {
		t.Errorf("second Open: %v\nwant: %s", err, want)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
		t.Errorf("second Open gave up after %v, want about 1s", d)
	}
}

func TestLockedByAnotherProcess(t *testing.T) {
	path := tempPath(t)
	pid := testsupport.HoldLock(t, path)
	err := wantOpenError(t, path, &offsetfile.Options{Timeout: 100 * time.Millisecond}, "in use by another process")
	if !errors.Is(err, offsetfile.ErrInUse) {
		t.Errorf("Open while another process holds the file: %v, want ErrInUse", err)
	}
	// Linux tells who holds the lock (/proc/locks): the error names it.
	if want := fmt.Sprintf("pid %d holds its lock", pid); runtime.GOOS == "linux" && !strings.Contains(err.Error(), want) {
		t.Errorf("Open while pid %d holds the file: %v, want it named (%q)", pid, err, want)
	}
}

func TestOpenBadPaths(t *testing.T) {
	dir := t.TempDir()

	t.Run("directory", func(t *testing.T) {
		wantOpenError(t, dir, nil, "is a directory")
		wantOpenError(t, dir, &offsetfile.Options{ReadOnly: true}, "is a directory")
	})
	t.Run("missing parent", func(t *testing.T) {
		path := filepath.Join(dir, "no", "such", "dir", "x.db")
		err := wantOpenError(t, path, nil, "parent directory "+filepath.Join(dir, "no", "such", "dir")+" does not exist")
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("error %v does not match fs.ErrNotExist", err)
		}
	})
	t.Run("read-only missing file", func(t *testing.T) {
		path := filepath.Join(dir, "missing.db")
		err := wantOpenError(t, path, &offsetfile.Options{ReadOnly: true}, "does not exist")
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("error %v does not match fs.ErrNotExist", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Error("a read-only Open created the file")
		}
	})
	t.Run("empty path", func(t *testing.T) {
		if _, err := offsetfile.Open("", nil); err == nil {
			t.Error("Open(\"\") succeeded")
		}
	})
	t.Run("bad options", func(t *testing.T) {
		path := filepath.Join(dir, "opts.db")
		wantOpenError(t, path, &offsetfile.Options{Timeout: -1}, "negative Options.Timeout")
		wantOpenError(t, path, &offsetfile.Options{FlushInterval: -1}, "negative Options.FlushInterval")
	})
}

func TestOpenGarbage(t *testing.T) {
	for _, size := range []int{1, 100, 4096, 64 << 10} {
		path := filepath.Join(t.TempDir(), "random.db")
		b := make([]byte, size)
		rand.Read(b)
		must(t, os.WriteFile(path, b, 0o600))
		err := wantOpenError(t, path, nil, "not a tidemark offset store", "not a bbolt database")
		if !errors.Is(err, offsetfile.ErrSchema) {
			t.Errorf("%d random bytes: %v, want ErrSchema", size, err)
		}
		wantOpenError(t, path, &offsetfile.Options{ReadOnly: true}, "not a bbolt database")
	}
}

// storeFile writes a store with a few records and returns its path and bytes.
func storeFile(t *testing.T) (string, []byte) {
	t.Helper()
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	for p := range int32(50) {
		must(t, s.SetWatermark(offsetfile.Key{Group: "g", Topic: "t", Partition: p}, int64(p)*1000, 1, "member"))
	}
	must(t, s.Close())
	b, err := os.ReadFile(path)
	must(t, err)
	return path, b
}

func TestOpenTruncated(t *testing.T) {
	_, full := storeFile(t)
	// Every bbolt file has at least 4 pages of 4096 bytes in use.
	for _, size := range []int{10, 100, 4096, 4096 + 100, 12288, 16383, len(full) / 4} {
		path := filepath.Join(t.TempDir(), "truncated.db")
		must(t, os.WriteFile(path, full[:size], 0o600))
		wantOpenError(t, path, nil)
		wantOpenError(t, path, &offsetfile.Options{ReadOnly: true})
		if fi, _ := os.Stat(path); fi.Size() != int64(size) {
			t.Errorf("size changed from %d to %d", size, fi.Size())
		}
	}
	path := filepath.Join(t.TempDir(), "truncated.db")
	must(t, os.WriteFile(path, full[:12288], 0o600))
	wantOpenError(t, path, nil, "truncated or corrupt", "12288 bytes")
}

func TestOpenCorruptMetaPages(t *testing.T) {
	_, full := storeFile(t)
	b := append([]byte(nil), full...)
	b[16+8] ^= 0xff      // page size field of meta page 0: its checksum fails
	b[4096+16+8] ^= 0xff // and of meta page 1
	path := filepath.Join(t.TempDir(), "corrupt.db")
	must(t, os.WriteFile(path, b, 0o600))
	wantOpenError(t, path, nil, "both meta pages are invalid", "checksum")
}

// A 0-byte file is refused, read-only or not, and left as it was: it may
// be a file that lost its history, and starting with none is the
// operator's choice (issue 27). Before, a read-write Open initialised it.
func TestOpenEmptyFile(t *testing.T) {
	path := tempPath(t)
	must(t, os.WriteFile(path, nil, 0o600))
	for _, ro := range []bool{false, true} {
		err := wantOpenError(t, path, &offsetfile.Options{ReadOnly: ro}, "0 bytes", "move it aside or delete it to start with no history")
		if !errors.Is(err, offsetfile.ErrDamaged) {
			t.Errorf("read-only %v: Open of an empty file: %v, want ErrDamaged", ro, err)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Errorf("the empty file changed: %v %v", fi, err)
	}
	rep := checkOK(t, path)
	wantFinding(t, rep, offsetfile.SeverityError, "0 bytes")
}

// A file cut short of a whole page is refused even when the pages in use
// are all there. Before, Open accepted it.
func TestOpenPartialPage(t *testing.T) {
	_, full := storeFile(t)
	path := filepath.Join(t.TempDir(), "partial.db")
	must(t, os.WriteFile(path, append(full, make([]byte, 100)...), 0o600))
	for _, ro := range []bool{false, true} {
		err := wantOpenError(t, path, &offsetfile.Options{ReadOnly: ro}, "not a whole number of 4096-byte pages", "tidemark export --salvage")
		if !errors.Is(err, offsetfile.ErrDamaged) {
			t.Errorf("read-only %v: %v, want ErrDamaged", ro, err)
		}
	}
	wantFinding(t, checkOK(t, path), offsetfile.SeverityError, "not a whole number")
}

func TestOpenBoltWithoutBuckets(t *testing.T) {
	path := tempPath(t)
	writeBolt(t, path, nil, nil)
	err := wantOpenError(t, path, &offsetfile.Options{ReadOnly: true}, "no buckets")
	if !errors.Is(err, offsetfile.ErrSchema) {
		t.Errorf("read-only Open of a bbolt file without buckets: %v, want ErrSchema", err)
	}
	s := mustOpen(t, path, nil) // initialised
	if n := len(s.Records()); n != 0 {
		t.Errorf("%d records", n)
	}
}

func TestOpenSchema(t *testing.T) {
	schema := func(v []byte) func(tx *bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("meta"))
			if err != nil {
				return err
			}
			return b.Put([]byte("schema"), v)
		}
	}
	version := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	foreign := func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("widgets"))
		return err
	}
	tests := []struct {
		name string
		opts *bolt.Options
		fill func(tx *bolt.Tx) error
		want []string
	}{
		{"newer version", nil, schema(version(2)), []string{"schema version 2", "supports schema version 1"}},
		{"version 0", nil, schema(version(0)), []string{"schema version 0", "supports schema version 1"}},
		{"unreadable version", nil, schema([]byte("1")), []string{"unreadable", "supports schema version 1"}},
		{"foreign buckets", nil, foreign, []string{`no "meta" bucket but a bucket "widgets"`, "supports schema version 1"}},
		// bbolt rewrites a file without a persisted freelist when it opens it
		// read-write; the file must still be left alone.
		{"foreign, no freelist", &bolt.Options{NoFreelistSync: true}, foreign, []string{`bucket "widgets"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tempPath(t)
			writeBolt(t, path, tt.opts, tt.fill)
			for _, ro := range []bool{false, true} {
				err := wantOpenError(t, path, &offsetfile.Options{ReadOnly: ro}, tt.want...)
				if !errors.Is(err, offsetfile.ErrSchema) {
					t.Errorf("ReadOnly=%v: %v, want ErrSchema", ro, err)
				}
			}
		})
	}
}

func TestOpenBadRecord(t *testing.T) {
	path, _ := storeFile(t)
	pk := func(p uint32) []byte { return binary.BigEndian.AppendUint32(nil, p) }
	tests := []struct {
		name string
		put  func(groups *bolt.Bucket) error
		want []string
	}{
		{"garbage value", func(g *bolt.Bucket) error {
			return g.Bucket([]byte("g")).Bucket([]byte("t")).Put(pk(7), []byte{1, 0, 0xff})
		}, []string{`group "g" topic "t" partition 7`, "record does not decode", "tidemark export --salvage"}},
		{"unknown value version", func(g *bolt.Bucket) error {
			return g.Bucket([]byte("g")).Bucket([]byte("t")).Put(pk(8), []byte{9, 0, 0, 0, 0, 0})
		}, []string{`group "g" topic "t" partition 8`, "unknown value encoding version 9"}},
		{"short partition key", func(g *bolt.Bucket) error {
			return g.Bucket([]byte("g")).Bucket([]byte("t")).Put([]byte{1, 2, 3}, []byte{1, 0, 0, 0, 0, 0})
		}, []string{`group "g" topic "t"`, "partition key is 3 bytes"}},
		{"value instead of topic", func(g *bolt.Bucket) error {
			return g.Bucket([]byte("g")).Put([]byte("x"), []byte("y"))
		}, []string{`group "g"`, `unexpected key "x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Also without a persisted freelist, which a read-write bbolt.Open
			// would write: the file must still be left alone.
			for _, bopts := range []*bolt.Options{nil, {NoFreelistSync: true}} {
				p := filepath.Join(t.TempDir(), "bad.db")
				b, err := os.ReadFile(path)
				must(t, err)
				must(t, os.WriteFile(p, b, 0o600))
				writeBolt(t, p, bopts, func(tx *bolt.Tx) error { return tt.put(tx.Bucket([]byte("groups"))) })
				wantOpenError(t, p, nil, tt.want...)
				wantOpenError(t, p, &offsetfile.Options{ReadOnly: true}, tt.want...)
			}
		})
	}
}

func TestOpenUnwritable(t *testing.T) {
	base := t.TempDir()
	// Let an unprivileged user reach base (t.TempDir's parent is 0700).
	must(t, os.Chmod(filepath.Dir(base), 0o755))
	dir := filepath.Join(base, "ro")
	must(t, os.Mkdir(dir, 0o755))
	_, full := storeFile(t)
	existing := filepath.Join(dir, "existing.db")
	must(t, os.WriteFile(existing, full, 0o444))
	must(t, os.Chmod(dir, 0o555))
	t.Cleanup(func() { os.Chmod(dir, 0o755) })

	newPath := filepath.Join(dir, "new.db")
	var errNew, errExisting, errRO error
	testfs.AsUnprivileged(t, func() {
		_, errNew = offsetfile.Open(newPath, nil)
		_, errExisting = offsetfile.Open(existing, &offsetfile.Options{Timeout: 100 * time.Millisecond})
		var s *offsetfile.Store
		if s, errRO = offsetfile.Open(existing, &offsetfile.Options{ReadOnly: true}); errRO == nil {
			errRO = s.Close()
		}
	})
	for name, err := range map[string]error{"new file": errNew, "existing file": errExisting} {
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("%s in an unwritable folder: %v, want a permission error", name, err)
		} else if path := map[string]string{"new file": newPath, "existing file": existing}[name]; !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), "permission denied") {
			t.Errorf("error %q does not name the file and the cause", err)
		}
	}
	if _, err := os.Stat(newPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("file created in an unwritable folder: %v", err)
	}
	if errRO != nil {
		t.Errorf("read-only Open of a readable file: %v", errRO)
	}
	if b, _ := os.ReadFile(existing); string(b) != string(full) {
		t.Error("the existing file changed")
	}
}
