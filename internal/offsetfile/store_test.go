package offsetfile_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

var k0 = offsetfile.Key{Group: "g", Topic: "t", Partition: 0}

func TestRoundTripAcrossReopen(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	keys := []offsetfile.Key{
		{Group: "meta", Topic: "orders", Partition: 3}, // a group may be called "meta"
		{Group: "g", Topic: "t", Partition: 0},
		{Group: "g", Topic: "t", Partition: 1 << 30},
		{Group: "g", Topic: "u", Partition: 2},
		{Group: "ünïcode / group", Topic: "t.x-y_z", Partition: 1},
	}
	must(t, s.SetWatermark(keys[0], 42, 7, "member-1"))
	must(t, s.SetCommitted(keys[0], 40))
	must(t, s.SetWatermark(keys[1], 1, 1, "m"))
	must(t, s.RecordReset(keys[2], offsetfile.Reset{At: at, From: 10, To: 500, Reason: "retention"}))
	must(t, s.Put(keys[3], offsetfile.Record{
		Watermark: 9, RecordedAt: at, Generation: -3, Member: "",
		Committed: -1, LastReset: &offsetfile.Reset{From: -1, To: 0},
	}))
	must(t, s.Put(keys[4], offsetfile.Record{Watermark: -1, Committed: 1 << 62, CommittedAt: at}))
	// Completed ranges are Put with the watermark; Put keeps a copy.
	ranges := []offsetfile.Range{{From: 3, To: 5}, {From: 8, To: 1 << 50}}
	must(t, s.Put(keys[1], offsetfile.Record{Watermark: 1, RecordedAt: at, Generation: 1, Member: "m", Committed: -1, Completed: ranges}))
	ranges[0].From = 2
	flush(t, s)
	before := s.Records()
	if len(before) != len(keys) {
		t.Fatalf("Records() has %d entries, want %d", len(before), len(keys))
	}
	must(t, s.Close())
	checkFile(t, path)

	s = mustOpen(t, path, nil)
	after := s.Records()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("records changed across reopen:\nbefore %+v\nafter  %+v", before, after)
	}
	want := []offsetfile.Key{keys[1], keys[2], keys[3], keys[0], keys[4]}
	for i, e := range after {
		if e.Key != want[i] {
			t.Errorf("Records()[%d].Key = %+v, want %+v (sorted by group, topic, partition)", i, e.Key, want[i])
		}
	}
	r, ok := s.Get(keys[0])
	if !ok || r.Watermark != 42 || r.Generation != 7 || r.Member != "member-1" || r.Committed != 40 ||
		r.RecordedAt.IsZero() || r.CommittedAt.IsZero() || r.LastReset != nil {
		t.Errorf("Get(%v) = %+v, %v", keys[0], r, ok)
	}
	r, _ = s.Durable(keys[1])
	if want := []offsetfile.Range{{From: 3, To: 5}, {From: 8, To: 1 << 50}}; r.Watermark != 1 || !reflect.DeepEqual(r.Completed, want) {
		t.Errorf("Durable(%v) = %+v, want watermark 1 and completed %v", keys[1], r, want)
	}
	r, _ = s.Durable(keys[2])
	if r.Watermark != 500 || r.LastReset == nil || !r.LastReset.At.Equal(at) || r.LastReset.From != 10 || r.LastReset.Reason != "retention" || r.Committed != -1 {
		t.Errorf("reset record = %+v (reset %+v)", r, r.LastReset)
	}
}

func TestGetMissing(t *testing.T) {
	s := mustOpenStore(t, nil)
	for _, get := range []func(offsetfile.Key) (offsetfile.Record, bool){s.Get, s.Durable} {
		r, ok := get(k0)
		if ok || !reflect.DeepEqual(r, offsetfile.Record{Watermark: -1, Committed: -1}) {
			t.Errorf("missing key: got %+v, %v", r, ok)
		}
	}
	if n := len(s.Records()); n != 0 {
		t.Errorf("Records() of a new store has %d entries", n)
	}
}

func TestGetVersusDurable(t *testing.T) {
	path := tempPath(t)
	// The first flush runs at once, the next one an hour later: updates made
	// after the first Flush stay queued until Close.
	s, err := offsetfile.Open(path, &offsetfile.Options{FlushInterval: time.Hour})
	must(t, err)
	must(t, s.SetWatermark(k0, 10, 1, "a"))
	flush(t, s)
	must(t, s.SetWatermark(k0, 20, 2, "b"))
	must(t, s.SetCommitted(k0, 10))

	if r, ok := s.Get(k0); !ok || r.Watermark != 20 || r.Generation != 2 || r.Member != "b" || r.Committed != 10 {
		t.Errorf("Get = %+v, %v; want the queued watermark 20 and committed 10", r, ok)
	}
	if r, ok := s.Durable(k0); !ok || r.Watermark != 10 || r.Generation != 1 || r.Member != "a" || r.Committed != -1 {
		t.Errorf("Durable = %+v, %v; want the flushed watermark 10", r, ok)
	}
	if e := s.Records(); len(e) != 1 || e[0].Watermark != 10 {
		t.Errorf("Records = %+v; want the durable record only", e)
	}
	must(t, s.Close()) // flushes the queue
	if r, _ := s.Durable(k0); r.Watermark != 20 || r.Committed != 10 {
		t.Errorf("Durable after Close = %+v", r)
	}
	checkFile(t, path)

	s = mustOpen(t, path, nil)
	if r, _ := s.Durable(k0); r.Watermark != 20 || r.Committed != 10 || r.Member != "b" {
		t.Errorf("after reopen Durable = %+v", r)
	}
}

func TestUpdatesMergeFieldWise(t *testing.T) {
	s := mustOpenStore(t, &offsetfile.Options{FlushInterval: time.Hour})
	must(t, s.SetCommitted(k0, 5))
	must(t, s.SetWatermark(k0, 8, 3, "m1"))
	must(t, s.SetWatermark(k0, 9, 4, "m2")) // latest wins
	r, _ := s.Get(k0)
	if r.Watermark != 9 || r.Generation != 4 || r.Member != "m2" || r.Committed != 5 {
		t.Fatalf("Get = %+v", r)
	}
	must(t, s.RecordReset(k0, offsetfile.Reset{From: 9, To: 100, Reason: "topic recreated"}))
	r, _ = s.Get(k0)
	if r.Watermark != 100 || r.Generation != 4 || r.Member != "m2" || r.Committed != 5 ||
		r.LastReset == nil || r.LastReset.At.IsZero() || r.LastReset.From != 9 {
		t.Fatalf("after RecordReset Get = %+v (reset %+v)", r, r.LastReset)
	}
	must(t, s.Put(k0, offsetfile.Record{Watermark: 3, Committed: -1}))
	r, _ = s.Get(k0)
	if !reflect.DeepEqual(r, offsetfile.Record{Watermark: 3, Committed: -1}) {
		t.Fatalf("Put replaces the whole record: Get = %+v", r)
	}
	// Returned records are copies.
	must(t, s.RecordReset(k0, offsetfile.Reset{From: 1, To: 2}))
	r, _ = s.Get(k0)
	r.LastReset.To = 999
	if r2, _ := s.Get(k0); r2.LastReset.To != 2 {
		t.Error("changing a returned LastReset changed the store")
	}
}

func TestInvalidUpdates(t *testing.T) {
	s := mustOpenStore(t, nil)
	long := strings.Repeat("x", 70_000)
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"empty group", func() error { return s.SetWatermark(offsetfile.Key{Topic: "t"}, 1, 0, "") }, "empty group"},
		{"empty topic", func() error { return s.SetCommitted(offsetfile.Key{Group: "g"}, 1) }, "empty topic"},
		{"negative partition", func() error { return s.SetWatermark(offsetfile.Key{Group: "g", Topic: "t", Partition: -1}, 1, 0, "") }, "negative partition"},
		{"long group", func() error { return s.SetWatermark(offsetfile.Key{Group: long, Topic: "t"}, 1, 0, "") }, "group name is 70000 bytes"},
		{"negative watermark", func() error { return s.SetWatermark(k0, -1, 0, "") }, "negative watermark"},
		{"long member", func() error { return s.SetWatermark(k0, 1, 0, long) }, "member id is 70000 bytes"},
		{"negative committed", func() error { return s.SetCommitted(k0, -1) }, "negative committed"},
		{"reset to -1", func() error { return s.RecordReset(k0, offsetfile.Reset{To: -1}) }, "reset to offset -1"},
		{"put watermark -2", func() error { return s.Put(k0, offsetfile.Record{Watermark: -2, Committed: -1}) }, "watermark -2"},
		{"put ranges without watermark", func() error {
			return s.Put(k0, offsetfile.Record{Watermark: -1, Committed: -1, Completed: []offsetfile.Range{{From: 1, To: 2}}})
		}, "completed ranges without a watermark"},
		{"put range at the watermark", func() error {
			return s.Put(k0, offsetfile.Record{Watermark: 4, Committed: -1, Completed: []offsetfile.Range{{From: 4, To: 6}}})
		}, "completed range 0 [4, 6): starts at or below the watermark 4"},
		{"put touching ranges", func() error {
			return s.Put(k0, offsetfile.Record{Watermark: 4, Committed: -1, Completed: []offsetfile.Range{{From: 5, To: 6}, {From: 6, To: 7}}})
		}, "touching ranges must be merged"},
		{"put time out of range", func() error {
			return s.Put(k0, offsetfile.Record{Watermark: 1, Committed: -1, RecordedAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)})
		}, "outside the storable range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), s.Path()) {
				t.Errorf("got %v, want an error naming the file and containing %q", err, tt.want)
			}
		})
	}
	if n := len(s.Records()); n != 0 {
		t.Errorf("invalid updates were stored: %d records", n)
	}
}

func TestConcurrentSetWatermark(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	const goroutines, perGoroutine = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			k := offsetfile.Key{Group: "g", Topic: "t", Partition: int32(g)}
			for off := int64(1); off <= perGoroutine; off++ {
				if err := s.SetWatermark(k, off, int32(g), fmt.Sprint("member-", g)); err != nil {
					t.Error(err)
					return
				}
				if off%500 == 0 {
					if err := s.Flush(context.Background()); err != nil {
						t.Error(err)
						return
					}
					if r, _ := s.Durable(k); r.Watermark < off {
						t.Errorf("after Flush, Durable(%v).Watermark = %d, want >= %d", k, r.Watermark, off)
					}
				}
			}
		})
	}
	// Readers run alongside (for the race detector).
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s.Get(k0)
			s.Durable(k0)
			s.Records()
			_ = s.Err()
		}
	})
	wg.Wait()
	close(stop)
	rwg.Wait()
	flush(t, s)
	must(t, s.Close())
	checkFile(t, path)

	s = mustOpen(t, path, nil)
	recs := s.Records()
	if len(recs) != goroutines {
		t.Fatalf("%d records, want %d", len(recs), goroutines)
	}
	for g, e := range recs {
		if e.Partition != int32(g) || e.Watermark != perGoroutine || e.Generation != int32(g) || e.Member != fmt.Sprint("member-", g) {
			t.Errorf("record %d = %+v, want watermark %d by member-%d", g, e, perGoroutine, g)
		}
	}
}

// Close while writers are busy: every update accepted before Close is on disk.
func TestCloseConcurrentWithUpdates(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	const goroutines = 8
	last := make([]int64, goroutines)
	var wg, started sync.WaitGroup
	started.Add(goroutines)
	for g := range goroutines {
		wg.Go(func() {
			k := offsetfile.Key{Group: "g", Topic: "t", Partition: int32(g)}
			for off := int64(1); ; off++ {
				err := s.SetWatermark(k, off, 1, "m")
				if errors.Is(err, offsetfile.ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				last[g] = off
				if off == 100 {
					started.Done()
				}
				if off == 1000 {
					_ = s.Flush(context.Background()) // may race with Close
				}
			}
		})
	}
	started.Wait()
	var cwg sync.WaitGroup
	for range 3 { // concurrent Close calls
		cwg.Go(func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	cwg.Wait()
	wg.Wait()
	checkFile(t, path)
	s = mustOpen(t, path, nil)
	for g := range goroutines {
		k := offsetfile.Key{Group: "g", Topic: "t", Partition: int32(g)}
		r, _ := s.Durable(k)
		if r.Watermark != last[g] {
			t.Errorf("partition %d: watermark %d on disk, last accepted update was %d", g, r.Watermark, last[g])
		}
	}
}

func TestCallsAfterClose(t *testing.T) {
	s, err := offsetfile.Open(tempPath(t), nil)
	must(t, err)
	must(t, s.SetWatermark(k0, 5, 1, "m"))
	must(t, s.Close())
	must(t, s.Close()) // idempotent
	for name, err := range map[string]error{
		"Flush":        s.Flush(context.Background()),
		"SetWatermark": s.SetWatermark(k0, 6, 1, "m"),
		"SetCommitted": s.SetCommitted(k0, 6),
		"RecordReset":  s.RecordReset(k0, offsetfile.Reset{To: 1}),
		"Put":          s.Put(k0, offsetfile.Record{Watermark: 1, Committed: -1}),
	} {
		if !errors.Is(err, offsetfile.ErrClosed) || !strings.Contains(err.Error(), s.Path()) {
			t.Errorf("%s after Close: %v, want ErrClosed naming the file", name, err)
		}
	}
	if r, ok := s.Durable(k0); !ok || r.Watermark != 5 {
		t.Errorf("Durable after Close = %+v, %v; readers keep answering from memory", r, ok)
	}
}

func TestFlushRespectsContext(t *testing.T) {
	s := mustOpenStore(t, &offsetfile.Options{FlushInterval: time.Hour})
	must(t, s.SetWatermark(k0, 1, 1, "m"))
	flush(t, s) // the first flush is immediate
	must(t, s.SetWatermark(k0, 2, 1, "m"))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Flush(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), s.Path()) {
		t.Errorf("Flush = %v, want DeadlineExceeded naming the file", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Flush took %v after its deadline", d)
	}

	cctx, ccancel := context.WithCancelCause(context.Background())
	cause := errors.New("shutting down")
	ccancel(cause)
	if err := s.Flush(cctx); !errors.Is(err, cause) {
		t.Errorf("Flush with a cancelled ctx = %v, want the cause", err)
	}
	// Nothing queued: Flush returns nil at once, whatever ctx.
	s2 := mustOpenStore(t, nil)
	if err := s2.Flush(cctx); err != nil {
		t.Errorf("Flush with nothing queued = %v", err)
	}
}

// A Flush waiting when Close is called returns once Close's flush is done.
func TestFlushDuringClose(t *testing.T) {
	s, err := offsetfile.Open(tempPath(t), &offsetfile.Options{FlushInterval: time.Hour})
	must(t, err)
	must(t, s.SetWatermark(k0, 1, 1, "m"))
	flush(t, s)
	must(t, s.SetWatermark(k0, 2, 1, "m"))
	errc := make(chan error, 1)
	go func() { errc <- s.Flush(context.Background()) }()
	time.Sleep(10 * time.Millisecond)
	must(t, s.Close())
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, offsetfile.ErrClosed) {
			t.Errorf("Flush = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Flush still waiting after Close")
	}
	checkFile(t, s.Path())
}

func TestFlushInterval(t *testing.T) {
	const interval = 100 * time.Millisecond
	s := mustOpenStore(t, &offsetfile.Options{FlushInterval: interval})
	start := time.Now()
	for i := range 3 {
		must(t, s.SetWatermark(k0, int64(i), 1, "m"))
		flush(t, s)
	}
	// Three flushes: the first at once, then two spaced by the interval.
	if d := time.Since(start); d < 2*interval {
		t.Errorf("3 flushes took %v, want >= %v", d, 2*interval)
	}
}

func TestReadOnly(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	must(t, s.SetWatermark(k0, 7, 1, "m"))
	must(t, s.Close())
	before := hashFile(t, path)

	ro := mustOpen(t, path, &offsetfile.Options{ReadOnly: true})
	ro2 := mustOpen(t, path, &offsetfile.Options{ReadOnly: true, Timeout: 100 * time.Millisecond}) // shared lock
	for name, err := range map[string]error{
		"SetWatermark": ro.SetWatermark(k0, 8, 1, "m"),
		"SetCommitted": ro.SetCommitted(k0, 8),
		"RecordReset":  ro.RecordReset(k0, offsetfile.Reset{To: 1}),
		"Put":          ro.Put(k0, offsetfile.Record{Watermark: 1, Committed: -1}),
	} {
		if !errors.Is(err, offsetfile.ErrReadOnly) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s on a read-only store: %v, want ErrReadOnly naming the file", name, err)
		}
	}
	if err := ro.Flush(context.Background()); err != nil {
		t.Errorf("Flush on a read-only store = %v", err)
	}
	for _, st := range []*offsetfile.Store{ro, ro2} {
		if r, ok := st.Get(k0); !ok || r.Watermark != 7 {
			t.Errorf("read-only Get = %+v, %v", r, ok)
		}
	}
	// A read-write Open must wait for the readers.
	err = wantOpenError(t, path, &offsetfile.Options{Timeout: 50 * time.Millisecond}, "in use")
	if !errors.Is(err, offsetfile.ErrInUse) {
		t.Errorf("read-write Open while read-only opens exist = %v, want ErrInUse", err)
	}
	must(t, ro.Close())
	must(t, ro2.Close())
	if hashFile(t, path) != before {
		t.Error("read-only opens changed the file")
	}
}
