package offsetfile

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadJournal reads hostile bytes as a journal: readJournal never
// panics, replays only whole entries whose checksum holds, and every record
// it replays is one validateRecord accepts; an entry it cannot decode is
// reported (bad), never applied in part.
func FuzzReadJournal(f *testing.F) {
	w := []pendingWrite{
		{key: Key{Group: "g", Topic: "t", Partition: 3}, rec: &Record{Watermark: 10, Committed: -1, Member: "m"}},
		{key: Key{Group: "g", Topic: "u", Partition: 0}, rec: &Record{Watermark: 7, Committed: 5, Completed: []Range{{9, 12}}}},
	}
	encodeWrites(nil, w)
	dir := f.TempDir()
	j, err := openJournal(filepath.Join(dir, "seed"))
	if err != nil {
		f.Fatal(err)
	}
	if err := j.reset(42); err != nil {
		f.Fatal(err)
	}
	for range 2 {
		if err := j.append(w); err != nil {
			f.Fatal(err)
		}
	}
	_ = j.close(false)
	seed, err := os.ReadFile(filepath.Join(dir, "seed") + JournalSuffix)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add(seed[:25])
	f.Add([]byte("TMJ1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(path+JournalSuffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := readJournal(path, 42)
		if err != nil {
			t.Fatalf("readJournal of %d bytes: %v", len(b), err)
		}
		if r.torn < 0 || r.torn > int64(len(b)) {
			t.Fatalf("torn %d of %d bytes", r.torn, len(b))
		}
		for k, rec := range r.recs {
			if err := validateKey(k); err != nil {
				t.Fatalf("replayed key %v: %v", k, err)
			}
			if err := validateRecord(&rec); err != nil {
				t.Fatalf("replayed record of %v: %v", k, err)
			}
		}
		if len(r.order) != len(r.recs) {
			t.Fatalf("%d keys in order, %d records", len(r.order), len(r.recs))
		}
	})
}
