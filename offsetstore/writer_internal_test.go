package offsetstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
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
	s.testHook = func(*bolt.Tx) error {
		if fail.Load() {
			return errInjected
		}
		return nil
	}
	s.mu.Unlock()
	return s, fail, logs
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
				rec: Record{Watermark: int64(i)}}
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
