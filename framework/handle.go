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

// Handling is the second stage of the data path: the partition's goroutine
// takes the chunks the fetcher queued (fetch.go), calls the Handler for each
// message in offset order under the topic's failure policy (failure.go),
// and marks each done in the tracker (tracker.go), whose watermark goes to
// the offset file (flushed by offsetstore's writer) and on to Kafka
// (commit.go).

// partition is one partition this consumer owns, from its assignment to
// its revocation, across the generations in between (cooperative
// rebalancing keeps it running). The group's goroutine (group.go) creates
// it; then the partition's goroutine (runPartition) owns it, except q,
// where the fetcher queues chunks, and the commit fields, which commits
// (commit.go) touch under group.commitMu.
type partition struct {
	tp  topicPartition
	st  *partitionStats
	key offsetstore.Key
	q   *chunkQueue
	// gen and member are the group identity when the partition was
	// assigned, recorded with its watermarks.
	gen    int32
	member string
	// cancel ends the partition's goroutine (revoke); done is closed when
	// it has exited. abandoned is set when a revoke stopped waiting for a
	// Handler call that ignored its context: nothing is marked after it.
	cancel    context.CancelFunc
	done      chan struct{}
	abandoned atomic.Bool
	// kafkaOffset is Kafka's committed offset when the partition was
	// assigned; -1 when none.
	kafkaOffset int64
	// committed is the last offset committed or learned from Kafka.
	committed int64
	// unknown is the last commit attempt whose outcome is unknown (no
	// answer), to confirm against Kafka at the next commit; nil if none.
	unknown *offsetstore.CommitAttempt
	// policy is the partition's failure policy; br its crash-loop breaker,
	// used by the partition's goroutine only.
	policy FailurePolicy
	br     *breaker
}

// chunkQueue is a partition's inbox: the fetcher pushes chunks without ever
// blocking, the partition's goroutine pops them in order.
type chunkQueue struct {
	mu    sync.Mutex
	items []*chunk
	ready chan struct{} // holds a token while items may be non-empty
}

func newChunkQueue() *chunkQueue { return &chunkQueue{ready: make(chan struct{}, 1)} }

func (q *chunkQueue) push(c *chunk) {
	q.mu.Lock()
	q.items = append(q.items, c)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest chunk, waiting for one until ctx ends (nil).
func (q *chunkQueue) pop(ctx context.Context) *chunk {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			c := q.items[0]
			q.items[0] = nil
			q.items = q.items[1:]
			q.mu.Unlock()
			return c
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-q.ready:
		}
	}
}

// runPartition is a partition's goroutine for one generation: it registers
// the partition with the fetcher, then calls the Handler for every message
// queued for it, in offset order, and records the watermark. It returns
// only after ctx (the generation) ended and the Handler call in flight
// returned (bounded by DrainTimeout); what was fetched and not handled is
// dropped.
func (g *group) runPartition(ctx context.Context, p *partition, start int64) {
	st := p.st
	log := g.log.With(zap.String("topic", p.tp.topic), zap.Int("partition", p.tp.partition))
	st.setState(StateRunning)
	log.Debug("partition running", zap.Int64("offset", start))

	// The Handler's context outlives the generation by DrainTimeout, so the
	// call in flight at a revoke can finish and be recorded.
	hctx, hcancel := context.WithCancel(g.c.handlerCtx)
	defer hcancel()
	drained := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-drained:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(g.c.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-drained:
		case <-t.C:
			log.Warn("handler still running after DrainTimeout; cancelling its context", zap.Duration("drain_timeout", g.c.cfg.DrainTimeout))
			hcancel()
		}
	}()

	mark, err := g.c.store.NewMarker(p.key, p.gen, p.member)
	if err != nil {
		// Only a closed or read-only file refuses: Run keeps it open.
		log.Error("the offset file refuses watermarks; not consuming the partition", zap.Error(err))
		st.setError(err)
		st.setState(StateStalled)
		<-ctx.Done()
		close(drained)
		<-watcherDone
		return
	}
	g.c.fetcher.add(p, start)
	defer g.c.fetcher.remove(p)
	tr := newTracker(start)
	g.handleLoop(ctx, hctx, p, log, tr, mark)
	mark.Close()
	// The run releases the partition cleanly: the crash-loop breaker must
	// not count this end. The generation flushes it with the watermarks.
	if err := g.c.store.SetRun(p.key, offsetstore.RunState{Inflight: -1}); err != nil {
		log.Error("recording the run state failed", zap.Error(err))
	}
	st.careful.Store(false)
	if ctx.Err() != nil {
		st.setState(StateDraining)
	}
	close(drained)
	<-watcherDone
	<-ctx.Done() // a stalled partition parks here until revoked
	log.Debug("partition stopped", zap.Int64("watermark", tr.watermark()))
}

// handleLoop handles the partition's chunks until ctx ends or the partition
// stalls: it decodes each chunk's record batches, calls the Handler for
// every message in offset order, and marks each watermark in the offset
// file (mark: an atomic store; the file's writer picks up the latest at
// each flush).
func (g *group) handleLoop(ctx, hctx context.Context, p *partition, log *zap.Logger, tr *tracker, mark *offsetstore.Marker) {
	st := p.st
	var msgs []kafka.Message // reused: the Handler gets each Message by value
	for {
		c := p.q.pop(ctx)
		if c == nil {
			return
		}
		if c.reset != nil {
			// Recorded here, after the messages fetched before it were
			// handled, so the watermark never goes back to theirs.
			r := c.reset
			g.recordReset(p, log, r)
			tr.reset(r.to)
			st.processed.Store(r.to)
		}
		stall := c.stall
		// Decode and handle one batch at a time: a partition holds at most
		// one decoded (and decompressed) batch besides what it fetched, and
		// gives the budget back batch by batch.
		raw, released := c.raw, int64(0)
		d := decoded{end: c.from}
		for len(raw) > 0 {
			d.msgs = msgs[:0]
			n, err := nextBatch(&d, p.tp.topic, p.tp.partition, c.hwm, raw)
			msgs = d.msgs
			for i := range msgs {
				m := &msgs[i]
				if ctx.Err() != nil {
					return
				}
				if !tr.dispatch(m.Offset) {
					continue
				}
				if !g.process(ctx, hctx, p, log, m) || p.abandoned.Load() {
					return
				}
				tr.complete(m.Offset)
				// processed before recording: Stats must never see a
				// durable watermark beyond the processed one.
				wm := tr.watermark()
				st.processed.Store(wm)
				st.handled.Add(1)
				mark.Set(wm)
			}
			clear(msgs) // drop the references to the batch's bytes
			g.advance(tr, st, mark, d.end)
			if err != nil {
				// Stopped at the record that failed, after handling what
				// came before it.
				stall = fmt.Errorf("decoding %s/%d at offset %d: %w", p.tp.topic, p.tp.partition, d.end, err)
				g.c.fetcher.stall(p)
				break
			}
			if n == 0 {
				break // the rest was cut short by the response's size limit
			}
			raw = raw[n:]
			released += int64(n)
			g.c.fetcher.release(p, int64(n))
		}
		if stall == nil {
			g.advance(tr, st, mark, c.end)
		}
		g.c.fetcher.release(p, c.bytes-released)
		if stall != nil {
			st.setError(stall)
			st.setState(StateStalled)
			log.Error("partition stalled; it stays stopped until it is reassigned", zap.Int64("offset", tr.watermark()), zap.Error(stall))
			return
		}
	}
}

// advance moves the watermark to end when every offset below it is done or
// does not exist (records compaction removed, transaction markers).
func (g *group) advance(tr *tracker, st *partitionStats, mark *offsetstore.Marker, end int64) {
	if before := tr.watermark(); end > before {
		tr.advance(end)
		if wm := tr.watermark(); wm != before {
			st.processed.Store(wm)
			mark.Set(wm)
		}
	}
}
