package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
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

// invoker calls the Handler for one partition under its topic's failure
// policy and its crash-loop breaker (invoke.go), and gives up on a message
// as the policy says (giveUp). It is the partition's (partition.iv), used
// by the goroutine that runs a job: the partition's, or one of its
// dispatcher's workers; the breaker only in careful mode, when every call
// runs on the partition's goroutine.
type invoker struct {
	p      *partition
	policy FailurePolicy
	br     *breaker
}

// breaker is a partition's crash-loop breaker state for one run.
type breaker struct {
	// careful is set after an unclean end, for a bounded window.
	careful bool
	left    int       // careful messages left
	until   time.Time // careful mode ends at this time, or after left messages
	prev    offsetfile.RunState
	first   bool  // no message dispatched yet in this run
	offset  int64 // the offset whose crash count is crashes
	crashes int32
	poison  int64 // offset to give up on without a Handler call; -1 none
	limit   int
}

// cleanStart is the breaker of every run after a clean end (or none):
// only careful mode writes a breaker (judge, carefulCall), so these runs
// share one that nothing writes, rather than 112 bytes each.
var cleanStart = &breaker{offset: -1, poison: -1, prev: offsetfile.RunState{Inflight: -1}}

// newBreaker returns the breaker of a run whose previous run ended as prev
// says (nil: none recorded); limit is Config.CrashLoopRestarts.
func newBreaker(prev *offsetfile.RunState, limit int) *breaker {
	if prev == nil || !prev.Open {
		return cleanStart
	}
	return &breaker{careful: true, first: true, offset: -1, poison: -1, limit: limit, prev: *prev}
}

// judge decides, for the message at offset about to be handled, its
// crash count and whether the breaker trips on it.
func (b *breaker) judge(offset int64) {
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

// giveUp applies action to a message the Handler failed on. done reports
// that the message is done (dead-lettered or skipped); with Stop, it
// returns done=false once the partition is resumed. ok is false if the
// partition stopped first.
func (iv *invoker) giveUp(ctx context.Context, m *kafka.Message, action FailureAction, attempts int, cause error) (done, ok bool) {
	st := iv.p.st
	if ctx.Err() != nil {
		// A stop came first: the message is neither dead-lettered nor
		// skipped, and the next run handles it.
		return false, false
	}
	switch action {
	case DeadLetter:
		where, ok := iv.p.env.deadLetters.write(ctx, iv, m, attempts, cause)
		if !ok {
			return false, false
		}
		iv.recordFailure(offsetfile.Failure{Offset: m.Offset, Action: offsetfile.FailureDeadLetter,
			Attempts: int32(attempts), Reason: cause.Error(), DeadLetter: where})
		st.rare().deadLettered.Add(1)
		st.setState(StateRunning)
		iv.p.logger().Warn("message dead-lettered", zap.Int64("offset", m.Offset), zap.String("dead_letter", where),
			zap.Int("attempts", attempts), zap.Error(cause))
		return true, true
	case Skip:
		iv.recordFailure(offsetfile.Failure{Offset: m.Offset, Action: offsetfile.FailureSkip,
			Attempts: int32(attempts), Reason: cause.Error()})
		st.rare().skipped.Add(1)
		st.setState(StateRunning)
		iv.p.logger().Warn("message skipped by the failure policy; recorded in the offset file", zap.Int64("offset", m.Offset),
			zap.Int("attempts", attempts), zap.Error(cause))
		return true, true
	default: // Stop, and Retry when the breaker tripped
		st.setError(fmt.Errorf("stopped at offset %d after %d attempts: %w", m.Offset, attempts, cause))
		since := st.gate.stop()
		iv.p.logger().Error("message stopped by the failure policy (it holds its partition, or with OrderKey its key); call Consumer.Resume to try it again",
			zap.Int64("offset", m.Offset), zap.Int("attempts", attempts), zap.Error(cause))
		if !st.gate.waitResumed(ctx, since) {
			return false, false
		}
		iv.p.logger().Info("partition resumed; trying the message again", zap.Int64("offset", m.Offset))
		return false, true
	}
}

func (iv *invoker) recordFailure(f offsetfile.Failure) {
	if err := iv.p.env.store.RecordFailure(iv.p.key, f); err != nil {
		iv.p.logger().Error("recording the failure in the offset file failed", zap.Int64("offset", f.Offset), zap.Error(err))
	}
}
