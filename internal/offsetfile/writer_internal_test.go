package offsetfile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

var errInjected = errors.New("injected write failure")

// openFailing opens a store whose flush transactions fail while *fail is
// true, logging to the returned observer.
func openFailing(t *testing.T) (*Store, *atomic.Bool, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	s, err := Open(filepath.Join(t.TempDir(), "offsets.db"), &Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	fail := new(atomic.Bool)
	s.mu.Lock()
	s.testHook = failWhile(fail, 0)
	s.mu.Unlock()
	return s, fail, logs
}

// failWhile is a flush hook that fails each transaction, after slow, while
// *fail is true.
func failWhile(fail *atomic.Bool, slow time.Duration) func(*bolt.Tx) error {
	return func(*bolt.Tx) error {
		if fail.Load() {
			time.Sleep(slow)
			return errInjected
		}
		return nil
	}
}

// flushUntilOK calls Flush until it succeeds: a retry that started before the
// failure was switched off may still report it.
func flushUntilOK(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.Flush(ctx)
		cancel()
		if err == nil {
			return
		}
		if !errors.Is(err, errInjected) || time.Now().After(deadline) {
			t.Fatalf("Flush: %v", err)
		}
	}
}

func TestFlushFailureKeepsUpdatesAndRetries(t *testing.T) {
	s, fail, logs := openFailing(t)
	defer s.Close()
	k := Key{Group: "g", Topic: "t", Partition: 1}

	fail.Store(true)
	if err := s.SetWatermark(k, 5, 1, "m"); err != nil {
		t.Fatal(err)
	}
	err := s.Flush(context.Background())
	var fe *FileError
	if !errors.Is(err, errInjected) || !errors.As(err, &fe) || fe.Path != s.Path() || fe.Op != "flush" {
		t.Fatalf("Flush = %v, want the injected error in a *FileError naming the file", err)
	}
	if !errors.Is(s.Err(), errInjected) {
		t.Errorf("Err() = %v", s.Err())
	}
	if _, ok := s.Durable(k); ok {
		t.Error("a failed flush made the record durable")
	}

	// Updates queued while the writer fails and retries: the newer watermark
	// wins, and the other fields merge in.
	if err := s.SetWatermark(k, 7, 2, "m2"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommitted(k, 3); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * minBackoff) // let a retry or two fail with them
	if r, _ := s.Get(k); r.Watermark != 7 || r.Generation != 2 || r.Committed != 3 {
		t.Errorf("Get during failures = %+v", r)
	}

	fail.Store(false)
	flushUntilOK(t, s)
	r, ok := s.Durable(k)
	if !ok || r.Watermark != 7 || r.Generation != 2 || r.Member != "m2" || r.Committed != 3 {
		t.Errorf("Durable after recovery = %+v, %v", r, ok)
	}
	if err := s.Err(); err != nil {
		t.Errorf("Err() after a successful flush = %v", err)
	}

	errLogs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errLogs) != 1 {
		t.Fatalf("%d error-level logs, want 1 (retries log at debug level): %v", len(errLogs), errLogs)
	}
	fields := errLogs[0].ContextMap()
	if fields["path"] != s.Path() || fields["error"] != errInjected.Error() {
		t.Errorf("error log fields = %v, want path and error", fields)
	}
	if n := logs.FilterMessageSnippet("succeeded after earlier failures").Len(); n != 1 {
		t.Errorf("%d recovery logs, want 1", n)
	}
}

// The writer retries by itself: no new update or Flush is needed.
func TestFlushRetriesWithoutNewUpdates(t *testing.T) {
	s, fail, _ := openFailing(t)
	defer s.Close()
	k := Key{Group: "g", Topic: "t", Partition: 1}
	fail.Store(true)
	if err := s.SetWatermark(k, 5, 1, "m"); err != nil {
		t.Fatal(err)
	}
	for s.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	fail.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r, ok := s.Durable(k); ok && r.Watermark == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer did not retry")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCloseReportsFinalFlushFailure(t *testing.T) {
	s, fail, _ := openFailing(t)
	fail.Store(true)
	if err := s.SetWatermark(Key{Group: "g", Topic: "t"}, 5, 1, "m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, errInjected) {
		t.Errorf("Close = %v, want the flush error", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// One transaction per flush: updates queued while a transaction runs go into
// the next one together.
func TestGroupCommit(t *testing.T) {
	s, _, _ := openFailing(t)
	defer s.Close()
	var txs atomic.Int32
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	s.mu.Lock()
	s.testHook = func(*bolt.Tx) error {
		txs.Add(1)
		entered <- struct{}{}
		<-release
		return nil
	}
	s.mu.Unlock()

	if err := s.SetWatermark(Key{Group: "g", Topic: "t", Partition: 0}, 1, 1, "m"); err != nil {
		t.Fatal(err)
	}
	<-entered // the first transaction is running
	// While it runs, Get sees its records and Durable does not yet.
	k0 := Key{Group: "g", Topic: "t", Partition: 0}
	if r, ok := s.Get(k0); !ok || r.Watermark != 1 {
		t.Errorf("Get during the flush = %+v, %v; want watermark 1", r, ok)
	}
	if _, ok := s.Durable(k0); ok {
		t.Error("Durable during the flush found the record")
	}
	for p := range int32(100) {
		if err := s.SetWatermark(Key{Group: "g", Topic: "t", Partition: p}, 2, 1, "m"); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := txs.Load(); n != 2 {
		t.Errorf("%d transactions for 101 updates queued in two waves, want 2", n)
	}
	if n := len(s.Records()); n != 100 {
		t.Errorf("%d records, want 100", n)
	}
}

// A Marker's durable watermark follows successful flushes only: WaitDurable
// waits through failing ones and returns once a retry succeeds.
func TestWaitDurableThroughFailures(t *testing.T) {
	s, fail, _ := openFailing(t)
	defer s.Close()
	k := Key{Group: "g", Topic: "t", Partition: 0}
	m, err := s.NewMarker(k, 1, "m")
	if err != nil {
		t.Fatal(err)
	}
	if m.Durable() != -1 {
		t.Fatalf("Durable of a new key = %d", m.Durable())
	}
	m.Set(10)
	if err := m.WaitDurable(context.Background(), 10); err != nil || m.Durable() != 10 {
		t.Fatalf("WaitDurable(10) = %v, Durable %d", err, m.Durable())
	}
	fail.Store(true)
	m.Set(20)
	done := make(chan error, 1)
	go func() { done <- m.WaitDurable(context.Background(), 20) }()
	select {
	case err := <-done:
		t.Fatalf("WaitDurable returned %v while flushes fail (durable %d)", err, m.Durable())
	case <-time.After(300 * time.Millisecond):
	}
	if !errors.Is(s.Err(), errInjected) || m.Durable() != 10 {
		t.Fatalf("while failing: Err %v, Durable %d", s.Err(), m.Durable())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := m.WaitDurable(ctx, 20); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDurable with an expiring ctx = %v", err)
	}
	cancel()
	fail.Store(false)
	select {
	case err := <-done:
		if err != nil || m.Durable() != 20 {
			t.Fatalf("after the failures: WaitDurable = %v, Durable %d", err, m.Durable())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitDurable still waiting after writes succeed again")
	}
	m.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitDurable(context.Background(), 30); !errors.Is(err, ErrClosed) {
		t.Fatalf("WaitDurable after Close = %v, want ErrClosed", err)
	}
}

// sortWrites moves each write to its place by key, whatever the
// permutation, and keeps every write's fields with its key.
func TestSortWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var order []int32
	for n := range 200 {
		writes := make([]pendingWrite, n)
		for i := range writes {
			p := int32(rng.IntN(50))
			writes[i] = pendingWrite{key: Key{Group: "g", Topic: fmt.Sprint("t", rng.IntN(3)), Partition: p},
				rec: &Record{Watermark: int64(i)}}
		}
		want := slices.Clone(writes)
		slices.SortStableFunc(want, func(a, b pendingWrite) int { return compareKeys(a.key, b.key) })
		order = sortWrites(writes, order)
		for i := range writes {
			if compareKeys(writes[i].key, want[i].key) != 0 {
				t.Fatalf("n=%d: write %d has key %v, want %v", n, i, writes[i].key, want[i].key)
			}
		}
		// Every write is still there once, with its own record.
		seen := map[int64]bool{}
		for _, w := range writes {
			if seen[w.rec.Watermark] {
				t.Fatalf("n=%d: write %d twice", n, w.rec.Watermark)
			}
			seen[w.rec.Watermark] = true
		}
		if len(seen) != n {
			t.Fatalf("n=%d: %d writes left", n, len(seen))
		}
	}
}

// TestStateModel draws random histories of runs on three partitions'
// states (puts, deletes, reads, walks; each run committed or discarded),
// with checkpoints that fail for a while and reopenings of the file, and
// holds the store to a map per partition: a run reads the model with its
// own changes over it (committed runs queued or in the file), a synced
// run is in the file whole, with its watermark, and a discarded or
// failed-then-retried one neither lost nor applied twice. TIDEMARK_STATE_MODEL_SEED replays one history.
func TestStateModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TIDEMARK_STATE_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (TIDEMARK_STATE_MODEL_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	path := filepath.Join(t.TempDir(), "offsets.db")
	open := func() (*Store, *atomic.Bool) {
		s, err := Open(path, &Options{SyncInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		fail := new(atomic.Bool)
		s.mu.Lock()
		s.testHook = failWhile(fail, 3*time.Millisecond) // slow: runs commit while it is in flight
		s.mu.Unlock()
		return s, fail
	}
	s, fail := open()
	defer func() { _ = s.Close() }()
	keys := []Key{{"g", "t", 0}, {"g", "t", 1}, {"g", "u", 0}}
	model := make([]map[string]string, len(keys))
	marks := make([]int64, len(keys))
	for i := range model {
		model[i] = map[string]string{}
	}
	ctx := context.Background()
	for step := range 300 {
		i := rng.IntN(len(keys))
		k := keys[i]
		// Few keys, each changed again and again, or many, most changed
		// once: the queued runs' index then holds mostly stale entries,
		// and is built anew.
		space := []int{20, 20, 2000}[rng.IntN(3)]
		keyN := func() string { return fmt.Sprint("k", rng.IntN(space)) }
		st, err := s.BeginState(k)
		if err != nil {
			t.Fatal(err)
		}
		// A failure below must not leave the run's read transaction open:
		// Close would wait for it.
		defer st.Discard()
		view := maps.Clone(model[i])
		for range rng.IntN(12) {
			key := keyN()
			switch rng.IntN(4) {
			case 0, 1:
				v := fmt.Sprint(step, "-", rng.IntN(1000))
				if rng.IntN(10) == 0 {
					v = ""
				}
				mustOK(t, st.Put([]byte(key), []byte(v)))
				view[key] = v
			case 2:
				mustOK(t, st.Delete([]byte(key)))
				delete(view, key)
			default:
				got, err := st.Get([]byte(key))
				mustOK(t, err)
				want, ok := view[key]
				if (got != nil) != ok || string(got) != want {
					t.Fatalf("step %d: Get(%s) = %q, want %q (present %v)", step, key, got, want, ok)
				}
			}
		}
		walked := map[string]string{}
		mustOK(t, st.ForEach(func(key, value []byte) error {
			walked[string(key)] = string(value)
			return nil
		}))
		if !maps.Equal(walked, view) {
			t.Fatalf("step %d: the run walks %v, want %v", step, walked, view)
		}
		if rng.IntN(8) == 0 {
			// A run begun while this one holds the index asks the queued
			// runs one by one: it reads what was committed.
			checkRun(t, s, step, k, model[i])
		}
		switch r := rng.IntN(12); {
		case r < 2:
			st.Discard()
		case r < 3:
			// The partition started again: the open run may not commit,
			// and the next runs read what was committed before.
			s.FenceState(k)
			if err := st.Commit(ctx, marks[i]+1, 1, "m"); !errors.Is(err, ErrStateRunEnded) {
				t.Fatalf("step %d: a fenced run's Commit returned %v, want ErrStateRunEnded", step, err)
			}
			checkRun(t, s, step, k, model[i])
		case r < 4:
			// The checkpoints fail a while: the run is queued, the next
			// runs read it, the file does not have it, and once the
			// writes succeed it lands whole, once.
			fail.Store(true)
			mustOK(t, st.Commit(ctx, marks[i]+1, 1, "m"))
			model[i], marks[i] = view, marks[i]+1
			checkRun(t, s, step, k, model[i])
			// More runs of k while the writes fail: they queue after it,
			// over the same keys.
			for range rng.IntN(4) {
				time.Sleep(time.Duration(rng.IntN(6)) * time.Millisecond)
				more, err := s.BeginState(k)
				mustOK(t, err)
				view = maps.Clone(model[i])
				for range 1 + rng.IntN(4) {
					key := keyN()
					if rng.IntN(3) == 0 {
						mustOK(t, more.Delete([]byte(key)))
						delete(view, key)
						continue
					}
					v := fmt.Sprint(step, "+", rng.IntN(1000))
					mustOK(t, more.Put([]byte(key), []byte(v)))
					view[key] = v
				}
				mustOK(t, more.Commit(ctx, marks[i]+1, 1, "m"))
				model[i], marks[i] = view, marks[i]+1
				checkRun(t, s, step, k, model[i])
			}
			fail.Store(false)
			syncUntilOK(t, s)
		default:
			mustOK(t, st.Commit(ctx, marks[i]+1, 1, "m"))
			model[i], marks[i] = view, marks[i]+1
		}
		if rng.IntN(25) == 0 {
			mustOK(t, s.Close())
			s, fail = open()
		}
		synced := rng.IntN(3) == 0
		if synced {
			syncUntilOK(t, s)
		}
		for j, k := range keys {
			checkRun(t, s, step, k, model[j])
			if !synced {
				continue
			}
			got := map[string]string{}
			mustOK(t, s.ViewState(k, func(st *StateTx) error {
				return st.ForEach(func(key, value []byte) error {
					got[string(key)] = string(value)
					return nil
				})
			}))
			if !maps.Equal(got, model[j]) {
				t.Fatalf("step %d: %v's state in the file is %v, want %v", step, k, got, model[j])
			}
			if rec, _ := s.Synced(k); max(rec.Watermark, 0) != marks[j] {
				t.Fatalf("step %d: %v's synced watermark is %d, want %d", step, k, rec.Watermark, marks[j])
			}
		}
	}
}

// checkRun checks that a new run on k sees want, then discards it.
func checkRun(t *testing.T, s *Store, step int, k Key, want map[string]string) {
	t.Helper()
	st, err := s.BeginState(k)
	mustOK(t, err)
	defer st.Discard()
	got := map[string]string{}
	mustOK(t, st.ForEach(func(key, value []byte) error {
		got[string(key)] = string(value)
		return nil
	}))
	if !maps.Equal(got, want) {
		t.Fatalf("step %d: a run on %v sees %v, want %v", step, k, got, want)
	}
	for key, v := range want {
		if g, err := st.Get([]byte(key)); err != nil || string(g) != v || g == nil {
			t.Fatalf("step %d: a run on %v gets %s = %q, %v; want %q", step, k, key, g, err, v)
		}
	}
	for i := range 2000 { // the keys the model draws that it does not hold
		key := fmt.Sprint("k", i)
		if _, ok := want[key]; ok {
			continue
		}
		if g, err := st.Get([]byte(key)); err != nil || g != nil {
			t.Fatalf("step %d: a run on %v gets %s = %q, %v; want it absent", step, k, key, g, err)
		}
	}
}

// syncUntilOK calls Sync until it succeeds: an attempt that started while
// writes failed may still report it.
func syncUntilOK(t *testing.T, s *Store) {
	t.Helper()
	for range 100 {
		if err := s.Sync(context.Background()); err == nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("Sync kept failing")
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestQueuedUpdatesModel draws random histories of updates to a few keys
// and flushes that fail or succeed: a failed flush puts its updates back
// under those queued since (Store.pending, by each slot's index), so Get
// always shows the latest of each field, and a flush that succeeds makes
// all of them durable, as a reopen confirms.
func TestQueuedUpdatesModel(t *testing.T) {
	type fields struct {
		wm, committed int64
		gen           int32
		member        string
	}
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 31))
		s, fail, _ := openFailing(t)
		var injected atomic.Int64 // flush transactions failed by the hook
		s.mu.Lock()
		s.testHook = func(*bolt.Tx) error {
			if fail.Load() {
				injected.Add(1)
				return errInjected
			}
			return nil
		}
		s.mu.Unlock()
		keys := []Key{{"g", "a", 0}, {"g", "a", 1}, {"g", "b", 0}, {"h", "a", 0}}
		model := map[Key]*fields{}
		succeeded := 0
		check := func(step int, got func(Key) (Record, bool), what string) {
			t.Helper()
			for _, k := range keys {
				m := model[k]
				r, ok := got(k)
				if m == nil {
					if ok {
						t.Fatalf("seed %d step %d: %s of %v is %+v, want none", seed, step, what, k, r)
					}
					continue
				}
				if !ok || r.Watermark != m.wm || r.Committed != m.committed || r.Generation != m.gen || r.Member != m.member {
					t.Fatalf("seed %d step %d: %s of %v is %+v (%v), want %+v", seed, step, what, k, r, ok, *m)
				}
			}
		}
		for step := range 300 {
			k := keys[rng.IntN(len(keys))]
			m := model[k]
			switch op := rng.IntN(10); {
			case op < 4:
				wm := int64(rng.IntN(1000))
				if m != nil {
					wm += m.wm
				}
				gen := int32(rng.IntN(5))
				member := "m" + strconv.Itoa(rng.IntN(3))
				if err := s.SetWatermark(k, wm, gen, member); err != nil {
					t.Fatal(err)
				}
				if m == nil {
					m = &fields{committed: -1}
					model[k] = m
				}
				m.wm, m.gen, m.member = wm, gen, member
			case op < 6 && m != nil:
				c := int64(rng.IntN(int(m.wm) + 1))
				if err := s.SetCommitted(k, c); err != nil {
					t.Fatal(err)
				}
				m.committed = c
			case op < 7:
				fail.Store(!fail.Load())
			default:
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				err := s.Flush(ctx)
				cancel()
				switch {
				case err == nil:
					succeeded++
					check(step, s.Durable, "Durable after a flush")
				case errors.Is(err, errInjected) || errors.Is(err, context.DeadlineExceeded):
				default:
					t.Fatalf("seed %d step %d: Flush: %v", seed, step, err)
				}
			}
			check(step, s.Get, "Get")
		}
		fail.Store(false)
		flushUntilOK(t, s)
		check(-1, s.Durable, "Durable at the end")
		path := s.Path()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if injected.Load() == 0 || succeeded == 0 {
			t.Fatalf("seed %d: %d flushes failed and %d succeeded: the history missed a path", seed, injected.Load(), succeeded)
		}
		r, err := Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(-1, r.Durable, "Durable after a reopen")
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A writer kept busy by a steady stream of updates is not woken by them:
// after each flush that wrote it looks again one FlushInterval later, so a
// flush costs one wakeup (its timer), not a kick and then the timer (at
// 400 msgs/s the kicks were a third of the offset file's cost). It still
// writes no more often than every FlushInterval, and goes idle, to be
// kicked again, once the updates stop.
func TestBusyWriterIsNotKicked(t *testing.T) {
	const interval = 20 * time.Millisecond
	s, err := Open(filepath.Join(t.TempDir(), "offsets.db"), &Options{FlushInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := Key{Group: "g", Topic: "t"}
	burst := func(n int) {
		start := time.Now()
		for i := range n {
			if err := s.SetWatermark(k, int64(i), 1, "m"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		if err := s.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		// A stall of the test longer than the interval lets the writer go
		// idle, and the next update kicks it: a few may, on a busy machine.
		if max := uint64(5); s.kicks > max {
			t.Errorf("%d updates over %s woke the writer %d times, want at most %d", n, time.Since(start), s.kicks, max)
		}
		if limit := uint64(time.Since(start)/interval) + 2; s.flushes > limit {
			t.Errorf("%d flushes in %s, FlushInterval %s: at most %d", s.flushes, time.Since(start), interval, limit)
		}
		s.kicks, s.flushes = 0, 0
	}
	burst(400)
	// Idle: nothing to write, and the writer asleep until an update.
	time.Sleep(3 * interval)
	s.mu.Lock()
	kicked := s.kicked
	s.mu.Unlock()
	if kicked {
		t.Fatal("the writer is still looking for updates after the last was written")
	}
	burst(50)
}
