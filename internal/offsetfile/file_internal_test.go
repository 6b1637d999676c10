package offsetfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Open's header check refuses truncated files before bbolt reads them; this
// tests the fallback behind it: bbolt panicking or faulting on a file the
// check let through becomes an error, and the file lock is released.
func TestOpenBoltRecoversFromCorruptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offsets.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(50) {
		if err := s.SetWatermark(Key{Group: "g", Topic: "t", Partition: p}, 1, 1, "m"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{12288, 16384} {
		if err := os.WriteFile(path, b[:size], 0o600); err != nil {
			t.Fatal(err)
		}
		for _, ro := range []bool{false, true, false} {
			db, err := openBolt(path, &Options{Timeout: 100 * time.Millisecond, ReadOnly: ro})
			if err == nil {
				err = protect(func() error {
					return db.View(func(tx *bolt.Tx) error {
						c := &checker{rep: &CheckReport{Records: map[byte]int{}}, tx: tx, recs: map[Key]Record{}, failures: map[Key][2]int64{}}
						c.walk()
						return nil
					})
				})
				db.Close()
			}
			if errors.Is(err, ErrInUse) {
				t.Fatalf("size %d: a failed open left the file locked: %v", size, err)
			}
			if err == nil || !strings.Contains(err.Error(), "corrupt") {
				t.Errorf("size %d, read-only %v: %v, want a corrupt-file error", size, ro, err)
			}
		}
	}
}
