// Package handler defines the contract between tidemark and user code: a
// Handler processes one Kafka message, shaped like net/http's Handler.
//
// # The contract
//
// Calls are sequential within a partition: for one topic-partition, Handle
// is called with offsets in increasing order, and the next call starts only
// after the previous one returned: with nil, or with an error on which the
// failure policy gave up (Skip and DeadLetter move on to the next message
// without the previous one ever returning nil; Stop and the default Retry
// never do). So with Skip or DeadLetter, a message handled does not mean
// every message before it was handled. Calls for different partitions run
// concurrently, each on the goroutine tidemark started for that partition, so
// a Handler shared by all partitions must be safe for concurrent use.
//
// The Handler owns msg: its Key, Value and Headers are not reused by tidemark
// after Handle returns, so they may be retained without copying. They slice
// into the fetched response, which stays in memory while any of them is
// kept: copy the bytes kept for long.
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

// PanicError is the error Recover returns when a Handler panics. It names
// the message that caused the panic.
type PanicError struct {
	Topic     string
	Partition int
	Offset    int64
	Value     any    // the value passed to panic
	Stack     []byte // the goroutine's stack at the panic
}

func (e *PanicError) Error() string {
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
	return HandlerFunc(func(ctx context.Context, msg kafka.Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = &PanicError{
					Topic:     msg.Topic,
					Partition: msg.Partition,
					Offset:    msg.Offset,
					Value:     v,
					Stack:     debug.Stack(),
				}
			}
		}()
		return next.Handle(ctx, msg)
	})
}
