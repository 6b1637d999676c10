package framework

import "sync"

// The queues between the stages of the data path: the fetcher queues chunks
// on a partition's inbox for its goroutine; a partition's dispatcher pushes
// jobs on its run queue for its workers, which push their results on the
// dispatcher's inbox.

// chunk is what one fetch brought for one partition, queued for the
// partition's goroutine, which decodes it.
type chunk struct {
	// raw holds the record batches fetched at offset from (it slices into
	// the response); hwm is the partition's high watermark then.
	raw  []byte
	from int64
	hwm  int64
	// end is the offset after the last batch in raw: every offset below it
	// is in raw, was delivered earlier, or does not exist.
	end   int64
	bytes int64 // counted against the budget until handled
	// At Config.IsolationLevel kafka.ReadCommitted nothing at or above
	// lso, the fetch's last stable offset, is handed out, and the records
	// of the aborted transactions it reported are dropped (txn.go).
	lso     int64
	aborted []abortedTxn
	// reset, when set, moves the partition before anything else in the
	// chunk: its position was out of range and the policy chose another.
	reset *reset
	// stall, when set, stops the partition after raw's records: the
	// policy stalled it, or its batches cannot be read.
	stall error
}

type reset struct {
	from, to, first, last int64
	reason                string
}

// runq is the jobs ready to run: the dispatcher pushes, the workers pop.
// A worker that finds it empty parks until a push wakes it, so a worker
// busy with a stream of quick calls takes one job after another without
// parking, and a push costs a lock when no worker is parked.
type runq struct {
	mu   sync.Mutex
	jobs []*job
	head int
	idle int // workers parked in pop, each owed a token on wake
	// easing is set while the dispatcher waits for the workers to take all
	// but easeJobs jobs (dispatcher.ease); pop then sends on caughtUp.
	easing   bool
	caughtUp chan struct{}
	closed   bool
	wake     chan struct{} // capacity MaxInFlight: sends never block
}

func (q *runq) push(j *job) {
	q.mu.Lock()
	if q.head > 0 && q.head == len(q.jobs) {
		clear(q.jobs)
		q.jobs, q.head = q.jobs[:0], 0
	}
	q.jobs = append(q.jobs, j)
	wake := q.idle > 0
	if wake {
		q.idle--
	}
	q.mu.Unlock()
	if wake {
		q.wake <- struct{}{}
	}
}

// pop returns the oldest job, waiting for one; nil once closed and empty.
func (q *runq) pop() *job {
	for {
		q.mu.Lock()
		if q.head < len(q.jobs) {
			j := q.jobs[q.head]
			q.jobs[q.head] = nil
			q.head++
			if q.easing && len(q.jobs)-q.head <= easeJobs {
				q.easing = false
				select {
				case q.caughtUp <- struct{}{}:
				default:
				}
			}
			q.mu.Unlock()
			return j
		}
		if q.closed {
			q.mu.Unlock()
			return nil
		}
		q.idle++
		q.mu.Unlock()
		<-q.wake
	}
}

// behind reports whether more than easeJobs jobs wait for a worker; if
// so, the pop that leaves easeJobs sends a token on caughtUp.
func (q *runq) behind() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.easing = len(q.jobs)-q.head > easeJobs
	return q.easing
}

// close wakes every parked worker; pop returns nil once the jobs ran out.
func (q *runq) close() {
	q.mu.Lock()
	q.closed = true
	n := q.idle
	q.idle = 0
	q.mu.Unlock()
	for range n {
		q.wake <- struct{}{}
	}
}

// inbox is a queue that producers push to without ever blocking and one
// consumer takes from: a partition's chunks (from the fetcher) and its
// jobs' results.
type inbox[T any] struct {
	mu    sync.Mutex
	items []T
	ready chan struct{} // holds a token while items may be non-empty
	// parked is set while the consumer has no goroutine (takeOrPark):
	// the next push calls unpark, once, to start one.
	parked bool
	unpark func()
}

func newInbox[T any]() *inbox[T] { return &inbox[T]{ready: make(chan struct{}, 1)} }

// waitable gives q its ready channel if it has none: only a consumer that
// blocks waiting for pushes needs it, and a partition that parks instead
// (the common case) saves its 96 bytes. Called before anything is pushed.
func (q *inbox[T]) waitable() {
	if q.ready == nil {
		q.ready = make(chan struct{}, 1)
	}
}

func (q *inbox[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	parked := q.parked
	q.parked = false
	q.mu.Unlock()
	if parked {
		q.unpark()
		return
	}
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// takeOrPark is take, except that when nothing was pushed it marks the
// consumer parked and returns nil: its goroutine may then exit, and the
// next push or wake calls unpark to start another.
func (q *inbox[T]) takeOrPark(spare []T) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		q.parked = true
		return nil
	}
	items := q.items
	q.items = spare
	return items
}

// park marks the consumer parked, before it has a goroutine: the first
// push calls unpark. If something was pushed already, it reports false and
// leaves the consumer unparked: the caller starts it.
func (q *inbox[T]) park() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 {
		return false
	}
	q.parked = true
	return true
}

// unparkSelf takes back a park that no push has ended yet, and reports
// whether it did: if not, unpark was called (or is about to be). The
// caller then runs the consumer: the parked one itself, when its run
// ended as it parked, or the run's stopper (partition.stopRun).
func (q *inbox[T]) unparkSelf() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	parked := q.parked
	q.parked = false
	return parked
}

// take returns everything pushed so far, oldest first; spare (empty,
// maybe nil) becomes the buffer of the next pushes, so that two buffers
// can take turns.
func (q *inbox[T]) take(spare []T) []T {
	q.mu.Lock()
	items := q.items
	q.items = spare
	q.mu.Unlock()
	return items
}
