package framework

import (
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"
)

// The dispatcher eases off (stops decoding) while more than easeJobs jobs
// wait for a worker, and is told as soon as the workers took all but
// easeJobs of them.
func TestRunqEase(t *testing.T) {
	q := &runq{wake: make(chan struct{}, 8), caughtUp: make(chan struct{}, 1)}
	for i := range easeJobs + 2 {
		q.push(&job{msgs: make([]kafka.Message, 1), whole: i%2 == 0})
	}
	if !q.behind() {
		t.Fatalf("%d jobs queued: not behind", easeJobs+2)
	}
	q.pop()
	select {
	case <-q.caughtUp:
		t.Fatalf("caught up with %d jobs queued", easeJobs+1)
	default:
	}
	q.pop()
	select {
	case <-q.caughtUp:
	default:
		t.Fatalf("no token with %d jobs queued", easeJobs)
	}
	if q.behind() {
		t.Fatalf("behind with %d jobs queued", easeJobs)
	}
	// Workers parked in pop take what is pushed; close ends them.
	var wg sync.WaitGroup
	got := make(chan *job, easeJobs)
	for range 2 {
		wg.Go(func() {
			for j := q.pop(); j != nil; j = q.pop() {
				got <- j
			}
		})
	}
	for range easeJobs {
		<-got
	}
	q.close()
	wg.Wait()
}
