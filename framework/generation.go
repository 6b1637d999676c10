package framework

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// generation is this consumer's part in one consumer-group generation: the
// partitions assigned to it, their goroutines and the background committer.
//
// Goroutines: Run hands run, the generation's goroutine (reconcile, commit,
// revoke), to kafka-go's Generation.Start; run starts one goroutine per
// partition (runPartition, handle.go) the same way. kafka-go waits for all
// of them before the next generation, and the Consumer's wg counts them, so
// Run returns only after they exited.
type generation struct {
	c     *Consumer
	gen   *kafka.Generation
	log   *zap.Logger
	parts []*partition
	// workers counts the partition goroutines of this generation; the final
	// commit waits for them.
	workers sync.WaitGroup
	// fenced is set once a commit was refused because the generation ended
	// (IllegalGeneration, UnknownMemberId, FencedInstanceId): committing
	// stops, the offset file keeps the watermarks for the next owner.
	fenced atomic.Bool
	// failures counts commits failed in a row, so that an outage is logged
	// at its start, then sparsely, and at its end. Only the generation's
	// main goroutine commits.
	failures   int
	failedFrom time.Time
}

// partition is one partition in one generation. Its fields are set when the
// generation starts; then the partition's goroutine (handle.go) owns it,
// except q, where the fetcher queues chunks, and the commit fields, which
// the generation's goroutine owns.
type partition struct {
	tp  topicPartition
	st  *partitionStats
	key offsetstore.Key
	q   *chunkQueue
	// kafkaOffset is the committed offset kafka-go fetched when the
	// generation started; -1 when none.
	kafkaOffset int64
	// started is set once the partition's worker runs; only started
	// partitions are committed.
	started bool
	// committed is the last offset this generation committed or learned
	// from Kafka. Touched only by the generation's main goroutine.
	committed int64
	// unknown is the last commit attempt whose outcome is unknown (no
	// answer), to confirm against Kafka at the next commit; nil if none.
	// Touched only by the generation's main goroutine.
	unknown *offsetstore.CommitAttempt
	// policy is the partition's failure policy; br its crash-loop breaker,
	// used by the partition's goroutine only.
	policy FailurePolicy
	br     *breaker
}

func (c *Consumer) startGeneration(gen *kafka.Generation) {
	g := &generation{
		c:   c,
		gen: gen,
		log: c.log.With(zap.Int32("generation", gen.ID), zap.String("member", gen.MemberID)),
	}
	var names []string
	for topic, pas := range gen.Assignments {
		for _, pa := range pas {
			off := pa.Offset
			if off < 0 {
				off = -1
			}
			g.parts = append(g.parts, &partition{
				tp:          topicPartition{topic, pa.ID},
				q:           newChunkQueue(),
				st:          c.partitionStats(topic, pa.ID),
				key:         c.storeKey(topic, pa.ID),
				kafkaOffset: off,
				committed:   off,
				policy:      c.cfg.policy(topic),
			})
			names = append(names, fmt.Sprintf("%s/%d", topic, pa.ID))
		}
	}
	c.mu.Lock()
	c.gen = generationInfo{id: gen.ID, member: gen.MemberID}
	c.mu.Unlock()
	g.log.Info("generation started", zap.Strings("assigned", names))

	c.wg.Add(1)
	gen.Start(func(ctx context.Context) {
		defer c.wg.Done()
		g.run(ctx)
	})
}

// run is the generation's main goroutine: reconcile, start the partitions,
// commit in the background, and on revoke wait for the partitions, flush and
// commit the final watermarks while the generation is still valid.
func (g *generation) run(ctx context.Context) {
	starts := g.reconcile(ctx)
	g.openRuns(ctx, starts)
	for i, p := range g.parts {
		start, ok := starts[i]
		if !ok {
			continue
		}
		p.started = true
		g.workers.Add(1)
		g.c.wg.Add(1)
		g.gen.Start(func(pctx context.Context) {
			defer g.c.wg.Done()
			defer g.workers.Done()
			g.runPartition(pctx, p, start)
		})
	}
	if len(g.parts) > 0 {
		t := time.NewTicker(g.c.cfg.CommitInterval)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-t.C:
				g.commit("interval")
			}
		}
		t.Stop()
	} else {
		<-ctx.Done()
	}
	g.workers.Wait()

	fctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	err := g.c.store.Flush(fctx)
	cancel()
	if err != nil {
		g.log.Error("flushing the offset file on revoke failed; the watermarks recorded before it stay valid", zap.Error(err))
	}
	g.commit("revoke")
	for _, p := range g.parts {
		p.st.setState(StateRevoked)
	}
	g.log.Info("generation ended")
}

// openRuns reads each starting partition's run state for the crash-loop
// breaker (found open, the last run ended uncleanly) and records, durably
// and in one flush for all of them, that this run holds the partition.
func (g *generation) openRuns(ctx context.Context, starts map[int]int64) {
	if len(starts) == 0 {
		return
	}
	limit := max(g.c.cfg.CrashLoopRestarts, 0)
	for i, p := range g.parts {
		if _, ok := starts[i]; !ok {
			continue
		}
		rec, _ := g.c.store.Get(p.key)
		p.br = newBreaker(rec.Run, limit)
		p.st.careful.Store(p.br.careful)
		if p.br.careful {
			g.log.Warn("the last run ended uncleanly (crash, kill, power loss); handling the first messages carefully, one at a time, with their offsets durable",
				zap.String("topic", p.key.Topic), zap.Int32("partition", p.key.Partition),
				zap.Int64("in_flight_at_the_end", p.br.prev.Inflight), zap.Int32("unclean_restarts", p.br.prev.Crashes))
		}
		// The previous in-flight offset is kept in memory only: counted
		// again only if this run calls the Handler on it.
		if err := g.c.store.SetRun(p.key, offsetstore.RunState{Open: true, Inflight: -1}); err != nil {
			g.log.Error("recording the run state failed", zap.Error(err))
		}
	}
	fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
	defer cancel()
	if err := g.c.store.Flush(fctx); err != nil {
		g.log.Warn("flushing the run state failed; the crash-loop breaker may miss this run", zap.Error(err))
	}
}

// setWatermark records a watermark decided by reconciliation or handling.
func (g *generation) setWatermark(p *partition, wm int64) {
	if err := g.c.store.SetWatermark(p.key, wm, g.gen.ID, g.gen.MemberID); err != nil {
		g.log.Error("recording the watermark failed", zap.String("topic", p.key.Topic),
			zap.Int32("partition", p.key.Partition), zap.Int64("offset", wm), zap.Error(err))
	}
}

// logWorthy says whether the nth failure in a row is logged: the first
// three, then every power of two, so that hours of failures are a few
// dozen lines.
func logWorthy(n int) bool { return n <= 3 || n&(n-1) == 0 }

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
