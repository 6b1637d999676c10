package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLedgerRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	inc := Inc{"c2", 3}
	w, err := OpenLedger(path, inc)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := w.Generation(now, 4, "member one"); err != nil {
		t.Fatal(err)
	}
	if err := w.Lost(now, 2); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := int64(0); o < 100; o++ {
				if err := w.Handled(now, "topic", p, o, Value(p, o), 4); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := ReadLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Handlings) != 400 || len(l.Gens) != 1 || l.Torn != 0 {
		t.Fatalf("%d handlings, %d generations, %d torn; want 400, 1, 0", len(l.Handlings), len(l.Gens), l.Torn)
	}
	if g := l.Gens[0]; g.Gen != 4 || g.Member != "member_one" || g.T != now.UnixNano() {
		t.Fatalf("generation line %+v", g)
	}
	if len(l.Lost) != 1 || l.Lost[0] != now.UnixNano() {
		t.Fatalf("lost lines %v, want [%d]", l.Lost, now.UnixNano())
	}
	seen := map[[2]int64]bool{}
	for _, h := range l.Handlings {
		if h.Inc != inc || h.Gen != 4 || h.Topic != "topic" || h.Value != string(Value(h.Partition, h.Offset)) || h.T != now.UnixNano() {
			t.Fatalf("handling %+v", h)
		}
		seen[[2]int64{int64(h.Partition), h.Offset}] = true
	}
	if len(seen) != 400 {
		t.Fatalf("%d distinct handlings, want 400", len(seen))
	}
	if err := w.Handled(now, "topic", 0, 1, []byte("a b"), 1); err == nil {
		t.Fatal("a value with a space was accepted")
	}
}

func TestLedgerTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	good := "H 1 t 0 0 p0-s000000000 c1 1 1\n"
	if err := os.WriteFile(path, []byte(good+"H 2 t 0 1 p0-s0000"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := ReadLedger(path)
	if err != nil || len(l.Handlings) != 1 || l.Torn != 1 {
		t.Fatalf("ReadLedger: %d handlings, %d torn, err %v; want 1, 1, nil", len(l.Handlings), l.Torn, err)
	}
	// A bad complete line is corruption, not a torn tail.
	if err := os.WriteFile(path, []byte("H 2 t x\n"+good), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLedger(path); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("ReadLedger of a corrupt ledger: err %v, want one naming line 1", err)
	}
	l, err = ReadLedger(filepath.Join(t.TempDir(), "missing"))
	if err != nil || len(l.Handlings) != 0 {
		t.Fatalf("a missing ledger reads as empty: %v %v", l, err)
	}
}
