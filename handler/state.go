package handler

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// State is one partition's key-value state, as a TxHandler sees it inside
// the run it handles: what the consumer's offset file holds, with the run's
// own changes over it. The run's changes are written with the partition's
// new position in one transaction when HandleTx returns nil, and dropped
// when it returns an error: each message's effect is in the state exactly
// once, whatever crashes.
//
// Keys are 1 to 4,096 bytes, values at most 1 MiB (offsetstore's
// MaxStateKey and MaxStateValue); beyond them Put returns an error. A State
// is used by the goroutine that got it, until HandleTx returns.
type State interface {
	// Get returns key's value, or nil, nil when absent. The value is valid
	// until HandleTx returns and must not be modified.
	Get(key []byte) ([]byte, error)
	// Put sets key to value; both are copied.
	Put(key, value []byte) error
	// Delete removes key; an absent key is not an error.
	Delete(key []byte) error
	// ForEach calls fn with every key and value in key order, the run's
	// changes included, until fn returns an error, which ForEach returns.
	ForEach(fn func(key, value []byte) error) error
}

// A TxHandler applies runs of messages to its partition's State. See
// framework.Config.TxHandler for how runs are made and what a failure does.
type TxHandler interface {
	// HandleTx applies msgs (a contiguous run of one partition, in offset
	// order) to st. The slice is valid until HandleTx returns, as st's
	// values are: the next run reuses its array. A message copied out of
	// it (m := msgs[i]) stays valid, its Key and Value included.
	HandleTx(ctx context.Context, st State, msgs []kafka.Message) error
}

// TxHandlerFunc adapts an ordinary function to a TxHandler.
type TxHandlerFunc func(ctx context.Context, st State, msgs []kafka.Message) error

// HandleTx calls f(ctx, st, msgs).
func (f TxHandlerFunc) HandleTx(ctx context.Context, st State, msgs []kafka.Message) error {
	return f(ctx, st, msgs)
}

var _ TxHandler = TxHandlerFunc(nil)

// TxMiddleware wraps a TxHandler with behaviour of its own (tracing,
// metrics), as Middleware wraps a Handler. A middleware passes st on to
// the next TxHandler: the run's changes are the ones made through it.
type TxMiddleware func(TxHandler) TxHandler

// ChainTx is Chain for a TxHandler: ChainTx(h, a, b) applies a run as
// a(b(h)).
func ChainTx(h TxHandler, mws ...TxMiddleware) TxHandler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
