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
	var peak int64
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
		peak = max(peak, st.BufferedBytes)
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

	// Go on sampling the buffered bytes while the backlog is consumed.
	sampled := make(chan int64, 1)
	go func() {
		for {
			select {
			case <-s.done:
			case <-cctx.Done():
			case <-poll.C:
				peak = max(peak, c.Stats().BufferedBytes)
				continue
			}
			sampled <- max(peak, c.Stats().BufferedBytes)
			return
		}
	}()
	err = s.wait(ctx, ran)
	if err == nil {
		peak = <-sampled
	}
	var idle idleFigures
	if err == nil && sp.IdleWindow > 0 {
		idle, err = measureIdle(ctx, c, sp.IdleWindow, ran)
	}
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
	res.PeakBuffered = peak
	res.IdleRequests, res.IdleWindow, res.IdleCPU = idle.requests, idle.window, idle.cpu
	return res, err
}

type idleFigures struct {
	requests uint64
	window   time.Duration
	cpu      time.Duration
}

// measureIdle counts the fetch requests c sends over window once nothing
// is left to fetch: the backlog is handled, and the window starts when
// Stats shows nothing buffered (every fetched message handled).
func measureIdle(ctx context.Context, c *framework.Consumer, window time.Duration, ran <-chan error) (idleFigures, error) {
	returned := func(err error) error {
		if err == nil {
			return errConsumerReturned
		}
		return fmt.Errorf("%w: %w", errConsumerReturned, err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for c.Stats().BufferedBytes != 0 {
		select {
		case err := <-ran:
			return idleFigures{}, returned(err)
		case <-ctx.Done():
			return idleFigures{}, fmt.Errorf("idle window: still %d bytes buffered after the backlog was handled", c.Stats().BufferedBytes)
		case <-tick.C:
		}
	}
	r0, cpu0, t0 := c.Stats().FetchRequests, selfCPU(), time.Now()
	tm := time.NewTimer(window)
	defer tm.Stop()
	select {
	case err := <-ran:
		return idleFigures{}, returned(err)
	case <-ctx.Done():
		return idleFigures{}, fmt.Errorf("idle window: %w", ctx.Err())
	case <-tm.C:
	}
	r1, cpu1, t1 := c.Stats().FetchRequests, selfCPU(), time.Now()
	return idleFigures{requests: r1 - r0, window: t1.Sub(t0), cpu: cpu1 - cpu0}, nil
}

// summarize counts the partitions by state.
func summarize(st framework.Stats) string {
	n := map[framework.PartitionState]int{}
	for _, p := range st.Partitions {
		n[p.State]++
	}
	return fmt.Sprintf("generation %d, partitions by state %v", st.Generation, n)
}
