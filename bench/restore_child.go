package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// The restore section's child (restore.go). Without Spec.Restore it fills
// the changelog: a TxHandler puts every message under a key of its own
// (its offset), so each message is one changelog record, and the child
// stops once Kafka's commit covers every message. With Spec.Restore it
// starts the same consumer on an empty offset file in the same group:
// Kafka's committed offset is past the file, so every partition restores
// its state from the changelog before it runs. The window is from the
// group's assignment to every partition running; then the child waits for
// the restored state to be durable, and ViewState counts the keys.

// restoreConfig is the tidemark-txlog consumer's Config (the same
// changelog, named after the group) with the section's TxHandler.
func restoreConfig(sp *childSpec, s *sink) (framework.Config, func(), error) {
	tx := *sp
	tx.Consumer = consTidemarkTxLog
	cfg, closeLog, err := tidemarkConfig(&tx, s, false)
	if err != nil {
		return cfg, nil, err
	}
	cfg.TxHandler = handler.TxHandlerFunc(func(_ context.Context, st handler.State, msgs []kafka.Message) error {
		var key [8]byte
		for _, m := range msgs {
			binary.BigEndian.PutUint64(key[:], uint64(m.Offset))
			if err := st.Put(key[:], m.Value); err != nil {
				return err
			}
			s.see(m.Partition, m.Offset, m.Value)
		}
		return nil
	})
	return cfg, closeLog, nil
}

func runRestore(ctx context.Context, sp *childSpec, out *lineWriter) (childResult, error) {
	s := newSink(sp, out)
	cfg, closeLog, err := restoreConfig(sp, s)
	if err != nil {
		return childResult{}, err
	}
	defer closeLog()
	c, err := framework.New(cfg)
	if err != nil {
		return childResult{}, err
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(cctx) }()
	var res childResult
	if sp.Restore {
		res, err = measureRestore(ctx, c, sp, ran)
	} else {
		res, err = fillChangelog(ctx, c, sp, s, ran)
	}
	stop()
	if err != nil {
		if !errors.Is(err, errConsumerReturned) {
			<-ran
		}
		return childResult{}, err
	}
	if err := <-ran; err != nil {
		return childResult{}, fmt.Errorf("stopping the consumer: %w", err)
	}
	return res, nil
}

// fillChangelog waits for every message to be handled, then for Kafka's
// commit of every partition to reach its end: the committer commits an
// offset only once the changelog acknowledged every change below it.
func fillChangelog(ctx context.Context, c *framework.Consumer, sp *childSpec, s *sink, ran chan error) (childResult, error) {
	go func() {
		if awaitGeneration(ctx, c) {
			s.assigned()
		}
	}()
	if err := s.wait(ctx, ran); err != nil {
		return childResult{}, err
	}
	res, err := s.result()
	if err != nil {
		return res, err
	}
	end := sp.StartAt + sp.PerPartition
	if err := pollStats(ctx, c, ran, everyPartition(sp, func(p framework.PartitionStats) bool { return p.Committed >= end })); err != nil {
		return res, fmt.Errorf("waiting for Kafka's commit to reach %d on every partition: %w", end, err)
	}
	return res, nil
}

// measureRestore times the restore: from the group's assignment to every
// partition running, its records from Stats().RestoreTotal; then it counts
// the restored keys through ViewState.
func measureRestore(ctx context.Context, c *framework.Consumer, sp *childSpec, ran chan error) (childResult, error) {
	if err := pollStats(ctx, c, ran, func(st framework.Stats) bool { return st.Generation > 0 }); err != nil {
		return childResult{}, err
	}
	var prof *os.File
	if sp.CPUProfile != "" {
		var err error
		if prof, err = startProfile(sp.CPUProfile); err != nil {
			return childResult{}, err
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0, t0 := selfCPU(), time.Now()
	var records uint64
	running := everyPartition(sp, func(p framework.PartitionStats) bool { return p.State == framework.StateRunning && !p.Restoring })
	err := pollStats(ctx, c, ran, func(st framework.Stats) bool {
		records = 0
		for _, p := range st.Partitions {
			records += p.RestoreTotal
		}
		return running(st)
	})
	t1, cpu1 := time.Now(), selfCPU()
	runtime.ReadMemStats(&m1)
	if prof != nil {
		writeHeapProfile(strings.TrimSuffix(sp.CPUProfile, ".pprof") + ".heap")
		pprof.StopCPUProfile()
		_ = prof.Close()
	}
	if err != nil {
		return childResult{}, fmt.Errorf("waiting for every partition to restore and run: %w", err)
	}
	res := childResult{
		Messages: int64(records),
		Window:   t1.Sub(t0),
		CPU:      cpu1 - cpu0,
		Mallocs:  m1.Mallocs - m0.Mallocs,
		Bytes:    m1.TotalAlloc - m0.TotalAlloc,
	}
	// The restored state is written in the background: the time to it
	// being durable, as Stats shows it, is reported beside.
	end := sp.StartAt + sp.PerPartition
	if err := pollStats(ctx, c, ran, everyPartition(sp, func(p framework.PartitionStats) bool { return p.Durable >= end })); err != nil {
		return res, fmt.Errorf("waiting for the restored state to be durable: %w", err)
	}
	res.RestoreDurable = time.Since(t0)
	res.WindowRSS = peakRSS()
	for p := range sp.Partitions {
		var n int64
		err := c.ViewState(sp.Topic, p, func(st handler.State) error {
			return st.ForEach(func(_, _ []byte) error { n++; return nil })
		})
		if err != nil {
			return res, fmt.Errorf("reading the restored state of %s/%d: %w", sp.Topic, p, err)
		}
		if n != sp.PerPartition {
			return res, fmt.Errorf("%s/%d: %d keys restored, want %d (one per message)", sp.Topic, p, n, sp.PerPartition)
		}
		res.StateKeys += n
	}
	return res, nil
}

// everyPartition reports, of Stats, whether each of the spec's partitions
// is there and ok says so.
func everyPartition(sp *childSpec, ok func(framework.PartitionStats) bool) func(framework.Stats) bool {
	return func(st framework.Stats) bool {
		n := 0
		for _, p := range st.Partitions {
			if ok(p) {
				n++
			}
		}
		return n == sp.Partitions
	}
}

// pollStats polls the consumer's Stats every 2 ms until done says so, the
// consumer returns (errConsumerReturned: ran is read), or ctx ends.
func pollStats(ctx context.Context, c *framework.Consumer, ran chan error, done func(framework.Stats) bool) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for !done(c.Stats()) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-ran:
			if err == nil {
				return errConsumerReturned
			}
			return fmt.Errorf("%w: %v", errConsumerReturned, err)
		case <-t.C:
		}
	}
	return nil
}
