// Package handler defines the contract between tidemark and user code: a
// Handler processes one Kafka message, shaped like net/http's Handler; a
// BatchHandler processes a run of them in one call.
//
// # The contract
//
// The order of calls within a partition is the consumer's choice
// (framework.Config.Ordering):
//
//   - OrderPartition (the default): calls are sequential within a partition:
//     Handle is called with offsets in increasing order, and the next call
//     starts only after the previous one returned: with nil, or with an
//     error on which the failure policy gave up (Skip and DeadLetter move on
//     to the next message without the previous one ever returning nil; Stop
//     and the default Retry never do).
//   - OrderKey: messages with the same key are handled the same way, in
//     offset order, one call at a time; messages with different keys are
//     handled concurrently, up to MaxInFlight calls per partition. A message
//     without a key (nil) is ordered with nothing: it may run concurrently
//     with any other.
//   - OrderNone: any message of the partition may be handled concurrently
//     with any other, up to MaxInFlight calls per partition, in no
//     particular order.
//
// With Skip or DeadLetter, a message handled does not mean every message
// before it (of its partition or key) was handled. Calls for different
// partitions always run concurrently, so a Handler must be safe for
// concurrent use.
//
// A BatchHandler gets a run of messages in one call, in offset order: with
// OrderPartition and OrderNone, consecutive messages of one partition; with
// OrderKey, consecutive messages of one key (of one partition). Returning nil
// marks every message of the batch done. When it returns an error, tidemark
// finds the failing message by calling it again with halves of the batch,
// down to single messages, each in order; the failure policy then acts on
// that message alone, exactly as for a Handler.
//
// The Handler owns msg: its Key, Value and Headers are not reused by tidemark
// after Handle returns, so they may be retained without copying. They slice
// into the fetched bytes (up to 1 MiB, shared with other partitions'
// messages, or more for a partition's part larger than that), which stay
// in memory while any of them is kept: copy the bytes kept for long. A TxHandler's slice is the
// exception: its array is reused by the next run once HandleTx returned,
// while the messages copied out of it are the TxHandler's as above.
//
// The ctx passed to Handle is cancelled when the partition is revoked (a
// rebalance) or the consumer shuts down, after the consumer's DrainTimeout
// has passed. A Handler that observes ctx.Done() should stop promptly and
// return ctx.Err(): the message is then not marked done and will be handled
// again by whichever consumer owns the partition next. Work that a Handler
// completed before returning an error may therefore be repeated; idempotent
// handlers are the only way to make a hand-off invisible.
//
// Returning nil marks the message done: its offset becomes eligible for the
// local offset file and, from there, for the commit to Kafka. Returning an
// error means "not done": tidemark retries the same message with capped
// exponential backoff; by default it never moves past it, while a failure
// policy of the framework package may give up on it (skip it, or write it
// to a dead-letter topic) after its attempts and go on with the next. A panic in a Handler is not recovered unless the Recover
// middleware is installed; the framework installs it by default, turning the
// panic into an error that is retried like any other.
package handler

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/segmentio/kafka-go"
)

// A Handler processes one message. See the package documentation for the
// contract.
type Handler interface {
	Handle(ctx context.Context, msg kafka.Message) error
}

// A BatchHandler processes a run of messages of one partition in one call.
// See the package documentation for the contract. The slice and its
// messages are the BatchHandler's, as for Handler.
type BatchHandler interface {
	HandleBatch(ctx context.Context, msgs []kafka.Message) error
}

// BatchHandlerFunc adapts an ordinary function to a BatchHandler.
type BatchHandlerFunc func(ctx context.Context, msgs []kafka.Message) error

// HandleBatch calls f(ctx, msgs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, msgs []kafka.Message) error {
	return f(ctx, msgs)
}

var _ BatchHandler = BatchHandlerFunc(nil)

// HandlerFunc adapts an ordinary function to a Handler.
type HandlerFunc func(ctx context.Context, msg kafka.Message) error

// Handle calls f(ctx, msg).
func (f HandlerFunc) Handle(ctx context.Context, msg kafka.Message) error { return f(ctx, msg) }

var _ Handler = HandlerFunc(nil)

// Middleware wraps a Handler with behaviour of its own, like logging,
// metrics or panic recovery.
type Middleware func(Handler) Handler

// Chain wraps h with the middlewares so that the first one is the outermost:
// Chain(h, a, b) handles a message as a(b(h)).
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// BatchMiddleware wraps a BatchHandler, as Middleware wraps a Handler.
type BatchMiddleware func(BatchHandler) BatchHandler

// ChainBatch is Chain for a BatchHandler: ChainBatch(h, a, b) handles a
// batch as a(b(h)).
func ChainBatch(h BatchHandler, mws ...BatchMiddleware) BatchHandler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// PanicError is the error Recover returns when a Handler panics. It names
// the message that caused the panic: for a BatchHandler, the batch's first
// message, and Messages is the batch's length.
type PanicError struct {
	Topic     string
	Partition int
	Offset    int64
	Messages  int    // messages in the call: 1 for a Handler
	Value     any    // the value passed to panic
	Stack     []byte // the goroutine's stack at the panic
}

func (e *PanicError) Error() string {
	if e.Messages > 1 {
		return fmt.Sprintf("handler panicked on a batch of %d messages of %s/%d from offset %d: %v", e.Messages, e.Topic, e.Partition, e.Offset, e.Value)
	}
	return fmt.Sprintf("handler panicked on %s/%d at offset %d: %v", e.Topic, e.Partition, e.Offset, e.Value)
}

// Unwrap returns the panic value if it is an error, so that errors.Is and
// errors.As see through the panic.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// Recover is a Middleware that turns a panic in the wrapped Handler into a
// *PanicError carrying the topic, partition, offset and stack. The process
// lives on and the message is retried like any other failure.
func Recover(next Handler) Handler {
	// A HandlerFunc is called as the func it is: one call and one copy of
	// the message fewer per message.
	f, ok := next.(HandlerFunc)
	if !ok {
		f = next.Handle
	}
	return HandlerFunc(func(ctx context.Context, msg kafka.Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = &PanicError{
					Topic:     msg.Topic,
					Partition: msg.Partition,
					Offset:    msg.Offset,
					Messages:  1,
					Value:     v,
					Stack:     debug.Stack(),
				}
			}
		}()
		return f(ctx, msg)
	})
}

// RecoverBatch is Recover for a BatchHandler: a panic becomes a *PanicError
// naming the batch's first message and its length.
func RecoverBatch(next BatchHandler) BatchHandler {
	return BatchHandlerFunc(func(ctx context.Context, msgs []kafka.Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				pe := &PanicError{Messages: len(msgs), Value: v, Stack: debug.Stack()}
				if len(msgs) > 0 {
					pe.Topic, pe.Partition, pe.Offset = msgs[0].Topic, msgs[0].Partition, msgs[0].Offset
				}
				err = pe
			}
		}()
		return next.HandleBatch(ctx, msgs)
	})
}
