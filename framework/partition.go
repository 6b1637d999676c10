package framework

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Decoding is the second stage of the data path: the partition's goroutine
// takes the chunks the fetcher queued (fetch.go), decodes their record
// batches (records.go) and hands each message in offset order to its
// dispatcher (dispatch.go), which calls the Handler (invoke.go) and marks it
// done in the tracker (tracker.go), whose watermark goes to the offset file
// (flushed by the offset file's writer, internal/offsetfile) and on to Kafka (committer.go).

// partition is one partition this consumer owns, from its assignment to
// its revocation, across the generations in between (cooperative
// rebalancing keeps it running). The group's goroutine creates it
// (assignment.start); then the partition's goroutine owns it (run: one at
// a time, none while it is parked), except q, where the fetcher queues
// chunks, restored, which reconciliation sets before the goroutine starts,
// and the commit fields, which the committer touches under its lock.
type partition struct {
	env *partitionEnv
	tp  topicPartition
	key offsetfile.Key // its key in the offset file
	st  *partitionStats
	q   *inbox[*chunk] // the fetcher's chunks for the partition's goroutine
	// fetch is the partition's cursor in the fetcher, from the run's add
	// on: the partition's goroutine gives its bytes back through it.
	fetch *fetchState
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
	// onAssigned is set once Config.OnAssigned returned nil: OnRevoked is
	// due at the revoke (callbacks.go).
	onAssigned atomic.Bool
	// restored are the offsets the offset file records as completed above
	// the start (by an earlier run): they are not handled again.
	restored []offsetfile.Range
	// kafkaOffset is Kafka's committed offset when the partition was
	// assigned; -1 when none.
	kafkaOffset int64
	// commitFloor is the lowest watermark the committer may send: Kafka's
	// committed offset at the assignment, or the position reconciliation
	// or a reset moved it back to. Until the offset file's checkpoint
	// reaches the start, its synced watermark may be older (a partition
	// taken back after another member went further, a state being
	// restored): sending that would move Kafka's offset back. Set by
	// reconcile before the partition runs, lowered by its goroutine at a
	// reset, read by the committer.
	commitFloor atomic.Int64
	// committed is the last offset committed or learned from Kafka, and
	// committedMeta its metadata (handoff.go).
	committed     int64
	committedMeta string
	// heldFor is the reason of the revoke that drained the partition: only
	// its final commit sends the partition (committer.hold).
	heldFor string
	// unknown is the last commit attempt whose outcome is unknown (no
	// answer), to confirm against Kafka at the next commit; nil if none.
	unknown *offsetfile.CommitAttempt
	// iv calls the Handler under the failure policy and the crash-loop
	// breaker (failure.go).
	iv invoker
	// hctx is the context of its Handler calls, which the revoke cancels
	// DrainTimeout after it ended the run's (begin).
	hctx    context.Context
	hcancel context.CancelFunc
	// What the run keeps between its goroutines (run, drive): its
	// dispatcher and the array it decodes into.
	d    *dispatcher
	msgs []kafka.Message
	// start is where the run began; ahead counts the offsets it completed
	// above its final watermark. The run sets both, read after done.
	start int64
	ahead int
}

// logger is the consumer's logger with the partition's topic and number.
func (p *partition) logger() *zap.Logger {
	return p.env.log.WithLazy(zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition))
}

// debug logs at debug level, building the partition's logger only when
// that level is on: every run logs its start and end, and the logger costs
// four allocations (20 ms of CPU over 10,000 partitions' runs).
func (p *partition) debug(msg string, fields ...zap.Field) {
	if p.env.log.Core().Enabled(zap.DebugLevel) {
		p.logger().Debug(msg, fields...)
	}
}

// partitionEnv is what every partition of a consumer shares, fixed when New
// built it: the configuration, the offset file, the fetcher (its budget and
// the partition's cursor), the Handler calls and the dead-letter writer.
// handlerCtx, the parent of every Handler call's context (Run's ctx without
// its cancellation: a revoke cancels each partition's calls once
// DrainTimeout has passed), is set by Run before any partition starts.
type partitionEnv struct {
	cfg *Config
	// log is the consumer's: a partition adds its topic and partition
	// when it logs (partition.logger), which is rare, rather than keep a
	// logger of its own (1.5 MiB at 10,000 partitions in a heap profile).
	log         *zap.Logger
	store       *offsetfile.Store
	fetcher     *fetcher
	deadLetters *deadLetters
	// handle (the Handler's) or batch, whichever Config set, wrapped in
	// Recover. A HandlerFunc is kept as the func: one call and one copy of
	// the message fewer per message than through the interface.
	handle     func(context.Context, kafka.Message) error
	batch      handler.BatchHandler
	handlerCtx context.Context
	// carefulMu lets one careful-mode Handler call run at a time, so that
	// a crash leaves exactly one message recorded in flight.
	carefulMu sync.Mutex
	// timeCalls is set by MeasureHandlerLatency (each partition keeps its
	// Handler latencies).
	timeCalls atomic.Bool
}

// handleFunc is h's Handle as a func; nil when h is.
func handleFunc(h handler.Handler) func(context.Context, kafka.Message) error {
	switch h := h.(type) {
	case nil:
		return nil
	case handler.HandlerFunc:
		return h
	}
	return h.Handle
}

// run starts a partition's run, from its assignment to its revoke: it
// registers the partition with the fetcher, then hands every message queued
// for it to its dispatcher (dispatch.go), which calls the Handler, and
// records the progress (drive). The run ends only after ctx (the partition's
// run) ended and the calls in flight returned (bounded by DrainTimeout);
// what was fetched and not handled is dropped; then done is closed.
//
// A partition that handles each message as it comes (OrderPartition with a
// Handler) has no goroutine while it has nothing to handle: the one that
// found its inbox empty exits, and the next chunk or the run's end starts
// another (drive). Otherwise the goroutine that calls run is the run's.
func (p *partition) run(ctx context.Context, start int64) {
	if !p.assigned(ctx) {
		return // revoked before OnAssigned returned nil: nothing ran
	}
	if err := p.open(ctx, start, false); err != nil {
		p.refused(ctx, err)
		return
	}
	p.drive()
}

// startParked starts the run of a partition that handles each message as
// it comes and has no OnAssigned to call, on the caller's goroutine (the
// assignment's): it is opened parked, and its first chunk (which may have
// come before: the assignment fetches it first) starts its goroutine; its
// revoke finishes it. At 10,000 partitions a goroutine each that only
// opened the run and parked cost more than the rest of the start.
func (p *partition) startParked(ctx context.Context, start int64) {
	p.onAssigned.Store(true)
	if err := p.open(ctx, start, true); err != nil {
		go p.refused(ctx, err)
	}
}

// parksAtStart reports whether a partition's run may start parked
// (startParked): it handles each message as it comes, and has no OnAssigned
// to call first.
func (e *partitionEnv) parksAtStart() bool {
	return e.cfg.Ordering == OrderPartition && e.batch == nil && e.cfg.OnAssigned == nil
}

// open sets the run up: its tracker from start and the restored ranges, its
// marker in the offset file, its dispatcher, and its cursor in the fetcher,
// last, as the fetcher queues chunks from then on (unless the assignment
// added it before: its chunks waited in the inbox). With parked (only when
// the dispatcher handles messages as they come), the run has no goroutine
// yet: the first chunk starts one, or open does if one came already.
func (p *partition) open(ctx context.Context, start int64, parked bool) error {
	st := p.st
	st.setState(StateRunning)
	p.debug("partition running", zap.Int64("offset", start), zap.Int("restored_ranges", len(p.restored)))
	p.start = start
	tr := newTracker(start, p.restored, &st.processed)
	mark, err := p.env.store.NewProgressMarker(p.key, p.gen, p.member, tr.progress)
	if err != nil {
		return err
	}
	st.tracker.Store(tr)
	d := newDispatcher(p, tr, ctx, p.hctx, mark.Changed)
	d.mark = mark
	p.d = d
	if d.direct() {
		p.q.unpark = func() { go p.drive() } // a push
	} else {
		p.q.waitable() // its goroutine waits for chunks (consume)
	}
	if p.fetch == nil {
		p.env.fetcher.add(p, start)
	}
	if parked && !p.q.park() {
		go p.drive() // fetched already (assignment.start)
	}
	return nil
}

// refused ends a run whose marker the offset file refused (only a closed or
// read-only file does: Run keeps it open): the partition stalls until it is
// revoked.
func (p *partition) refused(ctx context.Context, err error) {
	p.env.fetcher.remove(p) // if the assignment added it before open
	p.logger().Error("the offset file refuses watermarks; not consuming the partition", zap.Error(err))
	p.st.setError(err)
	p.st.setState(StateStalled)
	<-ctx.Done()
	p.hcancel()
	close(p.done)
}

// drive runs the partition's goroutine until it parks (its inbox empty:
// the goroutine exits) or the run ends (then it finishes the run).
func (p *partition) drive() {
	if p.consume(p.d) {
		return // parked: the next chunk, or the run's end, calls drive again
	}
	p.finish()
}

// finish ends the run: it settles the calls in flight (a revoke) or waits
// for the revoke (a stall), records the run's clean end and closes done.
func (p *partition) finish() {
	d, st := p.d, p.st
	ctx, tr := d.ctx, d.tr
	if ctx.Err() != nil && !p.abandoned.Load() {
		st.setState(StateDraining)
		d.settle(true)
	}
	d.close()
	d.mark.Close()
	p.ahead, _, _, _ = tr.state()
	st.tracker.Store(nil)
	// The run releases the partition cleanly: the crash-loop breaker must
	// not count this end. The revoke flushes it with the watermarks. An
	// abandoned run writes nothing: a newer run of the partition may own
	// the record by now.
	if !p.abandoned.Load() {
		if err := p.env.store.SetRun(p.key, offsetfile.RunState{Inflight: -1}); err != nil {
			p.logger().Error("recording the run state failed", zap.Error(err))
		}
	}
	st.setCareful(false)
	<-ctx.Done() // a stalled partition waits here until revoked
	p.env.fetcher.remove(p)
	p.hcancel()
	p.debug("partition stopped", zap.Int64("offset", tr.watermark()))
	close(p.done)
}

// begin makes the run's two contexts and returns the run's: the revoke
// ends it (stopRun), and cancels the Handler calls' DrainTimeout later
// if they are still running (cancelCalls). The assignment, which revokes,
// holds both ends: a running partition waits on no timer and registers
// no AfterFunc (at 10,000 partitions they weighed 10 MB).
func (p *partition) begin(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	p.cancel = cancel
	// The calls' context outlives the run's, so the calls in flight at
	// a revoke can finish and be recorded.
	p.hctx, p.hcancel = context.WithCancel(p.env.handlerCtx)
	return ctx
}

// stopRun ends the run: its goroutine finishes after the calls in flight
// return. A parked run has no goroutine, no call in flight and nothing
// fetched: it is finished here, on the caller's. At 10,000 partitions a
// goroutine each to finish them added their stacks at once to the peak
// memory. See consume for a park racing this.
func (p *partition) stopRun() {
	p.cancel()
	if p.q.unparkSelf() {
		p.drive()
	}
}

// cancelCalls cancels the Handler calls' context: DrainTimeout passed
// since stopRun and the run has not finished.
func (p *partition) cancelCalls() {
	p.logger().Warn("handler still running after DrainTimeout; cancelling its context", zap.Duration("drain_timeout", p.env.cfg.DrainTimeout))
	p.hcancel()
}

// consume handles the partition's chunks until ctx ends or the partition
// stalls, or, handling each message as it comes, until its inbox is empty
// (then it parks: see run): it decodes each chunk's record batches and hands every message, in
// offset order, to the dispatcher, which calls the Handler and marks what
// completed in the tracker; the offset file's writer reads the tracker's
// progress at each flush.
func (p *partition) consume(d *dispatcher) (parked bool) {
	tr := d.tr
	st := p.st
	var chunks []*chunk
	readCommitted := p.env.cfg.IsolationLevel == kafka.ReadCommitted
	maxInflate := min(p.env.cfg.MaxBufferedBytes, maxInflateDefault)
	step := 0 // whole batches: the dispatcher may keep their messages
	if d.direct() {
		step = decodeStep
	}
	for {
		for len(chunks) == 0 {
			if d.direct() && d.ctx.Err() == nil {
				// Nothing runs but this goroutine: it may exit. A parked
				// partition holds no message array: the next to decode
				// takes one from the pool.
				if s := p.msgs; s != nil {
					stepPool.Put(&s)
					p.msgs = nil
				}
				if chunks = p.q.takeOrPark(nil); len(chunks) > 0 {
					break
				}
				if d.ctx.Err() == nil || !p.q.unparkSelf() {
					// Parked: a push or the run's end (stopRun, which
					// may have run before the park: then this goroutine
					// takes the park back) calls drive again, and the
					// partition is that goroutine's.
					return true
				}
				return false
			}
			if chunks = p.q.take(nil); len(chunks) > 0 {
				break
			}
			if !d.wait(p.q.ready) {
				return
			}
		}
		c := chunks[0]
		chunks[0] = nil
		chunks = chunks[1:]
		d.now = time.Now().UnixNano()
		if c.reset != nil {
			// Recorded here, after the messages fetched before it were
			// handled, so the watermark never goes back to theirs.
			if !d.settle(false) {
				return
			}
			r := c.reset
			p.recordReset(r)
			tr.reset(r.to)
			if r.to < p.commitFloor.Load() {
				p.commitFloor.Store(r.to) // a move back by policy is committed
			}
			d.changed()
		}
		stall := c.stall
		// Decode one batch at a time, and with a Handler on the partition's
		// goroutine a few records at a time (decodeStep): a partition holds
		// at most one decompressed batch and a few decoded messages besides
		// what it fetched and what waits for its key, and gives the budget
		// back batch by batch.
		raw, released := c.raw, int64(0)
		// inflated is what this goroutine holds decompressed, counted in
		// the budget from before it decompresses (an estimate from the
		// last batch's ratio) until the batch's messages are let go.
		var inflated, zipped int64
		dec := decoded{end: c.from, readCommitted: readCommitted, lso: c.lso, maxInflate: maxInflate}
		if readCommitted {
			dec.txn = newTxnFilter(c.aborted)
		}
		for len(raw) > 0 {
			if !d.ease() {
				return
			}
			if p.msgs == nil && d.direct() {
				p.msgs = *stepPool.Get().(*[]kafka.Message)
			}
			if !dec.cur.open {
				if size, ok := compressedBatch(raw); ok {
					// An eighth over the last ratio: batches differ, and
					// an estimate short of the truth passes the budget.
					est := int64(size) * p.env.fetcher.inflation() * 9 / 128
					if !p.env.fetcher.inflate(d.ctx, p, est) {
						return
					}
					inflated, zipped, dec.hint = est, int64(size), int(est)
				}
			}
			dec.msgs = p.msgs[:0] // reused: the dispatcher copies what it keeps
			n, more, err := readBatch(&dec, p.tp.topic, int(p.tp.partition), c.hwm, raw, step)
			if dec.inflated > 0 {
				// The batch's true size replaces the estimate, and makes
				// the next one's.
				p.env.fetcher.holdDecoded(p.fetch, int64(dec.inflated)-inflated)
				inflated = int64(dec.inflated)
				p.env.fetcher.ratio.Store(max(inflated*16/max(zipped, 1), 1))
				dec.inflated = 0
			}
			msgs := dec.msgs
			p.msgs = msgs
			if dec.aborted > 0 {
				st.rare().aborted.Add(uint64(dec.aborted))
				dec.aborted = 0
			}
			for i := range msgs {
				if !d.add(&msgs[i]) {
					return
				}
			}
			if more {
				// Inside a batch (only when each message is handled as it
				// comes): nothing waits, and each offset was marked.
				clear(msgs)
				continue
			}
			if !d.flush() {
				return
			}
			clear(msgs) // drop the references to the batch's bytes
			if inflated != 0 {
				p.env.fetcher.holdDecoded(p.fetch, -inflated)
				inflated = 0
			}
			tr.advance(dec.end)
			d.changed()
			if err != nil {
				// Stopped at the record that failed, after handling what
				// came before it.
				stall = fmt.Errorf("decoding %s/%d at offset %d: %w", p.tp.topic, p.tp.partition, dec.end, err)
				if errors.Is(err, errInflate) {
					stall = fmt.Errorf("%w: the batch is larger than Config.MaxBufferedBytes (%d bytes), which bounds what the consumer holds; raise it to consume this partition", stall, p.env.cfg.MaxBufferedBytes)
				}
				p.env.fetcher.stall(p)
				break
			}
			if n == 0 {
				break // the rest was cut short by the response's size limit
			}
			raw = raw[n:]
			released += int64(n)
			p.env.fetcher.release(p, int64(n))
		}
		if stall == nil {
			tr.advance(c.end)
			d.changed()
		}
		p.env.fetcher.release(p, c.bytes-released)
		if stall != nil {
			if !d.settle(false) {
				return
			}
			st.setError(stall)
			st.setState(StateStalled)
			p.logger().Error("partition stalled; it stays stopped until it is reassigned", zap.Int64("offset", tr.watermark()), zap.Error(stall))
			return
		}
	}
}

// decodeStep is how many records a partition decodes at a time when it
// handles each as it comes (OrderPartition with a Handler): its array of
// decoded messages stays this small however large its batches.
const decodeStep = 16

// stepPool holds the message arrays (decodeStep long) of the partitions
// that are parked: at 10,000 partitions each keeping its own, they were a
// third of an idle partition's cost. Each array is cleared before it is put
// back (consume clears it after handling).
var stepPool = sync.Pool{New: func() any {
	s := make([]kafka.Message, 0, decodeStep)
	return &s
}}

// recordReset records in the offset file, loudly, that the partition's
// position moved by the OutOfRange policy.
func (p *partition) recordReset(r *reset) {
	p.logger().Error("position out of range; resetting", zap.Int64("from", r.from), zap.Int64("to", r.to),
		zap.Int64("log_start", r.first), zap.Int64("log_end", r.last), zap.String("policy", p.env.cfg.OutOfRange.String()),
		zap.String("reason", r.reason))
	if err := p.env.store.RecordReset(p.key, offsetfile.Reset{At: time.Now(), From: r.from, To: r.to, Reason: r.reason}); err != nil {
		p.logger().Error("recording the reset in the offset file failed", zap.Error(err))
	}
	p.st.setError(fmt.Errorf("reset from %d to %d: %s", r.from, r.to, r.reason))
}

// uncommitted bounds what the partition's next owner handles again when it
// is given up without a commit: the messages this run handled at or above
// Kafka's last confirmed committed offset, where the next owner starts. A
// run still in a Handler call (abandoned by the revoke) counts up to its
// watermark only.
func (p *partition) uncommitted() uint64 {
	from, ahead := p.st.committed.Load(), 0
	select {
	case <-p.done:
		from, ahead = max(from, p.start), p.ahead
	default:
	}
	return uint64(max(p.st.processed.Load()-from, 0) + int64(ahead))
}
