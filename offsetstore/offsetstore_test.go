package offsetstore_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/offsetstore"
)

func TestOpenRefusesAFileInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offsets.db")
	s, err := offsetfile.Open(path, nil) // as a running consumer holds it
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := offsetstore.Open(path); !errors.Is(err, offsetstore.ErrInUse) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a file in use: %v, want ErrInUse naming %s", err, path)
	}
	if _, err := offsetstore.Check(path); !errors.Is(err, offsetstore.ErrInUse) {
		t.Fatalf("Check of a file in use: %v, want ErrInUse", err)
	}
}

func TestLookup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offsets.db")
	writeExampleFile(path)
	f, err := offsetstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if p, ok := f.Lookup("billing", "invoices", 1); !ok || p.Watermark != 7 || p.Committed != -1 || len(p.Completed) != 1 {
		t.Fatalf("Lookup(billing, invoices, 1) = %+v, %v", p, ok)
	}
	if p, ok := f.Lookup("billing", "invoices", 2); ok {
		t.Fatalf("Lookup of a partition never recorded = %+v, true", p)
	}
	if f.Path() != path {
		t.Fatalf("Path() = %q, want %q", f.Path(), path)
	}
}

func TestCheckReportsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offsets.db")
	writeExampleFile(path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, min(fi.Size()/2, 3*4096)); err != nil {
		t.Fatal(err)
	}
	rep, err := offsetstore.Check(path)
	if err != nil {
		t.Fatalf("Check of a truncated file: %v, want a report", err)
	}
	if err := rep.Err(); !errors.Is(err, offsetstore.ErrDamaged) || !strings.Contains(err.Error(), path) {
		t.Fatalf("report of a truncated file: Err() = %v, want ErrDamaged naming the file (findings %v)", err, rep.Findings)
	}
	if _, err := offsetstore.Open(path); !errors.Is(err, offsetstore.ErrDamaged) {
		t.Fatalf("Open of a truncated file: %v, want ErrDamaged", err)
	}
	if _, err := offsetstore.Check(filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Fatal("Check of a missing file: no error")
	}
}

func TestViewState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offsets.db")
	s, err := offsetfile.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := offsetfile.Key{Group: "g", Topic: "counts", Partition: 3}
	tx, err := s.BeginState(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context(), 10, 1, "m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := offsetstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = f.ViewState("g", "counts", 3, func(st handler.State) error {
		v, err := st.Get([]byte("k"))
		if err != nil || string(v) != "v" {
			t.Errorf("Get(k) = %q, %v, want v", v, err)
		}
		if err := st.Put([]byte("k"), []byte("w")); err == nil {
			t.Error("Put through a read-only view: no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
