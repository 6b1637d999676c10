package framework

import (
	"context"
	"sync"
	"sync/atomic"
)

// gate is what lets a partition's messages run: Consumer.Pause and Resume,
// and the messages the Stop failure policy holds until a Resume. It lives in
// the partition's Stats record and so outlives generations: a pause set
// before the partition is assigned, or while it is revoked, holds at its
// next assignment. Pause and Resume write it from their caller's goroutine;
// the partition's calls wait on it (invoke.go, failure.go); the fetcher reads
// paused; Stats asks it what to show (show).
type gate struct {
	// paused mirrors pause for the per-message fast path and the fetcher.
	paused atomic.Bool

	mu      sync.Mutex
	pause   bool   // set by Pause, cleared by Resume
	stopped int    // messages held by Stop, each waiting for a Resume
	resumes uint64 // Resume calls
	waiting int    // calls held by the pause in waitRunnable
	// wake is closed by Pause and Resume; made by the first waiter after
	// that (nil until then: most partitions never wait).
	wake chan struct{}
}

// waitChanLocked returns the channel the next Pause or Resume closes;
// g.mu is held.
func (g *gate) waitChanLocked() chan struct{} {
	if g.wake == nil {
		g.wake = make(chan struct{})
	}
	return g.wake
}

// setPaused pauses or resumes; resuming also releases the messages held by
// Stop. It reports whether the pause changed.
func (g *gate) setPaused(paused bool) (changed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	changed = g.pause != paused
	g.pause = paused
	if !paused {
		g.resumes++
	}
	g.paused.Store(paused)
	if g.wake != nil {
		close(g.wake)
		g.wake = nil
	}
	return changed
}

// waitRunnable waits while the partition is paused. It reports false if ctx
// ended first.
func (g *gate) waitRunnable(ctx context.Context) bool {
	if !g.paused.Load() {
		return ctx.Err() == nil
	}
	g.mu.Lock()
	g.waiting++
	defer func() {
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
	}()
	for g.pause {
		wake := g.waitChanLocked()
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return false
		case <-wake:
		}
		g.mu.Lock()
	}
	g.mu.Unlock()
	return ctx.Err() == nil
}

// stop holds a message for the Stop failure policy, and returns the Resume
// count to wait past (waitResumed). The message holds only itself (and,
// with OrderKey, its key): the partition's other messages go on.
func (g *gate) stop() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped++
	return g.resumes
}

// waitResumed waits for a Resume after since (stop's value), then releases
// the message's hold. It reports false if ctx ended first.
func (g *gate) waitResumed(ctx context.Context, since uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.resumes == since && ctx.Err() == nil {
		wake := g.waitChanLocked()
		g.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-wake:
		}
		g.mu.Lock()
	}
	g.stopped--
	return ctx.Err() == nil
}

// show returns the state Stats shows for a partition whose owner says base,
// with inFlight messages in calls, and whether it is paused. A held message
// shows Stopped, and a pause shows Paused once it holds a call or the
// partition is idle in Running: what the partition does, not only what was
// asked of it. A partition that is not running (reconciling, draining,
// revoked, stalled) shows that.
func (g *gate) show(base PartitionState, inFlight int64) (PartitionState, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case base == StateReconciling || base == StateDraining || base == StateRevoked || base == StateStalled:
		return base, g.pause
	case g.stopped > 0:
		return StateStopped, g.pause
	case g.pause && (g.waiting > 0 || (base == StateRunning && inFlight == 0)):
		return StatePaused, g.pause
	}
	return base, g.pause
}
