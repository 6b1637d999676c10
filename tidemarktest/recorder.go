package tidemarktest

import (
	"context"
	"sync"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
)

// A Recorder is a Handler (and a BatchHandler) that records each message
// handled: each one its next handler returned nil for, in the order the
// calls returned. Check compares the record with what was produced.
//
// The zero Recorder records every message and handles it by doing nothing
// more. It is safe for concurrent use, as a Handler must be.
type Recorder struct {
	next      handler.Handler
	nextBatch handler.BatchHandler

	mu      sync.Mutex
	handled []kafka.Message
	calls   int
}

var (
	_ handler.Handler      = (*Recorder)(nil)
	_ handler.BatchHandler = (*Recorder)(nil)
)

// NewRecorder returns a Recorder in front of next, the handler under
// test; nil records only.
func NewRecorder(next handler.Handler) *Recorder { return &Recorder{next: next} }

// NewBatchRecorder is NewRecorder for a BatchHandler: a batch is recorded,
// in order, when next returns nil for it.
func NewBatchRecorder(next handler.BatchHandler) *Recorder { return &Recorder{nextBatch: next} }

// Middleware records what the handler it wraps handles, for a test that
// builds its handler with handler.Chain: Chain(h, rec.Middleware). The
// Recorder's own next handler is not called then.
func (r *Recorder) Middleware(next handler.Handler) handler.Handler {
	return handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		err := next.Handle(ctx, m)
		r.record(err, m)
		return err
	})
}

// Handle calls the next handler, and records m if it returned nil.
func (r *Recorder) Handle(ctx context.Context, m kafka.Message) error {
	var err error
	switch {
	case r.next != nil:
		err = r.next.Handle(ctx, m)
	case r.nextBatch != nil:
		err = r.nextBatch.HandleBatch(ctx, []kafka.Message{m})
	}
	r.record(err, m)
	return err
}

// HandleBatch calls the next handler with msgs (or, for a Recorder of a
// Handler, each message in turn until one fails), and records those it
// handled.
func (r *Recorder) HandleBatch(ctx context.Context, msgs []kafka.Message) error {
	if r.nextBatch != nil {
		err := r.nextBatch.HandleBatch(ctx, msgs)
		r.record(err, msgs...)
		return err
	}
	for _, m := range msgs {
		if err := r.Handle(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// record counts a call and, if it returned nil, keeps its messages.
func (r *Recorder) record(err error, msgs ...kafka.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if err == nil {
		r.handled = append(r.handled, msgs...)
	}
}

// Count returns the number of messages handled, a message handled twice
// counted twice.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.handled)
}

// Calls returns the number of calls recorded, failed ones included.
func (r *Recorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Handled returns the messages handled, in the order their calls
// returned. The slice is a copy; the messages' bytes are those the
// consumer handed over.
func (r *Recorder) Handled() []kafka.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kafka.Message(nil), r.handled...)
}

// Reset forgets what was recorded, for a test that checks in steps.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handled, r.calls = nil, 0
}
