package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// Headers added to a dead-lettered message, after its own headers.
const (
	HeaderError     = "tidemark-error"     // the last Handler error, or the crash-loop breaker's reason
	HeaderAttempts  = "tidemark-attempts"  // Handler calls made, decimal
	HeaderTopic     = "tidemark-topic"     // source topic
	HeaderPartition = "tidemark-partition" // source partition, decimal
	HeaderOffset    = "tidemark-offset"    // source offset, decimal
	HeaderTimestamp = "tidemark-timestamp" // source message time, RFC 3339 with nanoseconds, UTC
	HeaderTime      = "tidemark-time"      // when the message was given up on, RFC 3339 with nanoseconds, UTC
	HeaderGroup     = "tidemark-group"     // consumer group
)

// Careful mode, after an unclean end: how many messages, and how much time,
// a partition handles one at a time with its offset made durable around
// each Handler call. Each crash in careful mode leaves the durable watermark
// on the message in flight, so the breaker names it exactly; each careful
// window moves the durable watermark forward, so a poison message further
// away is reached by a later one.
const (
	carefulMessages = 200
	carefulTime     = 5 * time.Second
)

// breaker is a partition's crash-loop breaker state for one run.
type breaker struct {
	// careful is set after an unclean end, for a bounded window.
	careful bool
	left    int       // careful messages left
	until   time.Time // careful mode ends at this time, or after left messages
	prev    offsetstore.RunState
	first   bool  // no message dispatched yet in this run
	offset  int64 // the offset whose crash count is crashes
	crashes int32
	poison  int64 // offset to give up on without a Handler call; -1 none
	limit   int
}

func newBreaker(prev *offsetstore.RunState, limit int) *breaker {
	b := &breaker{first: true, offset: -1, poison: -1, limit: limit, prev: offsetstore.RunState{Inflight: -1}}
	if prev != nil {
		b.prev = *prev
		b.careful = prev.Open
	}
	return b
}

// dispatch decides, for the message at offset about to be handled, its
// crash count and whether the breaker trips on it.
func (b *breaker) dispatch(offset int64) {
	if b.first {
		b.first = false
		b.left, b.until = carefulMessages, time.Now().Add(carefulTime)
		if b.prev.Open && b.prev.Inflight == offset {
			b.offset, b.crashes = offset, b.prev.Crashes+1
			if b.limit > 0 && int(b.crashes) >= b.limit {
				b.poison = offset
			}
			return
		}
	}
	if offset != b.offset {
		b.offset, b.crashes = offset, 0
	}
}

// handleJob handles a job's messages under the failure policy: one message
// or an ordered run of them, one Handler call each, in order; or a batch for
// the BatchHandler. It calls done with the indexes, base-relative, of each
// run of messages as it completes, in order. A batch whose call fails is
// split in halves, each handled in turn, down to the message that fails, on
// which the policy acts as it does for a Handler. It reports false if the
// generation ended first.
func (g *group) handleJob(ctx, hctx context.Context, p *partition, log *zap.Logger, msgs []kafka.Message, base int, done func(from, to int)) bool {
	st := p.st
	if g.c.batch == nil || len(msgs) == 1 {
		for i := range msgs {
			// Stats: the message leaves Waiting for InFlight.
			st.waiting.Add(-1)
			st.inFlight.Add(1)
			ok := g.process(ctx, hctx, p, log, msgs[i:i+1])
			st.inFlight.Add(-1)
			if !ok {
				return false
			}
			done(base+i, base+i+1)
		}
		return true
	}
	if base == 0 {
		n := int64(len(msgs))
		st.waiting.Add(-n)
		st.inFlight.Add(n)
		defer st.inFlight.Add(-n)
	}
	if !p.st.waitRunnable(ctx) {
		return false
	}
	err := g.call(hctx, p, log, msgs)
	if err == nil {
		done(base, base+len(msgs))
		return true
	}
	st.handlerErrors.Add(1)
	if ctx.Err() != nil {
		return false
	}
	log.Debug("batch failed; handling its halves to find the failing message",
		zap.Int64("offset", msgs[0].Offset), zap.Int("messages", len(msgs)), zap.Error(err))
	h := len(msgs) / 2
	return g.handleJob(ctx, hctx, p, log, msgs[:h:h], base, done) && g.handleJob(ctx, hctx, p, log, msgs[h:], base+h, done)
}

// process handles one message (msgs[0]) under its topic's failure policy:
// calls with backoff, then dead-letter, skip or stop. It reports true once
// the message is done (handled, dead-lettered or skipped), false if the
// generation ended first.
func (g *group) process(ctx, hctx context.Context, p *partition, log *zap.Logger, msgs []kafka.Message) bool {
	st, br, pol := p.st, p.br, p.policy
	m := &msgs[0]
	if br.careful { // the breaker counts careful (inline) calls only
		br.dispatch(m.Offset)
		st.unclean.Store(br.crashes)
	}
	if br.poison == m.Offset {
		br.poison = -1
		action := pol.Action
		if action == Retry {
			action = Stop
		}
		reason := fmt.Errorf("crash-loop breaker: %d unclean restarts in a row with %s/%d offset %d in flight",
			br.crashes, p.key.Topic, p.key.Partition, m.Offset)
		log.Error("crash-loop breaker tripped: this message was in flight at every crash; giving it to the failure policy without calling the Handler",
			zap.Int64("offset", m.Offset), zap.Int32("unclean_restarts", br.crashes), zap.Stringer("action", action))
		st.setRetrying(0, reason)
		st.breakerTrips.Add(1)
		if done, ok := g.giveUp(ctx, p, log, m, action, 0, reason); !ok || done {
			return done
		}
	}
	for {
		attempts, err, ok := g.attempt(ctx, hctx, p, log, msgs)
		if !ok {
			return false
		}
		if err == nil {
			return true
		}
		done, ok := g.giveUp(ctx, p, log, m, pol.Action, attempts, err)
		if !ok {
			return false
		}
		if done {
			return true
		}
		// Resumed after Stop: try again from the first attempt.
	}
}

// attempt calls the Handler until it succeeds, or until the policy's
// MaxAttempts failed (then it returns the last error). ok is false if the
// generation ended first.
func (g *group) attempt(ctx, hctx context.Context, p *partition, log *zap.Logger, msgs []kafka.Message) (attempts int, err error, ok bool) {
	st, pol, m := p.st, p.policy, &msgs[0]
	bo := newBackoff(g.c.cfg.RetryBackoff, g.c.cfg.MaxRetryBackoff)
	for attempts = 1; ; attempts++ {
		if !st.waitRunnable(ctx) {
			return attempts, nil, false
		}
		if attempts > 1 {
			st.retries.Add(1)
		}
		err = g.call(hctx, p, log, msgs)
		if err == nil {
			if attempts > 1 {
				st.setState(StateRunning)
				log.Info("handler succeeded after retries", zap.Int64("offset", m.Offset), zap.Int("attempts", attempts))
			}
			return attempts, nil, true
		}
		st.handlerErrors.Add(1)
		st.setRetrying(attempts, err)
		if pol.Action != Retry && attempts >= pol.MaxAttempts {
			log.Warn("handler failed; giving up on the message", zap.Int64("offset", m.Offset),
				zap.Int("attempts", attempts), zap.Stringer("action", pol.Action), zap.Error(err))
			return attempts, err, true
		}
		backoff := bo.next()
		if logWorthy(attempts) {
			log.Warn("handler failed; retrying the same message", zap.Int64("offset", m.Offset),
				zap.Int("attempt", attempts), zap.Duration("backoff", backoff), zap.Error(err))
		}
		if ctx.Err() != nil || !sleep(ctx, backoff) {
			return attempts, nil, false
		}
	}
}

// call is one Handler (or BatchHandler) call. In careful mode (after an
// unclean end, one message per call) the offset in flight is made durable
// before the call and cleared after it, one partition at a time across the
// Consumer, so that a crash during the call leaves the file naming exactly
// this message.
func (g *group) call(hctx context.Context, p *partition, log *zap.Logger, msgs []kafka.Message) error {
	br := p.br
	if !br.careful {
		return g.invoke(hctx, p, msgs)
	}
	m := &msgs[0]
	g.c.carefulMu.Lock()
	defer g.c.carefulMu.Unlock()
	g.setRun(p, log, offsetstore.RunState{Open: true, Inflight: m.Offset, Crashes: br.crashes}, true)
	err := g.invoke(hctx, p, msgs)
	br.left--
	if br.left <= 0 || time.Now().After(br.until) {
		br.careful = false
		p.st.careful.Store(false)
		p.st.unclean.Store(0)
		g.setRun(p, log, offsetstore.RunState{Open: true, Inflight: -1}, false)
		log.Info("careful mode after an unclean end is over", zap.Int64("offset", m.Offset))
	} else {
		g.setRun(p, log, offsetstore.RunState{Open: true, Inflight: -1, Crashes: 0}, true)
	}
	return err
}

// invoke calls the Handler with msgs[0], or the BatchHandler with msgs.
// Once MeasureHandlerLatency was called it times the calls: every call
// while the partition's calls take slowCall or more, where the clock's
// two reads (about 70 ns) weigh nothing; one call in sampleCalls (those
// whose first offset is a multiple of it), counted sampleCalls times,
// while they are quicker, so that timing no-op work does not add a third
// to its cost. Either way each call counts once in the histogram on
// average. The histogram is the partition's: its goroutines never
// contend on another partition's counters.
func (g *group) invoke(ctx context.Context, p *partition, msgs []kafka.Message) error {
	if !g.c.timeCalls.Load() {
		return g.invokeUntimed(ctx, msgs)
	}
	weight := uint64(1)
	slow := p.st.slowCalls.Load()
	if !slow {
		if msgs[0].Offset%sampleCalls != 0 {
			return g.invokeUntimed(ctx, msgs)
		}
		weight = sampleCalls
	}
	start := time.Now()
	err := g.invokeUntimed(ctx, msgs)
	d := time.Since(start)
	p.st.latency.observeN(d, weight)
	if (d >= slowCall) != slow {
		p.st.slowCalls.Store(!slow)
	}
	return err
}

// Handler call timing (invoke).
const (
	slowCall    = 100 * time.Microsecond
	sampleCalls = 16
)

func (g *group) invokeUntimed(ctx context.Context, msgs []kafka.Message) error {
	if g.c.batch != nil {
		return g.c.batch.HandleBatch(ctx, msgs)
	}
	return g.c.handler.Handle(ctx, msgs[0])
}

// setRun records the partition's run state, and waits for it to be
// durable if sync is set.
func (g *group) setRun(p *partition, log *zap.Logger, r offsetstore.RunState, sync bool) {
	if err := g.c.store.SetRun(p.key, r); err != nil {
		log.Error("recording the run state failed", zap.Error(err))
		return
	}
	if !sync {
		return
	}
	fctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	defer cancel()
	if err := g.c.store.Flush(fctx); err != nil {
		log.Warn("flushing the run state failed", zap.Error(err))
	}
}

// giveUp applies action to a message the Handler failed on. done reports
// that the message is done (dead-lettered or skipped); with Stop, it
// returns done=false once the partition is resumed. ok is false if the
// generation ended first.
func (g *group) giveUp(ctx context.Context, p *partition, log *zap.Logger, m *kafka.Message, action FailureAction, attempts int, cause error) (done, ok bool) {
	st := p.st
	switch action {
	case DeadLetter:
		where, ok := g.c.deadLetters.write(ctx, p, log, m, attempts, cause)
		if !ok {
			return false, false
		}
		g.recordFailure(p, log, offsetstore.Failure{Offset: m.Offset, Action: offsetstore.FailureDeadLettered,
			Attempts: int32(attempts), Reason: cause.Error(), DeadLetter: where})
		st.deadLettered.Add(1)
		st.setState(StateRunning)
		log.Warn("message dead-lettered", zap.Int64("offset", m.Offset), zap.String("dead_letter", where),
			zap.Int("attempts", attempts), zap.Error(cause))
		return true, true
	case Skip:
		g.recordFailure(p, log, offsetstore.Failure{Offset: m.Offset, Action: offsetstore.FailureSkipped,
			Attempts: int32(attempts), Reason: cause.Error()})
		st.skipped.Add(1)
		st.setState(StateRunning)
		log.Warn("message skipped by the failure policy; recorded in the offset file", zap.Int64("offset", m.Offset),
			zap.Int("attempts", attempts), zap.Error(cause))
		return true, true
	default: // Stop, and Retry when the breaker tripped
		since := st.stop(fmt.Errorf("stopped at offset %d after %d attempts: %w", m.Offset, attempts, cause))
		log.Error("message stopped by the failure policy (it holds its partition, or with OrderKey its key); call Consumer.Resume to try it again",
			zap.Int64("offset", m.Offset), zap.Int("attempts", attempts), zap.Error(cause))
		if !st.waitResumed(ctx, since) {
			return false, false
		}
		log.Info("partition resumed; trying the message again", zap.Int64("offset", m.Offset))
		return false, true
	}
}

func (g *group) recordFailure(p *partition, log *zap.Logger, f offsetstore.Failure) {
	if err := g.c.store.RecordFailure(p.key, f); err != nil {
		log.Error("recording the failure in the offset file failed", zap.Int64("offset", f.Offset), zap.Error(err))
	}
}
