package framework

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// Handling is the second stage of the data path: the partition's goroutine
// takes the chunks the fetcher queued (fetch.go), calls the Handler for each
// message in offset order under the topic's failure policy (failure.go),
// and marks each done in the tracker (tracker.go), whose watermark goes to
// the offset file (flushed by offsetstore's writer) and on to Kafka
// (commit.go).

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
func (g *generation) runPartition(ctx context.Context, p *assigned, start int64) {
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

	g.c.fetcher.add(p, start)
	defer g.c.fetcher.remove(p)
	tr := newTracker(start)
	g.handleLoop(ctx, hctx, p, log, tr)
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
// stalls.
func (g *generation) handleLoop(ctx, hctx context.Context, p *assigned, log *zap.Logger, tr *tracker) {
	st := p.st
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
		for i := range c.msgs {
			m := &c.msgs[i]
			if ctx.Err() != nil {
				return
			}
			if !tr.dispatch(m.Offset) {
				continue
			}
			if !g.process(ctx, hctx, p, log, m) {
				return
			}
			tr.complete(m.Offset)
			// processed before recording: Stats must never see a durable
			// watermark beyond the processed one.
			wm := tr.watermark()
			st.processed.Store(wm)
			st.handled.Add(1)
			g.setWatermark(p, wm)
		}
		if before := tr.watermark(); c.end > before {
			tr.advance(c.end)
			if wm := tr.watermark(); wm != before {
				st.processed.Store(wm)
				g.setWatermark(p, wm)
			}
		}
		g.c.fetcher.release(p, c.bytes)
		if c.stall != nil {
			st.setError(c.stall)
			st.setState(StateStalled)
			log.Error("partition stalled; it stays stopped until it is reassigned", zap.Int64("offset", tr.watermark()), zap.Error(c.stall))
			return
		}
	}
}
