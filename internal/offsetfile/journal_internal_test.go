package offsetfile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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
	used := written(seed)
	seed, zeros := seed[:used], seed[:used+16] // the window's zeros after the entries
	f.Add(seed)
	f.Add(zeros)
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

// windowWrites is n keys whose records encode to about size bytes each.
func windowWrites(n, size int) []pendingWrite {
	w := make([]pendingWrite, n)
	for i := range w {
		w[i] = pendingWrite{
			key: Key{Group: "g", Topic: "t", Partition: int32(i)},
			rec: &Record{Watermark: int64(i), Committed: -1, Member: strings.Repeat("m", size)},
		}
	}
	encodeWrites(nil, w)
	return w
}

// The journal's window: entries that fit are stored in the mapping, the
// rest written past it, and a reader replays both; a checkpoint leaves
// the window zeroed, which reads as no entry and no torn tail.
func TestJournalWindow(t *testing.T) {
	if !canMap {
		t.Skip("no mapped window on this system: every entry is a pwrite")
	}
	path := filepath.Join(t.TempDir(), "f")
	j, err := openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close(false)
	if err := j.reset(42); err != nil {
		t.Fatal(err)
	}
	if j.win == nil {
		t.Fatal("no window mapped after the first reset")
	}
	small := windowWrites(2, 10)
	if err := j.append(small); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(j.path)
	if err != nil || fi.Size() != journalWindow {
		t.Fatalf("journal after an entry in the window: %v, %v; want %d bytes, its window", fi, err, journalWindow)
	}
	r, err := readJournal(path, 42)
	if err != nil || r.entries != 1 || r.torn != 0 || len(r.recs) != 2 {
		t.Fatalf("read after an entry in the window: %+v, %v; want 1 entry of 2 records, nothing torn", r, err)
	}
	big := windowWrites(100, 1000) // about 100 KB an entry: the third goes past the window
	for range 3 {
		if err := j.append(big); err != nil {
			t.Fatal(err)
		}
	}
	if j.size <= journalWindow {
		t.Fatalf("journal size %d, want past the window (%d)", j.size, journalWindow)
	}
	r, err = readJournal(path, 42)
	if err != nil || r.entries != 4 || r.torn != 0 || r.recs[big[99].key].Watermark != 99 {
		t.Fatalf("read with an entry past the window: %+v, %v; want 4 entries, nothing torn", r, err)
	}
	if err := j.reset(43); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(j.path)
	if err != nil || len(b) != journalWindow || slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
		t.Fatalf("journal after a reset: %d bytes, %v; want its window, zeroed", len(b), err)
	}
	r, err = readJournal(path, 43)
	if err != nil || r.entries != 0 || r.stale != 0 || r.torn != 0 {
		t.Fatalf("read after a reset: %+v, %v; want nothing", r, err)
	}

	// A partial entry before the zeros is torn, and only its bytes.
	if err := j.append(small); err != nil {
		t.Fatal(err)
	}
	whole := j.size
	if err := j.append(small); err != nil {
		t.Fatal(err)
	}
	clear(j.win[whole+journalHeader+5 : j.size]) // the second entry cut after 5 bytes of payload
	r, err = readJournal(path, 43)
	if err != nil || r.entries != 1 || r.torn != journalHeader+5 {
		t.Fatalf("read of an entry cut short: %+v, %v; want 1 entry and %d bytes torn", r, err, journalHeader+5)
	}
}

// A fault in the window (here the file truncated under the mapping, as an
// I/O error or a full disk would fault) is an error naming the journal,
// not a SIGBUS; the store checkpoints instead and maps a whole window again.
func TestJournalWindowFault(t *testing.T) {
	if !canMap {
		t.Skip("no mapped window on this system")
	}
	path := filepath.Join(t.TempDir(), "f")
	s, err := Open(path, &Options{SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := Key{Group: "g", Topic: "t", Partition: 0}
	for w := int64(1); w <= 2; w++ { // a checkpoint, then an entry in the window
		if err := s.SetWatermark(k, w, 1, "m"); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if s.j.win == nil || s.j.size == 0 {
		t.Fatalf("no entry in a mapped window (window %d bytes, %d used)", len(s.j.win), s.j.size)
	}
	if err := os.Truncate(path+JournalSuffix, 0); err != nil {
		t.Fatal(err)
	}
	err = inWindow(func() { s.j.win[0] = 1 })
	if err == nil || !strings.Contains(err.Error(), "fault") {
		t.Fatalf("a store past the file's end: %v, want an error saying it faulted", err)
	}
	if err := s.SetWatermark(k, 3, 1, "m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatalf("Flush after the window faulted: %v, want a checkpoint instead", err)
	}
	if rec, _ := s.Synced(k); rec.Watermark != 3 {
		t.Fatalf("synced watermark %d after the fault, want 3 (checkpointed)", rec.Watermark)
	}
	if err := s.SetWatermark(k, 4, 1, "m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Synced(k); rec.Watermark != 3 {
		t.Fatalf("synced watermark %d, want 3: the next flush goes to the journal again", rec.Watermark)
	}
	r, err := readJournal(path, s.j.gen)
	if err != nil || r.entries != 1 || r.recs[k].Watermark != 4 {
		t.Fatalf("journal after the fault: %+v, %v; want one entry with watermark 4", r, err)
	}
}
