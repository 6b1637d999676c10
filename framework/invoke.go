package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Invoking the Handler: a job's messages are handled under the topic's
// failure policy (attempts with backoff; failure.go gives up on a message),
// with careful mode's durable in-flight offset around each call after an
// unclean end, and the calls timed for Stats.HandlerLatency. Each runs on
// the goroutine that runs the job: the partition's, or one of its
// dispatcher's workers.

// handleJob handles a job's messages under the failure policy: one message
// or an ordered run of them, one Handler call each, in order; or a batch for
// the BatchHandler. It calls done with the indexes, base-relative, of each
// run of messages as it completes, in order. A batch whose call fails is
// split in halves, each handled in turn, down to the message that fails, on
// which the policy acts as it does for a Handler. It reports false if the
// partition stopped first.
func (iv *invoker) handleJob(ctx, hctx context.Context, msgs []kafka.Message, base int, done func(from, to int)) bool {
	st := iv.p.st
	if iv.p.env.batch == nil || len(msgs) == 1 {
		for i := range msgs {
			// Stats: the message leaves Waiting for InFlight.
			st.waiting.Add(-1)
			st.inFlight.Add(1)
			ok := iv.process(ctx, hctx, msgs[i:i+1], nil)
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
	if !iv.p.st.gate.waitRunnable(ctx) {
		return false
	}
	err := iv.callHandler(hctx, msgs) // a batch: never careful (one message per call then)
	if err == nil {
		done(base, base+len(msgs))
		return true
	}
	if stopping(ctx, hctx) {
		return false
	}
	st.rare().handlerErrors.Add(1)
	iv.p.logger().Debug("batch failed; handling its halves to find the failing message",
		zap.Int64("offset", msgs[0].Offset), zap.Int("messages", len(msgs)), zap.Error(err))
	h := len(msgs) / 2
	return iv.handleJob(ctx, hctx, msgs[:h:h], base, done) && iv.handleJob(ctx, hctx, msgs[h:], base+h, done)
}

// handleOne handles m on the partition's goroutine (OrderPartition with a
// Handler), under the failure policy, and reports as process does. The
// common case, one call that returns nil, is this function alone: careful
// mode, a pause and a failed call go to process.
func (iv *invoker) handleOne(ctx, hctx context.Context, m *kafka.Message) bool {
	p := iv.p
	if iv.br.careful || p.st.gate.paused.Load() {
		return iv.process(ctx, hctx, []kafka.Message{*m}, nil)
	}
	timed, weight := iv.timing(m.Offset)
	var start time.Time
	if timed {
		start = time.Now()
	}
	err := p.env.handle(hctx, *m)
	if timed {
		iv.observe(time.Since(start), weight)
	}
	if err == nil {
		return true
	}
	if stopping(ctx, hctx) {
		return false // see attempt
	}
	return iv.process(ctx, hctx, []kafka.Message{*m}, err)
}

// process handles one message (msgs[0]) under its topic's failure policy:
// calls with backoff, then dead-letter, skip or stop; failed is the error
// of a first call the caller made, nil if it made none. It reports true
// once the message is done (handled, dead-lettered or skipped), false if
// the partition stopped first.
func (iv *invoker) process(ctx, hctx context.Context, msgs []kafka.Message, failed error) bool {
	st, br, pol := iv.p.st, iv.br, iv.policy
	m := &msgs[0]
	if br.careful { // the breaker counts careful (inline) calls only
		br.judge(m.Offset)
		st.rare().unclean.Store(br.crashes)
	}
	if br.poison == m.Offset {
		br.poison = -1
		action := pol.Action
		if action == Retry {
			action = Stop
		}
		reason := fmt.Errorf("crash-loop breaker: %d unclean restarts in a row with %s/%d offset %d in flight",
			br.crashes, iv.p.tp.topic, iv.p.tp.partition, m.Offset)
		iv.p.logger().Error("crash-loop breaker tripped: this message was in flight at every crash; giving it to the failure policy without calling the Handler",
			zap.Int64("offset", m.Offset), zap.Int32("unclean_restarts", br.crashes), zap.Stringer("action", action))
		st.setRetrying(0, reason)
		st.rare().breakerTrips.Add(1)
		if done, ok := iv.giveUp(ctx, m, action, 0, reason); !ok || done {
			return done
		}
	}
	for {
		attempts, err, ok := iv.attempt(ctx, hctx, msgs, failed)
		failed = nil // a retry after a Resume calls again
		if !ok {
			return false
		}
		if err == nil {
			return true
		}
		done, ok := iv.giveUp(ctx, m, pol.Action, attempts, err)
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
// MaxAttempts failed (then it returns the last error); failed, if not nil,
// is the first attempt's error. ok is false if the partition stopped
// first.
func (iv *invoker) attempt(ctx, hctx context.Context, msgs []kafka.Message, failed error) (attempts int, err error, ok bool) {
	st, pol, m := iv.p.st, iv.policy, &msgs[0]
	bo := newBackoff(iv.p.env.cfg.RetryBackoff, iv.p.env.cfg.MaxRetryBackoff)
	for attempts = 1; ; attempts++ {
		switch {
		case attempts == 1 && failed != nil:
			err = failed
		case !st.gate.waitRunnable(ctx):
			return attempts, nil, false
		case iv.br.careful:
			err = iv.carefulCall(hctx, msgs)
		default:
			err = iv.callHandler(hctx, msgs)
		}
		if attempts > 1 {
			st.rare().retries.Add(1)
		}
		if err != nil && stopping(ctx, hctx) {
			// Cancelled because the partition is stopping: not an attempt
			// that counts, and not the partition's error. The message is
			// handled again by the next run.
			return attempts, nil, false
		}
		if err == nil {
			if attempts > 1 {
				st.setState(StateRunning)
				iv.p.logger().Info("handler succeeded after retries", zap.Int64("offset", m.Offset), zap.Int("attempts", attempts))
			}
			return attempts, nil, true
		}
		st.rare().handlerErrors.Add(1)
		st.setRetrying(attempts, err)
		if pol.Action != Retry && attempts >= pol.MaxAttempts {
			iv.p.logger().Warn("handler failed; giving up on the message", zap.Int64("offset", m.Offset),
				zap.Int("attempts", attempts), zap.Stringer("action", pol.Action), zap.Error(err), stackField(err))
			return attempts, err, true
		}
		backoff := bo.next()
		if logWorthy(attempts) {
			f := []zap.Field{zap.Int64("offset", m.Offset), zap.Int("attempt", attempts), zap.Duration("backoff", backoff), zap.Error(err)}
			if attempts == 1 {
				// A panic's stack once per message: the retries repeat it.
				f = append(f, stackField(err))
			}
			iv.p.logger().Warn("handler failed; retrying the same message", f...)
		}
		if ctx.Err() != nil || !sleep(ctx, backoff) {
			return attempts, nil, false
		}
	}
}

// stackField is a panic's stack as a log field, when err is a Handler's
// panic (a *handler.PanicError), and a field that logs nothing otherwise.
func stackField(err error) zap.Field {
	if st := panicStack(err); st != "" {
		return zap.String("panic_stack", st)
	}
	return zap.Skip()
}

// stopping reports whether a failed call may have failed because the
// partition is stopping: its run's context or the Handler's ended. Such a
// failure is never counted against the failure policy.
func stopping(ctx, hctx context.Context) bool { return ctx.Err() != nil || hctx.Err() != nil }

// carefulCall is one Handler call in careful mode (after an unclean end,
// one message per call): the offset in flight is made durable before the
// call and cleared after it, one partition at a time across the Consumer,
// so that a crash during the call leaves the file naming exactly this
// message.
func (iv *invoker) carefulCall(hctx context.Context, msgs []kafka.Message) error {
	br := iv.br
	m := &msgs[0]
	iv.p.env.carefulMu.Lock()
	defer iv.p.env.carefulMu.Unlock()
	iv.setRun(offsetfile.RunState{Open: true, Inflight: m.Offset, Crashes: br.crashes}, true)
	err := iv.callHandler(hctx, msgs)
	if iv.p.abandoned.Load() {
		// The revoke gave up on this call: a newer run may own the
		// partition's run state, which must keep its in-flight offset.
		return err
	}
	br.left--
	if br.left <= 0 || time.Now().After(br.until) {
		br.careful = false
		iv.p.st.setCareful(false)
		if r := iv.p.st.rareP.Load(); r != nil {
			r.unclean.Store(0)
		}
		iv.setRun(offsetfile.RunState{Open: true, Inflight: -1}, false)
		iv.p.logger().Info("careful mode after an unclean end is over", zap.Int64("offset", m.Offset))
	} else {
		iv.setRun(offsetfile.RunState{Open: true, Inflight: -1, Crashes: 0}, true)
	}
	return err
}

// callHandler calls the Handler with msgs[0], or the BatchHandler with
// msgs, timed as timing says.
func (iv *invoker) callHandler(ctx context.Context, msgs []kafka.Message) error {
	timed, weight := iv.timing(msgs[0].Offset)
	var start time.Time
	if timed {
		start = time.Now()
	}
	var err error
	if b := iv.p.env.batch; b != nil {
		err = b.HandleBatch(ctx, msgs)
	} else {
		err = iv.p.env.handle(ctx, msgs[0])
	}
	if timed {
		iv.observe(time.Since(start), weight)
	}
	return err
}

// timing says whether to time the call whose first offset is offset, and
// how many calls it counts for. Once MeasureHandlerLatency was called,
// every call is timed while the partition's calls take slowCall or more,
// where the clock's two reads (about 70 ns) weigh nothing; one call in
// sampleCalls (those whose first offset is a multiple of it), counted
// sampleCalls times, while they are quicker, so that timing no-op work
// does not add a third to its cost. Either way each call counts once in
// the histogram on average.
func (iv *invoker) timing(offset int64) (bool, uint64) {
	switch {
	case !iv.p.env.timeCalls.Load():
		return false, 0
	case iv.p.st.slowCalls.Load():
		return true, 1
	}
	return offset%sampleCalls == 0, sampleCalls
}

// observe counts a timed call of d, weight times, in the partition's
// histogram (its goroutines never contend on another partition's
// counters), and notes whether its calls are slow now.
func (iv *invoker) observe(d time.Duration, weight uint64) {
	st := iv.p.st
	st.histogram().observeN(d, weight)
	if slow := d >= slowCall; slow != st.slowCalls.Load() {
		st.slowCalls.Store(slow)
	}
}

// Handler call timing (timing).
const (
	slowCall    = 100 * time.Microsecond
	sampleCalls = 16
)

// setRun records the partition's run state, and waits for it to be
// durable if sync is set.
func (iv *invoker) setRun(r offsetfile.RunState, sync bool) {
	if err := iv.p.env.store.SetRun(iv.p.key, r); err != nil {
		iv.p.logger().Error("recording the run state failed", zap.Error(err))
		return
	}
	if !sync {
		return
	}
	fctx, cancel := context.WithTimeout(context.Background(), iv.p.env.cfg.Timeout)
	defer cancel()
	if err := iv.p.env.store.Flush(fctx); err != nil {
		iv.p.logger().Warn("flushing the run state failed", zap.Error(err))
	}
}
