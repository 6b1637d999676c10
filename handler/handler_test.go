package handler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
)

func TestChainOrder(t *testing.T) {
	var trace []string
	mw := func(name string) handler.Middleware {
		return func(next handler.Handler) handler.Handler {
			return handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
				trace = append(trace, name+">")
				err := next.Handle(ctx, m)
				trace = append(trace, "<"+name)
				return err
			})
		}
	}
	h := handler.Chain(handler.HandlerFunc(func(context.Context, kafka.Message) error {
		trace = append(trace, "h")
		return nil
	}), mw("a"), mw("b"))
	if err := h.Handle(context.Background(), kafka.Message{}); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(trace, " "), "a> b> h <b <a"; got != want {
		t.Fatalf("trace = %q, want %q", got, want)
	}
}

func TestChainNone(t *testing.T) {
	called := false
	h := handler.Chain(handler.HandlerFunc(func(context.Context, kafka.Message) error { called = true; return nil }))
	_ = h.Handle(context.Background(), kafka.Message{})
	if !called {
		t.Fatal("handler not called")
	}
}

func TestRecover(t *testing.T) {
	h := handler.Recover(handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		if m.Offset == 7 {
			panic(io.ErrUnexpectedEOF)
		}
		if m.Offset == 8 {
			panic("boom")
		}
		return nil
	}))
	if err := h.Handle(context.Background(), kafka.Message{Offset: 1}); err != nil {
		t.Fatalf("no panic: err = %v", err)
	}
	err := h.Handle(context.Background(), kafka.Message{Topic: "orders", Partition: 3, Offset: 7})
	var pe *handler.PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want *PanicError", err)
	}
	if pe.Topic != "orders" || pe.Partition != 3 || pe.Offset != 7 || len(pe.Stack) == 0 {
		t.Fatalf("PanicError = %+v", pe)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("errors.Is(err, panic value) = false for %v", err)
	}
	if want := "handler panicked on orders/3 at offset 7"; !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %q, want it to contain %q", err, want)
	}
	err = h.Handle(context.Background(), kafka.Message{Offset: 8})
	if !errors.As(err, &pe) || pe.Unwrap() != nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("string panic: err = %v", err)
	}
}

func ExampleChain() {
	logging := func(next handler.Handler) handler.Handler {
		return handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			err := next.Handle(ctx, m)
			fmt.Printf("%s/%d@%d err=%v\n", m.Topic, m.Partition, m.Offset, err)
			return err
		})
	}
	h := handler.Chain(handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		if string(m.Value) == "bad" {
			panic("cannot parse")
		}
		return nil
	}), logging, handler.Recover)

	_ = h.Handle(context.Background(), kafka.Message{Topic: "orders", Partition: 0, Offset: 41, Value: []byte("ok")})
	_ = h.Handle(context.Background(), kafka.Message{Topic: "orders", Partition: 0, Offset: 42, Value: []byte("bad")})
	// Output:
	// orders/0@41 err=<nil>
	// orders/0@42 err=handler panicked on orders/0 at offset 42: cannot parse
}

// TestChainBatchAndTx: ChainBatch and ChainTx wrap with the first
// middleware outermost, as Chain does, and a TxMiddleware hands the
// wrapped TxHandler the run's own State and messages.
func TestChainBatchAndTx(t *testing.T) {
	var trace []string
	bmw := func(name string) handler.BatchMiddleware {
		return func(next handler.BatchHandler) handler.BatchHandler {
			return handler.BatchHandlerFunc(func(ctx context.Context, ms []kafka.Message) error {
				trace = append(trace, name+">")
				err := next.HandleBatch(ctx, ms)
				trace = append(trace, "<"+name)
				return err
			})
		}
	}
	bh := handler.ChainBatch(handler.BatchHandlerFunc(func(context.Context, []kafka.Message) error {
		trace = append(trace, "h")
		return nil
	}), bmw("a"), bmw("b"))
	if err := bh.HandleBatch(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(trace, " "), "a> b> h <b <a"; got != want {
		t.Fatalf("batch: trace = %q, want %q", got, want)
	}

	trace = nil
	txmw := func(name string) handler.TxMiddleware {
		return func(next handler.TxHandler) handler.TxHandler {
			return handler.TxHandlerFunc(func(ctx context.Context, st handler.State, ms []kafka.Message) error {
				trace = append(trace, name+">")
				err := next.HandleTx(ctx, st, ms)
				trace = append(trace, "<"+name)
				return err
			})
		}
	}
	st := &mapState{}
	msgs := []kafka.Message{{Offset: 4}, {Offset: 5}}
	fail := errors.New("refused")
	th := handler.ChainTx(handler.TxHandlerFunc(func(_ context.Context, got handler.State, ms []kafka.Message) error {
		trace = append(trace, "h")
		if got != st || len(ms) != 2 || ms[0].Offset != 4 {
			t.Errorf("the TxHandler got state %p and %d messages, want %p and the run's 2", got, len(ms), st)
		}
		return fail
	}), txmw("a"), txmw("b"))
	if err := th.HandleTx(context.Background(), st, msgs); err != fail {
		t.Fatalf("HandleTx = %v, want the TxHandler's %v through the middlewares", err, fail)
	}
	if got, want := strings.Join(trace, " "), "a> b> h <b <a"; got != want {
		t.Fatalf("tx: trace = %q, want %q", got, want)
	}
	trace = nil
	if err := handler.ChainTx(th).HandleTx(context.Background(), st, msgs); err != fail || len(trace) != 5 {
		t.Errorf("ChainTx without middlewares: %v after %q, want the TxHandler's %v after its 5 steps", err, trace, fail)
	}
}

// mapState is a handler.State that is never read: the chain test only
// checks that it is passed on.
type mapState struct{ handler.State }
