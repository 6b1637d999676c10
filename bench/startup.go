package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/tidemark/tidemark/framework"
)

// runStartup is the child of the many-partitions phase: it starts tidemark
// on sp.OffsetFile, measures how long the consumer takes to join the group
// and to have every partition reconciled and running, then consumes sp.Want
// messages (the backlog) and reports the usual throughput figures.
func runStartup(ctx context.Context, sp *childSpec, out *lineWriter) (childResult, error) {
	s := newSink(sp, out)
	cfg, closeLog, err := tidemarkConfig(sp, s, false)
	if err != nil {
		return childResult{}, err
	}
	defer closeLog()
	var prof *os.File
	if sp.CPUProfile != "" {
		if prof, err = startProfile(sp.CPUProfile); err != nil {
			return childResult{}, err
		}
		sp.CPUProfile = "" // not the sink's window
	}
	t0 := time.Now()
	c, err := framework.New(cfg)
	if err != nil {
		return childResult{}, err
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(cctx) }()

	var joined, reconciled, ready time.Duration
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for ready == 0 {
		select {
		case err := <-ran:
			return childResult{}, fmt.Errorf("Run returned before every partition was running: %v", err)
		case <-ctx.Done():
			stop()
			<-ran
			return childResult{}, fmt.Errorf("not every partition running within %s: %s", sp.Timeout, summarize(c.Stats()))
		case <-poll.C:
		}
		st := c.Stats()
		if joined == 0 && st.Generation != 0 {
			joined = time.Since(t0)
		}
		// Processed is -1 until reconciliation decided where the partition
		// starts; the state turns from reconciling to running when its
		// goroutine starts fetching.
		known, running := 0, 0
		for _, p := range st.Partitions {
			if p.Processed >= 0 {
				known++
				if p.State != framework.StateReconciling && p.State != framework.StateRevoked {
					running++
				}
			}
		}
		if reconciled == 0 && known == sp.Partitions {
			reconciled = time.Since(t0)
		}
		if running == sp.Partitions {
			ready = time.Since(t0)
		}
	}
	if prof != nil {
		pprof.StopCPUProfile()
		if err := prof.Close(); err != nil {
			return childResult{}, err
		}
	}

	err = s.wait(ctx, ran)
	stop()
	if err != nil {
		if !errors.Is(err, errConsumerReturned) {
			<-ran
		}
		return childResult{}, err
	}
	if err := <-ran; err != nil {
		return childResult{}, fmt.Errorf("Run: %w", err)
	}
	res, err := s.result()
	res.Joined, res.Reconciled, res.Ready = joined, reconciled, ready
	return res, err
}

// summarize counts the partitions by state.
func summarize(st framework.Stats) string {
	n := map[framework.PartitionState]int{}
	for _, p := range st.Partitions {
		n[p.State]++
	}
	return fmt.Sprintf("generation %d, partitions by state %v", st.Generation, n)
}
