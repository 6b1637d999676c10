package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// Reconciliation runs when the group assigns partitions to this consumer,
// before any is fetched: the offset file and Kafka's committed offset are compared and
// each partition's starting position decided (see reconcile).

// reconcile decides where each partition resumes, comparing the offset
// file's durable watermark L with Kafka's committed offset C and the log's
// bounds. It returns the start offset of every partition that may run; a
// partition stalled by policy is left out. It retries listing the log
// bounds until it succeeds or ctx ends.
func (a *assignment) reconcile(ctx context.Context, parts []*partition) map[int]int64 {
	tps := make([]topicPartition, len(parts))
	for i, p := range parts {
		tps[i] = p.tp
	}
	bounds := a.c.logBounds(ctx, tps, &a.c.live.group)
	if bounds == nil {
		return nil
	}
	starts := make(map[int]int64, len(parts))
	commits := map[string]map[int32]int64{}
	moved := false // a watermark was set: flush it before Stats shows it
	for i, p := range parts {
		b := bounds[i]
		log := a.log.With(zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition))
		L := int64(-1)
		rec, ok := a.c.store.Durable(p.storeKey())
		if ok && rec.Watermark >= 0 {
			L = rec.Watermark
		}
		C := p.kafkaOffset
		// K is the last offset Kafka confirmed for the group, from the
		// commit ledger (a commit of unknown outcome is not confirmed).
		K := rec.Committed
		if last := rec.LastCommit; last != nil && last.Outcome == offsetstore.CommitUnknown {
			a.c.committer.confirm(p, log, *last, C, "at startup")
		}
		var start int64
		// wasReset: the position was moved by policy. The file's completed
		// ranges then describe another log (a recreated topic) or offsets
		// the log no longer holds: they are never restored, even where the
		// reset's target equals the old watermark.
		wasReset := false
		switch {
		case L >= 0 && K >= 0 && C < K:
			// Not a late commit: Kafka lost or moved back below what it
			// confirmed. The topic was recreated, the group's offsets were
			// reset by an operator, or they expired while the group was empty.
			var reason string
			if C < 0 {
				reason = fmt.Sprintf("Kafka has no committed offset, but confirmed %d before (local %d): "+
					"the topic was recreated, or the group's offsets were deleted or expired", K, L)
			} else {
				reason = fmt.Sprintf("Kafka's committed offset %d is below the %d it confirmed before (local %d): "+
					"the group's offsets were reset, or the topic was recreated", C, K, L)
			}
			to, ok := C, true
			if C < 0 {
				to, ok = a.c.outOfRangeTarget(b)
			} else if a.c.cfg.OutOfRange == Stall {
				ok = false
			}
			if ok && (to < b.first || to > b.last) {
				reason += fmt.Sprintf("; Kafka's offset is outside the log [%d, %d]", b.first, b.last)
				to, ok = a.c.outOfRangeTarget(b)
			}
			if !ok {
				err := a.c.stallError(p.tp, L, b.first, b.last, reason)
				log.Error("partition stalled: committed offset moved back", zap.Int64("local", L), zap.Int64("kafka_committed", C),
					zap.Int64("confirmed", K), zap.String("policy", a.c.cfg.OutOfRange.String()), zap.String("reason", reason))
				p.st.setError(err)
				p.st.setState(StateStalled)
				continue
			}
			p.recordReset(&reset{from: L, to: to, first: b.first, last: b.last, reason: reason})
			wasReset = true
			if C >= 0 {
				// Kafka holds C: that is the ledger's baseline from now on.
				if err := a.c.store.SetCommitted(p.storeKey(), C); err != nil {
					log.Error("recording Kafka's committed offset failed", zap.Error(err))
				}
			}
			start = to
		case L < 0 && C < 0:
			start = b.first
			if a.startsAtEnd(p.tp) {
				start = b.stable
			}
			log.Info("no position in the offset file or Kafka; starting at StartOffset",
				zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
		case L >= C:
			start = L
			if L > C {
				log.Info("offset file ahead of Kafka (a commit was late, failed or not yet made); committing the local watermark",
					zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
			} else {
				log.Debug("offset file and Kafka agree", zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
			}
		case L < 0:
			start = C
			log.Info("no position in the offset file (first time here); resuming at Kafka's committed offset",
				zap.Int64("kafka_committed", C), zap.Int64("resume", start))
		default:
			start = C
			log.Warn("Kafka ahead of the offset file (another member went further); resuming at Kafka's committed offset",
				zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
		}
		if start < b.first || start > b.last {
			reason := fmt.Sprintf("position %d (local %d, kafka %d) outside the log [%d, %d] at assignment", start, L, C, b.first, b.last)
			to, ok := a.c.outOfRangeTarget(b)
			if !ok {
				err := a.c.stallError(p.tp, start, b.first, b.last, reason)
				log.Error("partition stalled: position out of range", zap.Int64("from", start), zap.Int64("log_start", b.first),
					zap.Int64("log_end", b.last), zap.String("policy", a.c.cfg.OutOfRange.String()))
				p.st.setError(err)
				p.st.setState(StateStalled)
				continue
			}
			p.recordReset(&reset{from: start, to: to, first: b.first, last: b.last, reason: reason})
			wasReset = true
			start = to
		}
		if start != L || wasReset {
			a.setWatermark(p, start)
			moved = true
		} else {
			// The file is current: what it records as completed above its
			// watermark is not handled again.
			p.restored = rec.Completed
		}
		starts[i] = start
		if start >= L {
			// Shown before the flush makes it durable, so that Stats never
			// sees durable above processed; a start below the file's
			// watermark (a reset back) waits for publish.
			p.st.processed.Store(start)
		}
		if start != C {
			if commits[p.tp.topic] == nil {
				commits[p.tp.topic] = map[int32]int64{}
			}
			commits[p.tp.topic][p.tp.partition] = start
		}
	}
	// Commit what reconciliation decided, in one request, once it is
	// durable: Kafka never holds a position the file does not. The committer
	// retries anything this misses.
	if len(commits) > 0 || moved {
		fctx, cancel := context.WithTimeout(ctx, a.c.cfg.Timeout)
		err := a.c.store.Flush(fctx)
		cancel()
		if err != nil {
			a.log.Warn("flushing reconciled positions failed; the committer commits them once durable", zap.Error(err))
			a.publish(parts, bounds, starts)
			return starts
		}
	}
	// Stats shows the positions once durable, and Kafka's offset only
	// where it does not pass them: committed <= durable <= processed.
	a.publish(parts, bounds, starts)
	if len(commits) > 0 {
		var todo []*partition
		for _, p := range parts {
			if _, ok := commits[p.tp.topic][p.tp.partition]; ok {
				todo = append(todo, p)
			}
		}
		err := a.c.committer.commitNow(commits, todo, todo[0].gen, todo[0].member)
		if err == nil {
			a.log.Info("reconciliation committed", zap.Any("offsets", commits))
		} else {
			a.log.Warn("reconciliation commit failed; the committer retries at the next interval",
				zap.Any("offsets", commits), zap.Error(err))
		}
	}
	return starts
}

// publish shows the reconciled positions in Stats: processed is the start,
// committed is Kafka's committed offset unless it passes the start (then
// -1, unknown, until the reconciliation commit is confirmed).
func (a *assignment) publish(parts []*partition, bounds []logBounds, starts map[int]int64) {
	for i, p := range parts {
		start, ok := starts[i]
		if !ok {
			continue
		}
		p.st.hwm.Store(bounds[i].last)
		if a.c.cfg.IsolationLevel == kafka.ReadCommitted {
			p.st.lso.Store(bounds[i].stable)
		}
		c := p.kafkaOffset
		if c > start {
			c = -1
		}
		p.st.committed.Store(c)
		p.st.processed.Store(start)
	}
}

// outOfRangeTarget applies the OutOfRange policy to a position outside the
// log [first, last]: where to resume, or false if the partition stalls.
func (c *Consumer) outOfRangeTarget(b logBounds) (int64, bool) {
	switch c.cfg.OutOfRange {
	case ResetToLatest:
		return b.stable, true
	case Stall:
		return 0, false
	}
	return b.first, true
}

// stallError is the error of a partition stalled by the OutOfRange policy.
func (c *Consumer) stallError(tp topicPartition, from, first, last int64, reason string) error {
	return fmt.Errorf("tidemark: %s/%d: %s (position %d, log [%d, %d]); stalled by the OutOfRange policy",
		tp.topic, tp.partition, reason, from, first, last)
}

// logBounds are a partition's first offset, its log end (the high
// watermark) and its last stable offset: the log end at read_committed,
// where an open transaction holds it back (the log end at
// ReadUncommitted). The latest position a partition may start at is
// stable: starting at the log end would pass the records of the open
// transactions below it, which may yet commit.
type logBounds struct{ first, last, stable int64 }

// logBounds lists the first and last (high watermark) offsets of parts, in
// order, retrying with backoff until it succeeds or ctx ends (then nil).
// Each try stamps the caller's loop watch: retrying is alive.
func (c *Consumer) logBounds(ctx context.Context, parts []topicPartition, w *loopWatch) []logBounds {
	if len(parts) == 0 {
		return nil
	}
	bo := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		w.busy()
		out, err := c.fetcher.listOffsets(ctx, parts)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			return nil
		}
		d := bo.next()
		c.log.Warn("listing log bounds failed; retrying", zap.Error(err), zap.Duration("backoff", d))
		if !sleep(ctx, d) {
			return nil
		}
	}
}
