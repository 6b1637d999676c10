package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// fetchBatch is what the fetcher hands to the partition's handling loop.
type fetchBatch struct {
	msgs []kafka.Message
	// end is the offset after the last record or control record seen:
	// every offset below it was delivered in msgs (or earlier) or does not
	// exist.
	end int64
	hwm int64
	// reset, when set, moves the partition before msgs: its position was
	// out of range and the policy chose a new one.
	reset *resetTo
	// stall, when set, says the policy stalled the partition.
	stall bool
}

type resetTo struct{ from, to int64 }

// runPartition is a partition's goroutine for one generation: a fetcher
// goroutine feeds batches, and this goroutine calls the Handler for every
// message in offset order and records the watermark. It returns only after
// ctx (the generation) ended, the Handler call in flight returned, and the
// fetcher exited.
func (g *generation) runPartition(ctx context.Context, p *assigned, start int64) {
	st := p.st
	log := g.log.With(zap.String("topic", p.key.Topic), zap.Int32("partition", p.key.Partition))
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

	batches := make(chan *fetchBatch, 1)
	// free hands the message slices of handled batches back to the fetcher,
	// so a partition reuses a few slices instead of growing a new one on
	// every fetch. The Handler gets each Message by value, so no reference to
	// a recycled slice outlives its batch.
	free := make(chan []kafka.Message, 2)
	fetcherDone := make(chan struct{})
	go func() {
		defer close(fetcherDone)
		g.fetchLoop(ctx, p, log, start, batches, free)
	}()

	tr := newTracker(start)
	g.handleLoop(ctx, hctx, p, log, tr, batches, free)
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
	<-fetcherDone
	log.Debug("partition stopped", zap.Int64("watermark", tr.watermark()))
}

func (g *generation) handleLoop(ctx, hctx context.Context, p *assigned, log *zap.Logger, tr *tracker, batches <-chan *fetchBatch, free chan<- []kafka.Message) {
	st := p.st
	for {
		var b *fetchBatch
		select {
		case <-ctx.Done():
			return
		case b = <-batches:
		}
		if b.stall {
			return
		}
		if b.reset != nil {
			// The fetcher recorded the reset; record the position again here,
			// after the batches fetched before it were handled, so that their
			// older watermarks do not overwrite it.
			tr.reset(b.reset.to)
			st.processed.Store(b.reset.to)
			g.setWatermark(p, b.reset.to)
		}
		for i := range b.msgs {
			m := &b.msgs[i]
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
		if cap(b.msgs) > 0 {
			clear(b.msgs) // drop the key and value buffers the Handler now owns
			select {
			case free <- b.msgs[:0]:
			default:
			}
			b.msgs = nil
		}
		st.hwm.Store(b.hwm)
		if before := tr.watermark(); b.end > before {
			tr.advance(b.end)
			if wm := tr.watermark(); wm != before {
				st.processed.Store(wm)
				g.setWatermark(p, wm)
			}
		}
	}
}

// fetchLoop fetches the partition from next on and sends batches until ctx
// ends. It owns the fetch position: the handling loop only follows it.
func (g *generation) fetchLoop(ctx context.Context, p *assigned, log *zap.Logger, next int64, out chan<- *fetchBatch, free <-chan []kafka.Message) {
	cfg := &g.c.cfg
	topic, partition := p.key.Topic, int(p.key.Partition)
	send := func(b *fetchBatch) bool {
		select {
		case out <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	backoff := 50 * time.Millisecond
	empty := 0
	hint := 0 // messages in the largest batch so far: the capacity to start with
	for ctx.Err() == nil {
		res, err := g.c.client.Fetch(ctx, &kafka.FetchRequest{
			Topic:     topic,
			Partition: partition,
			Offset:    next,
			MinBytes:  1,
			MaxBytes:  int64(cfg.FetchMaxBytes),
			MaxWait:   cfg.FetchMaxWait,
		})
		if err == nil && res.Error != nil {
			err = res.Error
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, kafka.OffsetOutOfRange) {
				// Apache Kafka leaves the log bounds out of an error response
				// (kfake fills them in): ask for them.
				bounds := g.logBounds(ctx, []*assigned{p})
				if bounds == nil {
					return
				}
				b := bounds[0]
				if next >= b.first && next <= b.last {
					log.Warn("fetch out of range, but the position is inside the log now; fetching again",
						zap.Int64("offset", next), zap.Int64("log_start", b.first), zap.Int64("log_end", b.last))
					continue
				}
				reason := fmt.Sprintf("fetch at %d out of the log [%d, %d]", next, b.first, b.last)
				to, ok := g.outOfRange(log, p, next, b.first, b.last, reason)
				if !ok {
					send(&fetchBatch{stall: true})
					return
				}
				if !send(&fetchBatch{reset: &resetTo{from: next, to: to}, end: to, hwm: b.last}) {
					return
				}
				next = to
				continue
			}
			p.st.setError(fmt.Errorf("fetch %s/%d at offset %d: %w", topic, partition, next, err))
			log.Warn("fetch failed; retrying", zap.Int64("offset", next), zap.Duration("backoff", backoff), zap.Error(err))
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond

		var buf []kafka.Message
		select {
		case buf = <-free:
		default:
			buf = make([]kafka.Message, 0, hint)
		}
		b, err := readBatch(res, next, buf)
		hint = max(hint, len(b.msgs))
		if err != nil {
			log.Warn("reading fetched records failed; fetching again", zap.Int64("offset", next), zap.Error(err))
		}
		if len(b.msgs) == 0 && b.end == next {
			// Nothing at or after next. The broker waited FetchMaxWait if the
			// log ended at next; if it did not (a batch it could not send,
			// or only aborted data), avoid spinning.
			p.st.hwm.Store(res.HighWatermark)
			if res.HighWatermark > next {
				empty++
				if empty == 10 {
					log.Warn("broker returns no records below its high watermark", zap.Int64("offset", next),
						zap.Int64("high_watermark", res.HighWatermark))
				}
				if !sleep(ctx, min(time.Duration(empty)*10*time.Millisecond, cfg.FetchMaxWait)) {
					return
				}
			}
			continue
		}
		empty = 0
		if !send(b) {
			return
		}
		next = b.end
	}
}

// readBatch turns a fetch response into messages at or after next. Control
// batches (transaction markers) are not delivered but move end past them.
func readBatch(res *kafka.FetchResponse, next int64, buf []kafka.Message) (*fetchBatch, error) {
	b := &fetchBatch{msgs: buf[:0], end: next, hwm: res.HighWatermark}
	readers := []kafka.RecordReader{res.Records}
	if rs, ok := res.Records.(*protocol.RecordStream); ok {
		readers = rs.Records
	}
	for _, rr := range readers {
		_, control := rr.(*protocol.ControlBatch)
		for {
			r, err := rr.ReadRecord()
			if err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return b, err
			}
			if r.Offset < next {
				closeBytes(r)
				continue
			}
			if r.Offset+1 > b.end {
				b.end = r.Offset + 1
			}
			if control {
				closeBytes(r)
				continue
			}
			m, err := toMessage(res.Topic, res.Partition, res.HighWatermark, r)
			if err != nil {
				return b, err
			}
			b.msgs = append(b.msgs, m)
		}
	}
	return b, nil
}

// toMessage copies a record into a Message the Handler owns: key and value
// share one allocation.
func toMessage(topic string, partition int, hwm int64, r *kafka.Record) (kafka.Message, error) {
	defer closeBytes(r)
	kl, vl := bytesLen(r.Key), bytesLen(r.Value)
	buf := make([]byte, kl+vl)
	m := kafka.Message{
		Topic:         topic,
		Partition:     partition,
		Offset:        r.Offset,
		HighWaterMark: hwm,
		Time:          r.Time,
	}
	if r.Key != nil {
		if _, err := io.ReadFull(r.Key, buf[:kl]); err != nil {
			return m, fmt.Errorf("reading key at offset %d: %w", r.Offset, err)
		}
		m.Key = buf[:kl:kl]
	}
	if r.Value != nil {
		if _, err := io.ReadFull(r.Value, buf[kl:]); err != nil {
			return m, fmt.Errorf("reading value at offset %d: %w", r.Offset, err)
		}
		m.Value = buf[kl:]
	}
	if len(r.Headers) > 0 {
		m.Headers = make([]kafka.Header, len(r.Headers))
		for i, h := range r.Headers {
			m.Headers[i] = kafka.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)}
		}
	}
	return m, nil
}

func bytesLen(b protocol.Bytes) int {
	if b == nil {
		return 0
	}
	return b.Len()
}

func closeBytes(r *kafka.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}
