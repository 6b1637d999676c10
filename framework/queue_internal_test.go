package framework

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An inbox whose consumer parks (a partition in direct mode) has every push
// consumed and its run finished once, whatever the order of the pushes,
// the open (park, which may find pushes waiting: the assignment fetches
// first) and the stop (unparkSelf, which may take the park back from a
// consumer that saw the stop as it parked). The consumer here follows
// partition.consume and stopRun: it takes until the inbox is empty and
// parks; at the stop one side takes the park back and finishes the run.
func TestInboxParking(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 4))
	for round := range 500 {
		q := new(inbox[int])
		var stopped atomic.Bool
		var consumed, finished atomic.Int64
		var wg sync.WaitGroup
		drive := func() {
			for !stopped.Load() {
				items := q.takeOrPark(nil)
				consumed.Add(int64(len(items)))
				if len(items) == 0 && (!stopped.Load() || !q.unparkSelf()) {
					return // parked: the next push, or the stop, runs drive
				}
			}
			q.take(nil) // dropped, as a stopped run drops what it holds
			finished.Add(1)
		}
		q.unpark = func() {
			wg.Go(drive)
		}
		const n = 50
		openAt := rng.IntN(n + 1)
		if rng.IntN(3) == 0 {
			openAt = n // after every push: only the open can start the consumer
		}
		for i := range n {
			if i == openAt && !q.park() {
				q.unpark()
			}
			q.push(i)
			if rng.IntN(4) == 0 {
				runtime.Gosched()
			}
		}
		if openAt == n && !q.park() {
			q.unpark()
		}
		for deadline := time.Now().Add(10 * time.Second); consumed.Load() < n && time.Now().Before(deadline); {
			time.Sleep(50 * time.Microsecond)
		}
		if c := consumed.Load(); c != n {
			t.Fatalf("round %d (opened after %d pushes): %d of %d pushes consumed", round, openAt, c, n)
		}
		for range rng.IntN(20) {
			runtime.Gosched()
		}
		stopped.Store(true)
		if q.unparkSelf() {
			drive()
		}
		wg.Wait()
		if f := finished.Load(); f != 1 {
			t.Fatalf("round %d (opened after %d pushes): the run finished %d times, want once", round, openAt, f)
		}
	}
}
