package offsetfile_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

func TestMarker(t *testing.T) {
	s := mustOpenStore(t, nil)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 3}
	m, err := s.NewMarker(k, 7, "member-a")
	must(t, err)
	for wm := int64(1); wm <= 1000; wm++ {
		m.Set(wm)
	}
	if rec, _ := s.Get(k); rec.Watermark != 1000 || rec.Generation != 7 || rec.Member != "member-a" {
		t.Fatalf("Get after Set: %+v, want watermark 1000 of generation 7, member-a", rec)
	}
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 1000 {
		t.Fatalf("durable watermark %d after Flush, want 1000", rec.Watermark)
	}

	// Order with the other updates of the key is kept: a reset queued after
	// a Set wins, a Set after the reset wins over it.
	m.Set(1500)
	must(t, s.RecordReset(k, offsetfile.Reset{From: 1500, To: 2000, Reason: "test"}))
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 2000 || rec.LastReset == nil {
		t.Fatalf("after Set(1500) then a reset to 2000: %+v", rec)
	}
	m.Set(2001)
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 2001 {
		t.Fatalf("after a reset then Set(2001): watermark %d", rec.Watermark)
	}

	// Set from one goroutine while Flush runs from another: the last value
	// is durable after the last Flush.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for wm := int64(3000); wm < 20000; wm++ {
			m.Set(wm)
		}
	}()
	for i := 0; i < 20; i++ {
		flush(t, s)
	}
	wg.Wait()
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 19999 {
		t.Fatalf("durable watermark %d, want 19999", rec.Watermark)
	}
	m.Set(20000)
	m.Close()
	m.Set(30000) // after Close: ignored
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 20000 {
		t.Fatalf("durable watermark %d after Close", rec.Watermark)
	}
	if _, err := s.NewMarker(offsetfile.Key{Group: "", Topic: "t"}, 1, "m"); err == nil {
		t.Fatal("NewMarker accepted an empty group")
	}
}

// progress is a Progress over a watermark and ranges that the test changes
// from any goroutine.
type progress struct {
	mu    sync.Mutex
	wm    int64
	done  []offsetfile.Range
	calls int
}

func (p *progress) set(wm int64, done ...offsetfile.Range) {
	p.mu.Lock()
	p.wm, p.done = wm, done
	p.mu.Unlock()
}

func (p *progress) read() (int64, []offsetfile.Range) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	return p.wm, slices.Clone(p.done)
}

func TestProgressMarker(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	p := &progress{wm: -1}
	m, err := s.NewProgressMarker(k, 4, "member-b", p.read)
	must(t, err)

	// Nothing recorded until Changed; a negative watermark records nothing.
	m.Changed()
	flush(t, s)
	if _, ok := s.Get(k); ok {
		t.Fatal("a negative watermark from Progress was recorded")
	}

	p.set(10, offsetfile.Range{From: 12, To: 15}, offsetfile.Range{From: 20, To: 21})
	m.Changed()
	want := []offsetfile.Range{{From: 12, To: 15}, {From: 20, To: 21}}
	if rec, _ := s.Get(k); rec.Watermark != 10 || !slices.Equal(rec.Completed, want) || rec.Generation != 4 || rec.Member != "member-b" {
		t.Fatalf("Get after Changed: %+v, want watermark 10, completed %v, generation 4, member-b", rec, want)
	}
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 10 || !slices.Equal(rec.Completed, want) || rec.RecordedAt.IsZero() {
		t.Fatalf("Durable after Flush: %+v, want watermark 10, completed %v", rec, want)
	}

	// Returned records are copies: changing one changes neither the store
	// nor the next Get.
	rec, _ := s.Get(k)
	rec.Completed[0].To = 99
	if rec, _ := s.Durable(k); rec.Completed[0].To != 15 {
		t.Fatal("changing Get's Completed changed the store")
	}
	recs := s.Records()
	recs[0].Completed[1].From = 0
	if rec, _ := s.Get(k); !slices.Equal(rec.Completed, want) {
		t.Fatal("changing Records' Completed changed the store")
	}

	// Set is ignored on a progress marker; without Changed, no new fold.
	m.Set(1000)
	p.set(11, offsetfile.Range{From: 20, To: 22})
	flush(t, s)
	if rec, _ := s.Get(k); rec.Watermark != 10 {
		t.Fatalf("Set on a progress marker, or a change without Changed, was recorded: %+v", rec)
	}

	// Other updates of the key keep the ranges; SetWatermark clears them,
	// the next fold brings them back.
	must(t, s.SetCommitted(k, 10))
	m.Changed() // folded by the next update of the key, before it
	must(t, s.SetRun(k, offsetfile.RunState{Open: true, Inflight: -1}))
	if rec, _ := s.Get(k); rec.Watermark != 11 || !slices.Equal(rec.Completed, []offsetfile.Range{{From: 20, To: 22}}) || rec.Committed != 10 || rec.Run == nil {
		t.Fatalf("after SetCommitted, Changed, SetRun: %+v", rec)
	}
	must(t, s.SetWatermark(k, 12, 4, "member-b"))
	if rec, _ := s.Get(k); rec.Watermark != 12 || rec.Completed != nil {
		t.Fatalf("SetWatermark kept the ranges: %+v", rec)
	}
	p.set(13, offsetfile.Range{From: 20, To: 22})
	m.Changed()
	flush(t, s)
	must(t, s.RecordReset(k, offsetfile.Reset{From: 13, To: 100, Reason: "test"}))
	if rec, _ := s.Get(k); rec.Watermark != 100 || rec.Completed != nil {
		t.Fatalf("RecordReset kept the ranges: %+v", rec)
	}
	p.set(101, offsetfile.Range{From: 105, To: 106})
	m.Changed()
	flush(t, s)

	// Close folds the last value; Changed after Close is ignored.
	p.set(102, offsetfile.Range{From: 105, To: 107})
	m.Changed()
	m.Close()
	p.set(200)
	m.Changed()
	calls := p.calls
	flush(t, s)
	if p.calls != calls {
		t.Error("Progress was called after the Marker's Close")
	}
	want = []offsetfile.Range{{From: 105, To: 107}}
	if rec, _ := s.Durable(k); rec.Watermark != 102 || !slices.Equal(rec.Completed, want) {
		t.Fatalf("after Close: %+v, want watermark 102, completed %v", rec, want)
	}

	// The ranges survive a reopen, and a plain Marker's Set clears them.
	must(t, s.Close())
	s = mustOpen(t, path, nil)
	if rec, _ := s.Durable(k); rec.Watermark != 102 || !slices.Equal(rec.Completed, want) {
		t.Fatalf("after reopen: %+v, want watermark 102, completed %v", rec, want)
	}
	plain, err := s.NewMarker(k, 5, "member-c")
	must(t, err)
	plain.Changed() // ignored on a plain Marker
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 102 || rec.Generation != 4 {
		t.Fatalf("Changed on a plain Marker was recorded: %+v", rec)
	}
	plain.Set(103)
	plain.Close()
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 103 || rec.Completed != nil {
		t.Fatalf("a plain Marker's Set kept the ranges: %+v", rec)
	}

	if _, err := s.NewProgressMarker(k, 1, "m", nil); err == nil || !strings.Contains(err.Error(), "nil Progress") {
		t.Errorf("NewProgressMarker with a nil Progress: %v", err)
	}
	if _, err := s.NewProgressMarker(offsetfile.Key{Topic: "t"}, 1, "m", p.read); err == nil || !strings.Contains(err.Error(), "empty group") {
		t.Errorf("NewProgressMarker with an empty group: %v", err)
	}
}

// Closing the Store folds a progress marker's last change.
func TestProgressMarkerStoreClose(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, &offsetfile.Options{FlushInterval: time.Hour})
	must(t, err)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}
	p := &progress{}
	m, err := s.NewProgressMarker(k, 1, "m", p.read)
	must(t, err)
	p.set(7, offsetfile.Range{From: 9, To: 10})
	m.Changed()
	must(t, s.Close())
	s = mustOpen(t, path, &offsetfile.Options{ReadOnly: true})
	if rec, _ := s.Durable(k); rec.Watermark != 7 || !slices.Equal(rec.Completed, []offsetfile.Range{{From: 9, To: 10}}) {
		t.Fatalf("after Close of the Store: %+v", rec)
	}
}

// Ranges that break the rules are logged once, and what they claim above
// the watermark kept, sorted and merged; more than the bound are cut to the
// lowest ones.
func TestProgressMarkerInvalidRanges(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s := mustOpenStore(t, &offsetfile.Options{Logger: zap.New(core)})
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}
	p := &progress{}
	m, err := s.NewProgressMarker(k, 1, "m", p.read)
	must(t, err)
	for _, tc := range []struct{ bad, want []offsetfile.Range }{
		{[]offsetfile.Range{{From: 5, To: 8}}, []offsetfile.Range{{From: 6, To: 8}}},                                       // at the watermark
		{[]offsetfile.Range{{From: 6, To: 8}, {From: 8, To: 9}}, []offsetfile.Range{{From: 6, To: 9}}},                     // touching
		{[]offsetfile.Range{{From: 9, To: 10}, {From: 6, To: 7}}, []offsetfile.Range{{From: 6, To: 7}, {From: 9, To: 10}}}, // unsorted
		{[]offsetfile.Range{{From: 1, To: 3001}, {From: 1, To: 3001}}, []offsetfile.Range{{From: 6, To: 3001}}},            // listed twice
		{[]offsetfile.Range{{From: 7, To: 7}}, nil},                                                                        // empty
	} {
		p.set(5, tc.bad...)
		m.Changed()
		flush(t, s)
		if rec, _ := s.Durable(k); rec.Watermark != 5 || !slices.Equal(rec.Completed, tc.want) {
			t.Fatalf("ranges %v: recorded %+v, want watermark 5 with %v", tc.bad, rec, tc.want)
		}
	}
	if n := logs.FilterMessageSnippet("invalid completed ranges").Len(); n != 1 {
		t.Errorf("%d log entries about invalid ranges, want 1", n)
	}
	p.set(6, []offsetfile.Range{}...)
	m.Changed()
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 6 || rec.Completed != nil {
		t.Fatalf("empty ranges: recorded %+v, want nil Completed", rec)
	}

	const bound = 1 << 21
	many := make([]offsetfile.Range, bound+10)
	for i := range many {
		many[i] = offsetfile.Range{From: int64(2*i + 8), To: int64(2*i + 9)}
	}
	p.set(6, many...)
	m.Changed()
	flush(t, s)
	rec, _ := s.Durable(k)
	if len(rec.Completed) != bound || rec.Completed[bound-1] != many[bound-1] {
		t.Fatalf("%d ranges: recorded %d, want the lowest %d", len(many), len(rec.Completed), bound)
	}
	m.Close()
}

// Changed from many goroutines while the writer folds: race-free (-race),
// and the last change is durable after the last Flush.
func TestProgressMarkerConcurrentChanged(t *testing.T) {
	s := mustOpenStore(t, nil)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}
	p := &progress{}
	m, err := s.NewProgressMarker(k, 1, "m", p.read)
	must(t, err)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				wm := int64(i*8 + g)
				p.set(wm, offsetfile.Range{From: wm + 2, To: wm + 4})
				m.Changed()
				if i%500 == 0 {
					if rec, _ := s.Get(k); rec.Watermark < 0 {
						t.Error("Get saw no watermark after Changed")
					}
				}
			}
		}()
	}
	for range 20 {
		flush(t, s)
	}
	wg.Wait()
	p.set(1<<20, offsetfile.Range{From: 1<<20 + 1, To: 1<<20 + 2})
	m.Changed()
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 1<<20 || !slices.Equal(rec.Completed, []offsetfile.Range{{From: 1<<20 + 1, To: 1<<20 + 2}}) {
		t.Fatalf("durable after the last Changed: %+v", rec)
	}
	m.Close()
}
