package framework

import (
	"sync"
	"sync/atomic"
)

// partitionState is what Stats reports about a partition. It outlives
// generations: a partition keeps its counters when it is revoked and
// assigned again.
type partitionState struct {
	topic     string
	partition int

	processed atomic.Int64
	hwm       atomic.Int64
	committed atomic.Int64
	handled   atomic.Uint64

	mu       sync.Mutex
	state    PartitionState
	attempts int
	lastErr  string
	// commitErr is the last commit's error, "" once a commit succeeded.
	commitErr string
}

func newPartitionState(topic string, partition int) *partitionState {
	p := &partitionState{topic: topic, partition: partition, state: StateReconciling}
	p.processed.Store(-1)
	p.hwm.Store(-1)
	p.committed.Store(-1)
	return p
}

func (p *partitionState) setState(s PartitionState) {
	p.mu.Lock()
	p.state = s
	if s != StateRetrying {
		p.attempts = 0
	}
	p.mu.Unlock()
}

func (p *partitionState) setRetrying(attempts int, err error) {
	p.mu.Lock()
	p.state = StateRetrying
	p.attempts = attempts
	p.lastErr = err.Error()
	p.mu.Unlock()
}

func (p *partitionState) setError(err error) {
	p.mu.Lock()
	p.lastErr = err.Error()
	p.mu.Unlock()
}

// snapshot reads the offsets in the order they advance (Kafka's committed
// offset, then the durable watermark from the durable func, then the
// processed one), so that a snapshot taken while they move still shows
// committed <= durable <= processed.
func (p *partitionState) setCommitError(err error) {
	p.mu.Lock()
	if err == nil {
		p.commitErr = ""
	} else {
		p.commitErr = err.Error()
	}
	p.mu.Unlock()
}

func (p *partitionState) snapshot(durable func() int64) PartitionStats {
	s := PartitionStats{Topic: p.topic, Partition: p.partition}
	s.Committed = p.committed.Load()
	s.Durable = durable()
	s.Processed = p.processed.Load()
	s.HighWatermark = p.hwm.Load()
	s.Handled = p.handled.Load()
	if s.HighWatermark >= 0 && s.Processed >= 0 {
		s.Lag = max(s.HighWatermark-s.Processed, 0)
	}
	p.mu.Lock()
	s.State, s.Attempts, s.LastError, s.CommitError = p.state, p.attempts, p.lastErr, p.commitErr
	p.mu.Unlock()
	return s
}
