package testsupport_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
)

func TestMain(m *testing.M) {
	if code, ok := testsupport.ChildMain(); ok {
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}

// fakeT records what an assertion reports instead of failing the test.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// assert runs fn with a fakeT on a goroutine of its own, as t.Fatal needs,
// and returns what it reported ("" if nothing).
func assert(t *testing.T, fn func(t testing.TB)) string {
	f := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.failed
}

// counts is a Handled of fixed counts, "partition@offset" -> times.
type counts map[string]int

func (c counts) Times(p int, o int64) int { return c[fmt.Sprintf("%d@%d", p, o)] }

func TestCheck(t *testing.T) {
	// Partition 0: [2, 6) with 3 lost and 4 handled three times; partition
	// 1: [0, 2) with 0 handled twice. Offsets outside the range do not
	// count.
	h := counts{"0@2": 1, "0@4": 3, "0@5": 1, "1@0": 2, "1@1": 1, "0@9": 5}
	d := testsupport.Check(h, map[int]int64{0: 2}, map[int]int64{0: 6, 1: 2})
	if d.Offsets != 6 || fmt.Sprint(d.Lost) != "[0@3]" || fmt.Sprint(d.Twice) != "[0@4 1@0]" || d.Extra != 3 {
		t.Fatalf("Check = %+v, want 6 offsets, lost [0@3], twice [0@4 1@0], 3 extra", d)
	}
	if s := d.String(); !strings.Contains(s, "1 of 6 offsets lost, first 0@3") || !strings.Contains(s, "2 handled more than once (3 extra handlings), first 0@4, 1@0") {
		t.Errorf("String() = %q", s)
	}

	if msg := assert(t, func(t testing.TB) { testsupport.ExactlyOnce(t, h, map[int]int64{0: 2}, map[int]int64{0: 6, 1: 2}) }); !strings.Contains(msg, "first 0@3") {
		t.Errorf("ExactlyOnce reported %q, want it to name the lost offset 0@3", msg)
	}
	if msg := assert(t, func(t testing.TB) { testsupport.ExactlyOnce(t, h, nil, map[int]int64{1: 2}) }); !strings.Contains(msg, "first 1@0") {
		t.Errorf("ExactlyOnce reported %q, want it to name the offset handled twice, 1@0", msg)
	}
	if msg := assert(t, func(t testing.TB) {
		testsupport.ExactlyOnce(t, h, map[int]int64{0: 4, 1: 1}, map[int]int64{0: 4, 1: 2})
	}); msg != "" {
		t.Errorf("ExactlyOnce of offsets handled once reported %q", msg)
	}
	// NoneLost lets duplicates through, and reports them.
	var none testsupport.Delivery
	if msg := assert(t, func(t testing.TB) { none = testsupport.NoneLost(t, h, nil, map[int]int64{1: 2}) }); msg != "" || none.Extra != 1 {
		t.Errorf("NoneLost of duplicates reported %q and %d extra handlings, want nothing and 1", msg, none.Extra)
	}
	if msg := assert(t, func(t testing.TB) { testsupport.NoneLost(t, h, nil, testsupport.Offsets(2, 3)) }); !strings.Contains(msg, "3 of 6 offsets lost, first 0@0, 0@1, 1@2;") {
		t.Errorf("NoneLost reported %q, want the lost offsets named in order", msg)
	}
}

func TestRecorder(t *testing.T) {
	refused := errors.New("refused")
	rec := &testsupport.Recorder{Before: func(_ context.Context, m kafka.Message) error {
		if m.Offset == 9 {
			return refused
		}
		return nil
	}}
	for _, m := range []kafka.Message{
		{Topic: "a", Partition: 0, Offset: 0, Value: testsupport.Value(0, 0)},
		{Topic: "a", Partition: 0, Offset: 0, Value: testsupport.Value(0, 0)},
		{Topic: "a", Partition: 1, Offset: 3, Value: []byte("other")},
		{Topic: "b", Partition: 0, Offset: 0, Value: testsupport.Value(0, 0)},
		{Topic: "b", Partition: 0, Offset: 9, Value: testsupport.Value(0, 9)},
	} {
		if err := rec.Handle(context.Background(), m); err != nil && !errors.Is(err, refused) {
			t.Fatal(err)
		}
	}
	if n := rec.Count(); n != 3 {
		t.Errorf("Count() = %d, want 3 distinct offsets (a/0@0, a/1@3, b/0@0; b/0@9 refused by Before)", n)
	}
	if n := rec.CountOf("a"); n != 2 {
		t.Errorf("CountOf(a) = %d, want 2", n)
	}
	if n := rec.Times(0, 0); n != 3 {
		t.Errorf("Times(0, 0) = %d, want 3 (twice in a, once in b)", n)
	}
	if n := rec.Topic("b").Times(0, 0); n != 1 {
		t.Errorf("Topic(b).Times(0, 0) = %d, want 1", n)
	}
	if bad := rec.BadValues(); len(bad) != 1 || !strings.Contains(bad[0], "a/1@3") {
		t.Errorf("BadValues() = %q, want a/1@3 alone", bad)
	}
}

func TestReadLedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if l := testsupport.ReadLedger(t, path); l.Len() != 0 {
		t.Fatalf("a missing ledger has %d entries", l.Len())
	}
	// The last line was cut by a kill.
	if err := os.WriteFile(path, []byte("0 1\n1 7\n0 1\n1 "), 0o600); err != nil {
		t.Fatal(err)
	}
	l := testsupport.ReadLedger(t, path)
	if l.Len() != 3 || l.Distinct() != 2 || l.Times(0, 1) != 2 || l.Times(1, 7) != 1 || fmt.Sprint(l.Entries) != "[0@1 1@7 0@1]" {
		t.Errorf("ledger %v: %d entries, %d distinct; want [0@1 1@7 0@1]", l.Entries, l.Len(), l.Distinct())
	}
}

func TestHoldLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offsets.db")
	if pid := testsupport.HoldLock(t, path); pid == os.Getpid() || pid <= 0 {
		t.Fatalf("HoldLock returned pid %d (the test's own is %d)", pid, os.Getpid())
	}
	s, err := offsetfile.Open(path, &offsetfile.Options{Timeout: 100 * time.Millisecond})
	if err == nil {
		_ = s.Close()
	}
	if !errors.Is(err, offsetfile.ErrInUse) {
		t.Fatalf("Open while the child holds the file: %v, want ErrInUse", err)
	}
}
