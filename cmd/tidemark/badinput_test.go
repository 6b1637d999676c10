//go:build unix

package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/internal/testfs"
)

// badFiles makes one path per kind of bad input and returns them with the
// words the error must contain.
func badFiles(t *testing.T) map[string]struct {
	path string
	want string
} {
	t.Helper()
	base := t.TempDir()
	// Let an unprivileged user reach base (t.TempDir's parent is 0700).
	must(t, os.Chmod(filepath.Dir(base), 0o755))
	must(t, os.Chmod(base, 0o755))
	p := func(name string) string { return filepath.Join(base, name) }

	must(t, syscall.Mkfifo(p("fifo"), 0o600))
	must(t, os.WriteFile(p("empty.db"), nil, 0o600))
	must(t, os.WriteFile(p("text.db"), []byte(strings.Repeat("not an offset file\n", 500)), 0o600))
	must(t, os.Mkdir(p("dir"), 0o755))
	writeBolt := func(path string, fn func(tx *bolt.Tx) error) {
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
		must(t, err)
		if fn != nil {
			must(t, db.Update(fn))
		}
		must(t, db.Close())
	}
	writeBolt(p("v2.db"), func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return b.Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 2))
	})
	writeBolt(p("foreign.db"), func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("widgets"))
		return err
	})
	f, err := os.Create(p("huge.db"))
	must(t, err)
	must(t, f.Truncate(10<<30)) // 10 GiB, sparse: reading it all would take minutes
	must(t, f.Close())
	unreadable := fixture(t)
	must(t, os.Rename(unreadable, p("unreadable.db")))
	must(t, os.Chmod(p("unreadable.db"), 0))

	return map[string]struct {
		path string
		want string
	}{
		"missing":      {p("missing.db"), "no such file"},
		"directory":    {p("dir"), "is a directory"},
		"fifo":         {p("fifo"), "not a regular file (a named pipe)"},
		"empty":        {p("empty.db"), "0 bytes"},
		"not bbolt":    {p("text.db"), "not a bbolt database"},
		"schema 2":     {p("v2.db"), "schema version 2, this build supports schema version 1"},
		"foreign":      {p("foreign.db"), `bucket "widgets"`},
		"huge":         {p("huge.db"), "not a bbolt database (no bbolt magic number, 10737418240 bytes)"},
		"unreadable":   {p("unreadable.db"), "permission denied"},
		"missing dir":  {p("nodir/offsets.db"), "no such file"},
		"under a file": {filepath.Join(p("text.db"), "x.db"), "not a directory"},
	}
}

// Every bad input gets a clear message naming it, exit status 2, fast,
// from every subcommand, and the file is left as it was.
func TestBadInputs(t *testing.T) {
	files := badFiles(t)
	for name, bf := range files {
		t.Run(name, func(t *testing.T) {
			var before [32]byte
			fi, err := os.Stat(bf.path)
			regular := err == nil && fi.Mode().IsRegular() && fi.Size() < 1<<20 && name != "unreadable"
			if regular {
				before = hashFile(t, bf.path)
			}
			for _, args := range [][]string{
				{"inspect", bf.path},
				{"inspect", bf.path, "--json"},
				{"check", bf.path},
				{"export", bf.path},
				{"diff", bf.path, "--brokers", "127.0.0.1:1", "--timeout", "1s"},
				{"set", bf.path, "--group", "g", "--topic", "t", "--partition", "0", "--offset", "1"},
				{"set", bf.path, "--group", "g", "--topic", "t", "--partition", "0", "--offset", "1", "--dry-run"},
			} {
				var r result
				if name == "unreadable" {
					testfs.AsUnprivileged(t, func() { r = tidemark(t, args...) })
				} else {
					r = tidemark(t, args...)
				}
				want := bf.want
				if name == "unreadable" && args[0] == "set" && !strings.Contains(args[len(args)-1], "dry-run") {
					want = "permission denied" // read-write open
				}
				r.want(t, 2, bf.path, want)
				if r.took > 4*time.Second { // 2.5s by design, plus room for a loaded machine
					t.Errorf("%q took %v", args, r.took)
				}
				if strings.Contains(r.stderr, "panic") || r.stdout != "" && args[0] != "set" {
					t.Errorf("%q: stdout %q, stderr %q", args, r.stdout, r.stderr)
				}
			}
			if regular && hashFile(t, bf.path) != before {
				t.Errorf("%s changed", bf.path)
			}
		})
	}
}

// import reads its input before it touches the target; a target that is
// not an offset file is refused and left alone, a missing one is created.
func TestImportBadTargets(t *testing.T) {
	fixedNow(t, t0)
	doc := tidemark(t, "export", fixture(t)).stdout
	in := filepath.Join(t.TempDir(), "in.json")
	must(t, os.WriteFile(in, []byte(doc), 0o600))
	files := badFiles(t)
	for name, bf := range files {
		if name == "missing" || name == "empty" || name == "unreadable" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			r := tidemark(t, "import", bf.path, "--from", in).want(t, 2, bf.path)
			if r.took > 4*time.Second { // 2.5s by design, plus room for a loaded machine
				t.Errorf("took %v", r.took)
			}
		})
	}
	tidemark(t, "import", files["missing"].path, "--from", in).want(t, 0, "6 new")
	// The dry run predicts what the import does: refuse a 0-byte file.
	tidemark(t, "import", files["empty"].path, "--from", in, "--dry-run").want(t, 2, files["empty"].path, "0 bytes")
	if fi, err := os.Stat(files["empty"].path); err != nil || fi.Size() != 0 {
		t.Errorf("dry run into an empty file wrote it: %v %v", fi, err)
	}
	// A 0-byte file may have lost its history: the store refuses it
	// (issue 27); the operator deletes it to start over.
	tidemark(t, "import", files["empty"].path, "--from", in).want(t, 2, files["empty"].path, "0 bytes", "move it aside or delete it")
	if fi, err := os.Stat(files["empty"].path); err != nil || fi.Size() != 0 {
		t.Errorf("a refused import into an empty file wrote it: %v %v", fi, err)
	}
	var r result
	testfs.AsUnprivileged(t, func() { r = tidemark(t, "import", files["unreadable"].path, "--from", in) })
	r.want(t, 2, "permission denied")
}
