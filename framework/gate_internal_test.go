package framework

import (
	"context"
	"testing"
	"time"
)

// The gate's states as Stats shows them, through a pause, a held message
// and a resume, and the waits they release.
func TestGate(t *testing.T) {
	var g gate
	show := func(base PartitionState, inFlight int64, want PartitionState, wantPaused bool) {
		t.Helper()
		if got, paused := g.show(base, inFlight); got != want || paused != wantPaused {
			t.Fatalf("show(%s, %d) = %s, paused %v; want %s, paused %v", base, inFlight, got, paused, want, wantPaused)
		}
	}
	ctx := context.Background()
	if !g.waitRunnable(ctx) {
		t.Fatal("waitRunnable on an open gate: false")
	}
	show(StateRunning, 0, StateRunning, false)

	g.setPaused(true)
	show(StateRunning, 0, StatePaused, true)  // idle: the pause holds
	show(StateRunning, 1, StateRunning, true) // a call in flight: not paused yet
	show(StateRetrying, 1, StateRetrying, true)
	released := make(chan bool)
	go func() { released <- g.waitRunnable(ctx) }()
	waitUntil(t, func() bool { s, _ := g.show(StateRetrying, 1); return s == StatePaused }) // a retry held by the pause
	show(StateRevoked, 0, StateRevoked, true)

	since := g.stop()
	show(StateRetrying, 1, StateStopped, true) // a held message comes first
	show(StateDraining, 1, StateDraining, true)
	resumed := make(chan bool)
	go func() { resumed <- g.waitResumed(ctx, since) }()
	select {
	case <-released:
		t.Fatal("waitRunnable returned while paused")
	case <-resumed:
		t.Fatal("waitResumed returned before a Resume")
	case <-time.After(20 * time.Millisecond):
	}
	g.setPaused(false)
	if !<-released || !<-resumed {
		t.Fatal("a wait reported its context done after Resume")
	}
	show(StateRunning, 0, StateRunning, false)

	// A cancelled wait releases its hold, and says so.
	g.setPaused(true)
	since = g.stop()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if g.waitRunnable(cctx) || g.waitResumed(cctx, since) {
		t.Fatal("a wait with its context done reported true")
	}
	show(StateRunning, 0, StatePaused, true) // no message held any more
	g.setPaused(false)
	show(StateRunning, 0, StateRunning, false)
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
