package framework

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Liveness: what Consumer.Healthy reads, kept cheap enough to update on
// every turn of the loops it watches.
//
// Run sets its phase (not started, running, returned) and keeps its ctx,
// which tells a running consumer from a stopping one. Each of the three
// long-lived loops Run owns, the group loop (the membership's, classic.go),
// the fetcher's own goroutine (leaders.go) and the committer
// (committer.go), stamps a loopWatch
// when it starts a step (a join, a revoke, a reconciliation, a leader
// lookup, a commit) and clears it when it waits for work. A retry loop
// inside a step (Kafka unreachable) stamps it again at every try: it is
// alive, the broker is not. A loop whose step has lasted longer than any
// step can last with the configured timeouts (stuckAfter) is stuck: a bug,
// a deadlock, a call that ignores its deadline. No goroutine is started
// for any of this.

// Run phases.
const (
	phaseNew int32 = iota
	phaseRunning
	phaseReturned
)

// loopWatch is one loop's liveness stamp: when its current step began, in
// Unix nanoseconds; 0 while it waits for work.
type loopWatch struct {
	since atomic.Int64
}

// busy notes that the loop starts a step (or a new try of one) now.
func (w *loopWatch) busy() { w.since.Store(time.Now().UnixNano()) }

// idle notes that the loop waits for work.
func (w *loopWatch) idle() { w.since.Store(0) }

// busyFor is how long the current step has lasted, 0 while idle.
func (w *loopWatch) busyFor(now time.Time) time.Duration {
	s := w.since.Load()
	if s == 0 {
		return 0
	}
	return max(now.Sub(time.Unix(0, s)), 0)
}

// liveness is the Consumer's: Run's phase and ctx, and its loops' stamps.
type liveness struct {
	phase atomic.Int32
	ctx   atomic.Pointer[context.Context]
	// started is when Run started, in Unix nanoseconds; 0 before.
	started atomic.Int64
	// group, fetcher and committer are stamped by their loops.
	group, fetcher, committer loopWatch
}

// stuckAfter is the longest a step of a watched loop can last with cfg's
// timeouts, with room to spare: a join (JoinGroup and SyncGroup, each up to
// RebalanceTimeout + Timeout), a revoke (DrainTimeout plus 2 s, a flush and
// two commits, each up to Timeout), a reconciliation, plus a minute. About
// three minutes with the defaults.
func stuckAfter(cfg *Config) time.Duration {
	return 2*cfg.RebalanceTimeout + 8*cfg.Timeout + cfg.DrainTimeout + drainGrace + time.Minute
}

// What the probes say outside Run.
var (
	errNotStarted = errors.New("not running: Run has not been called")
	errReturned   = errors.New("not running: Run returned")
	errStopping   = errors.New("stopping: Run's context ended; draining the partitions")
)

// running reports nil while Run runs and its ctx has not ended, or why not.
func (l *liveness) running() error {
	switch l.phase.Load() {
	case phaseNew:
		return errNotStarted
	case phaseReturned:
		return errReturned
	}
	if ctx := l.ctx.Load(); ctx != nil && (*ctx).Err() != nil {
		return errStopping
	}
	return nil
}

// stuck names the first watched loop whose step has lasted past limit.
func (l *liveness) stuck(now time.Time, limit time.Duration) error {
	for _, w := range []struct {
		name string
		w    *loopWatch
	}{{"the group loop (join, rebalance, reconciliation)", &l.group}, {"the fetcher", &l.fetcher}, {"the committer", &l.committer}} {
		if d := w.w.busyFor(now); d > limit {
			return fmt.Errorf("stuck: %s has been in one step for %s (the configured timeouts allow %s)",
				w.name, d.Round(time.Second), limit)
		}
	}
	return nil
}
