package framework

import (
	"context"
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
	buffered  atomic.Int64 // fetched, not yet handled: kept by the fetcher

	deadLettered atomic.Uint64
	skipped      atomic.Uint64
	unclean      atomic.Int32 // unclean restarts in a row with the current message in flight
	careful      atomic.Bool

	mu       sync.Mutex
	state    PartitionState
	attempts int
	lastErr  string
	// commitErr is the last commit's error, "" once a commit succeeded.
	commitErr string
	// lastCommit is the outcome of the last commit attempt.
	lastCommit string
	// paused is set by Consumer.Pause; stopped by the Stop failure policy.
	// Both are cleared by Consumer.Resume, which closes wake.
	paused, stopped bool
	wake            chan struct{}
	// held mirrors paused || stopped for the per-message fast path.
	held atomic.Bool
}

func newPartitionState(topic string, partition int) *partitionState {
	p := &partitionState{topic: topic, partition: partition, state: StateReconciling, wake: make(chan struct{})}
	p.processed.Store(-1)
	p.hwm.Store(-1)
	p.committed.Store(-1)
	return p
}

func (p *partitionState) setState(s PartitionState) {
	p.mu.Lock()
	if s == StateRunning && p.paused {
		s = StatePaused
	}
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

// setStopped marks the partition stopped by the failure policy.
func (p *partitionState) setStopped(err error) {
	p.mu.Lock()
	p.stopped = true
	p.held.Store(true)
	p.state = StateStopped
	p.lastErr = err.Error()
	p.mu.Unlock()
}

func (p *partitionState) setDeadLettering(err error) {
	p.mu.Lock()
	p.state = StateDeadLettering
	p.lastErr = err.Error()
	p.mu.Unlock()
}

// setPaused pauses or resumes the partition; resuming also clears a Stop.
func (p *partitionState) setPaused(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = paused
	if !paused {
		p.stopped = false
	}
	p.held.Store(p.paused || p.stopped)
	if !paused && p.state == StatePaused {
		p.state = StateRunning
	}
	close(p.wake)
	p.wake = make(chan struct{})
}

// waitRunnable waits while the partition is paused or stopped, showing it
// in Stats. It reports false if ctx ended first.
func (p *partitionState) waitRunnable(ctx context.Context) bool {
	if !p.held.Load() {
		return ctx.Err() == nil
	}
	for {
		p.mu.Lock()
		if !p.paused && !p.stopped {
			if p.state == StatePaused {
				p.state = StateRunning
			}
			p.mu.Unlock()
			return ctx.Err() == nil
		}
		if !p.stopped {
			p.state = StatePaused
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return false
		case <-wake:
		}
	}
}

func (p *partitionState) setError(err error) {
	p.mu.Lock()
	p.lastErr = err.Error()
	p.mu.Unlock()
}

func (p *partitionState) setCommitError(err error) {
	p.mu.Lock()
	if err == nil {
		p.commitErr = ""
	} else {
		p.commitErr = err.Error()
	}
	p.mu.Unlock()
}

func (p *partitionState) setLastCommit(outcome string) {
	p.mu.Lock()
	p.lastCommit = outcome
	p.mu.Unlock()
}

// snapshot reads the offsets in the order they advance (Kafka's committed
// offset, then the durable watermark from the durable func, then the
// processed one), so that a snapshot taken while they move still shows
// committed <= durable <= processed.
func (p *partitionState) snapshot(durable func() int64) PartitionStats {
	s := PartitionStats{Topic: p.topic, Partition: p.partition}
	s.Committed = p.committed.Load()
	s.Durable = durable()
	s.Processed = p.processed.Load()
	s.HighWatermark = p.hwm.Load()
	s.Handled = p.handled.Load()
	s.BufferedBytes = p.buffered.Load()
	if s.HighWatermark >= 0 && s.Processed >= 0 {
		s.Lag = max(s.HighWatermark-s.Processed, 0)
	}
	s.DeadLettered, s.Skipped = p.deadLettered.Load(), p.skipped.Load()
	s.UncleanRestarts, s.Careful = p.unclean.Load(), p.careful.Load()
	p.mu.Lock()
	s.State, s.Attempts, s.LastError, s.CommitError = p.state, p.attempts, p.lastErr, p.commitErr
	s.Paused, s.LastCommit = p.paused, p.lastCommit
	p.mu.Unlock()
	return s
}
