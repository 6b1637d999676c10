package tidemarkotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/plugin/tidemarkotel"
)

// recorder is a tracer provider whose spans are kept in memory, exported
// as each ends.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// produced returns the headers a traced producer writes (traceparent, and
// tracestate when the span has one) and the producer span's context.
func produced(t *testing.T, state string) ([]kafka.Header, trace.SpanContext) {
	t.Helper()
	tp, _ := recorder(t)
	ctx := context.Background()
	if state != "" {
		ts, err := trace.ParseTraceState(state)
		if err != nil {
			t.Fatal(err)
		}
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceState: ts}))
	}
	ctx, span := tp.Tracer("producer").Start(ctx, "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	var hs []kafka.Header
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range carrier {
			if !yield(k) {
				return
			}
		}
	}) {
		hs = append(hs, kafka.Header{Key: k, Value: []byte(carrier[k])})
	}
	return hs, span.SpanContext()
}

// attrs is a span's attributes by key.
func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// checkAttrs fails the test unless got holds exactly want.
func checkAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]any) {
	t.Helper()
	m := attrs(got)
	for k, w := range want {
		v, ok := m[k]
		if !ok {
			t.Errorf("%s: no attribute %s, want %v", what, k, w)
			continue
		}
		if fmt.Sprint(v.AsInterface()) != fmt.Sprint(w) {
			t.Errorf("%s: %s = %v (%s), want %v", what, k, v.AsInterface(), v.Type(), w)
		}
		if _, isStr := w.(string); isStr != (v.Type() == attribute.STRING) {
			t.Errorf("%s: %s is of type %s, want %T", what, k, v.Type(), w)
		}
	}
	for k, v := range m {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected attribute %s = %v", what, k, v.AsInterface())
		}
	}
}

func message(headers []kafka.Header) kafka.Message {
	return kafka.Message{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("customer-7"), Value: []byte("hello"), Headers: headers}
}

// TestProcessSpan: one Handler call, one span: kind CONSUMER, named
// "process orders", the conventions' attributes, started before the call
// and ended after it, linked to the producer's span and not its child,
// carried by the Handler's ctx.
func TestProcessSpan(t *testing.T) {
	t.Setenv(tidemarkotel.EnvStabilityOptIn, "")
	tp, exp := recorder(t)
	headers, producer := produced(t, "vendor=abc")
	var inCall trace.SpanContext
	var calledAt time.Time
	before := time.Now()
	h := handler.Chain(handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		calledAt = time.Now()
		inCall = trace.SpanContextFromContext(ctx)
		if len(exp.GetSpans()) != 0 {
			t.Error("a span ended before the call returned")
		}
		return nil
	}), tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup("billing"),
		tidemarkotel.WithClientID("tidemark")))
	if err := h.Handle(context.Background(), message(headers)); err != nil {
		t.Fatal(err)
	}
	after := time.Now()

	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans for one call, want 1", len(spans))
	}
	s := spans[0]
	if s.Name != "process orders" || s.SpanKind != trace.SpanKindConsumer {
		t.Errorf("span %q of kind %s, want \"process orders\" of kind consumer", s.Name, s.SpanKind)
	}
	if s.InstrumentationScope.Name != tidemarkotel.ScopeName {
		t.Errorf("scope %q, want %q", s.InstrumentationScope.Name, tidemarkotel.ScopeName)
	}
	checkAttrs(t, "process span", s.Attributes, map[attribute.Key]any{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "process",
		"messaging.operation.type":           "process",
		"messaging.destination.name":         "orders",
		"messaging.destination.partition.id": "3",
		"messaging.consumer.group.name":      "billing",
		"messaging.client.id":                "tidemark",
		"messaging.kafka.offset":             int64(42),
		"messaging.kafka.message.key":        "customer-7",
		"messaging.message.body.size":        int64(5),
	})
	if s.Status.Code != codes.Unset {
		t.Errorf("status %v, want unset", s.Status)
	}
	if s.Parent.IsValid() {
		t.Errorf("parent %s, want none: the producer is a link by default", s.Parent.SpanID())
	}
	if s.SpanContext.TraceID() == producer.TraceID() {
		t.Error("the process span is in the producer's trace, want a trace of its own")
	}
	if len(s.Links) != 1 || !s.Links[0].SpanContext.Equal(producer.WithRemote(true)) {
		t.Fatalf("links %+v, want one to the producer's span %s", s.Links, producer.SpanID())
	}
	if got := s.Links[0].SpanContext.TraceState().Get("vendor"); got != "abc" {
		t.Errorf("the link's tracestate vendor=%q, want abc from the tracestate header", got)
	}
	if !inCall.Equal(s.SpanContext) {
		t.Errorf("the Handler's ctx carries span %s, want the process span %s", inCall.SpanID(), s.SpanContext.SpanID())
	}
	if s.StartTime.Before(before) || s.StartTime.After(calledAt) || s.EndTime.Before(calledAt) || s.EndTime.After(after) {
		t.Errorf("span from %s to %s, the call at %s (test from %s to %s)", s.StartTime, s.EndTime, calledAt, before, after)
	}
}

// TestProducerAsParent: with WithProducerAsParent the process span is the
// child of the producer's span, in its trace, and still links to it.
func TestProducerAsParent(t *testing.T) {
	tp, exp := recorder(t)
	headers, producer := produced(t, "")
	h := tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithProducerAsParent())(
		handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
	if err := h.Handle(context.Background(), message(headers)); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if !s.Parent.IsValid() || s.Parent.SpanID() != producer.SpanID() || s.SpanContext.TraceID() != producer.TraceID() {
		t.Errorf("parent %s in trace %s, want the producer's span %s in trace %s",
			s.Parent.SpanID(), s.SpanContext.TraceID(), producer.SpanID(), producer.TraceID())
	}
	if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != producer.SpanID() {
		t.Errorf("links %+v, want one to the producer", s.Links)
	}
}

// TestNoProducerContext: a message without trace headers, or with a
// malformed traceparent, gets a span with no parent and no link; a span
// already in the Handler's ctx is the parent and never taken for the
// producer's.
func TestNoProducerContext(t *testing.T) {
	tp, exp := recorder(t)
	outer, outerSpan := tp.Tracer("test").Start(context.Background(), "outer")
	defer outerSpan.End()
	h := tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithProducerAsParent())(
		handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
	for _, hs := range [][]kafka.Header{nil, {{Key: "traceparent", Value: []byte("00-not-a-trace-01")}}} {
		if err := h.Handle(context.Background(), message(hs)); err != nil {
			t.Fatal(err)
		}
		if err := h.Handle(outer, message(hs)); err != nil {
			t.Fatal(err)
		}
	}
	spans := exp.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("%d spans for 4 calls, want 4", len(spans))
	}
	for i, s := range spans {
		if len(s.Links) != 0 {
			t.Errorf("span %d: links %+v, want none", i, s.Links)
		}
		wantParent := i%2 == 1
		if s.Parent.IsValid() != wantParent || wantParent && s.Parent.SpanID() != outerSpan.SpanContext().SpanID() {
			t.Errorf("span %d: parent %s, want the outer span: %v", i, s.Parent.SpanID(), wantParent)
		}
	}
}

type codedError struct{ code string }

func (e codedError) Error() string     { return "refused: " + e.code }
func (e codedError) ErrorType() string { return e.code }

// TestProcessSpanError: a call that returns an error has an Error status
// with the message and error.type naming the error's kind; a panic that
// the framework's Recover catches outside is *handler.PanicError.
func TestProcessSpanError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errors.New("boom"), "*errors.errorString"},
		{fmt.Errorf("saving: %w", codedError{"DB_LOCKED"}), "DB_LOCKED"},
		{fmt.Errorf("saving: %w", context.Canceled), "context.Canceled"},
		{context.DeadlineExceeded, "context.DeadlineExceeded"},
		{&handler.PanicError{Value: "x"}, "*handler.PanicError"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			tp, exp := recorder(t)
			h := tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp))(
				handler.HandlerFunc(func(context.Context, kafka.Message) error { return tc.err }))
			if err := h.Handle(context.Background(), message(nil)); err != tc.err {
				t.Fatalf("the middleware returned %v, want the Handler's %v", err, tc.err)
			}
			s := exp.GetSpans()[0]
			if s.Status.Code != codes.Error || s.Status.Description != tc.err.Error() {
				t.Errorf("status %v, want Error %q", s.Status, tc.err.Error())
			}
			if got := attrs(s.Attributes)["error.type"].AsString(); got != tc.want {
				t.Errorf("error.type %q, want %q", got, tc.want)
			}
		})
	}

	t.Run("panic", func(t *testing.T) {
		tp, exp := recorder(t)
		h := handler.Recover(tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp))(
			handler.HandlerFunc(func(context.Context, kafka.Message) error { panic("bad message") })))
		err := h.Handle(context.Background(), message(nil))
		var pe *handler.PanicError
		if !errors.As(err, &pe) || !strings.Contains(string(pe.Stack), "TestProcessSpanError") {
			t.Fatalf("Recover returned %v, want a *handler.PanicError whose stack names the panicking function", err)
		}
		spans := exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%d spans, want 1 ended despite the panic", len(spans))
		}
		if got := attrs(spans[0].Attributes)["error.type"].AsString(); got != "*handler.PanicError" || spans[0].Status.Code != codes.Error {
			t.Errorf("error.type %q, status %v; want *handler.PanicError, Error", got, spans[0].Status)
		}
	})
}

// TestMessageKey: a null key is left out, a key that is not UTF-8 too
// unless a formatter gives it a form; a null value is a tombstone.
func TestMessageKey(t *testing.T) {
	tp, exp := recorder(t)
	ok := handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })
	plain := tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp))(ok)
	hex := tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp),
		tidemarkotel.WithKeyFormatter(func(k []byte) (string, bool) { return fmt.Sprintf("%x", k), true }))(ok)
	binary := []byte{0xff, 0x00}
	for _, c := range []struct {
		h          handler.Handler
		key, value []byte
	}{{plain, nil, nil}, {plain, binary, []byte{}}, {hex, binary, []byte("v")}} {
		m := message(nil)
		m.Key, m.Value = c.key, c.value
		if err := c.h.Handle(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	spans := exp.GetSpans()
	a0, a1, a2 := attrs(spans[0].Attributes), attrs(spans[1].Attributes), attrs(spans[2].Attributes)
	if _, has := a0["messaging.kafka.message.key"]; has || !a0["messaging.kafka.message.tombstone"].AsBool() {
		t.Errorf("null key and value: key %v, tombstone %v; want no key, a tombstone", a0["messaging.kafka.message.key"], a0["messaging.kafka.message.tombstone"])
	}
	if _, has := a1["messaging.kafka.message.key"]; has {
		t.Errorf("a binary key became %v, want none", a1["messaging.kafka.message.key"].AsString())
	}
	if _, has := a1["messaging.kafka.message.tombstone"]; has {
		t.Error("an empty value is a tombstone, want only a null one")
	}
	if got := a2["messaging.kafka.message.key"].AsString(); got != "ff00" {
		t.Errorf("formatted key %q, want ff00", got)
	}
}

// TestBatchSpan: one span per HandleBatch call, linking each message that
// carries a producer context (the link names its offset), with the batch's
// size; the failing halves of a batch are calls of their own.
func TestBatchSpan(t *testing.T) {
	tp, exp := recorder(t)
	h0, p0 := produced(t, "")
	h2, p2 := produced(t, "")
	msgs := []kafka.Message{message(h0), message(nil), message(h2)}
	for i := range msgs {
		msgs[i].Offset = int64(10 + i)
	}
	var inCall trace.SpanContext
	bh := tidemarkotel.BatchMiddleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup("billing"),
		tidemarkotel.WithProducerAsParent())(handler.BatchHandlerFunc(func(ctx context.Context, ms []kafka.Message) error {
		inCall = trace.SpanContextFromContext(ctx)
		return nil
	}))
	if err := bh.HandleBatch(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans for one batch call, want 1", len(spans))
	}
	s := spans[0]
	if s.Name != "process orders" || s.SpanKind != trace.SpanKindConsumer || s.Parent.IsValid() || !inCall.Equal(s.SpanContext) {
		t.Errorf("batch span %q kind %s parent %s, in the call %s; want \"process orders\", consumer, no parent, the call's",
			s.Name, s.SpanKind, s.Parent.SpanID(), inCall.SpanID())
	}
	checkAttrs(t, "batch span", s.Attributes, map[attribute.Key]any{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "process",
		"messaging.operation.type":           "process",
		"messaging.destination.name":         "orders",
		"messaging.destination.partition.id": "3",
		"messaging.consumer.group.name":      "billing",
		"messaging.batch.message_count":      int64(3),
	})
	if len(s.Links) != 2 {
		t.Fatalf("%d links, want 2 (the message without headers has none)", len(s.Links))
	}
	for i, want := range []struct {
		sc  trace.SpanContext
		off int64
	}{{p0, 10}, {p2, 12}} {
		l := s.Links[i]
		if l.SpanContext.SpanID() != want.sc.SpanID() || attrs(l.Attributes)["messaging.kafka.offset"].AsInt64() != want.off {
			t.Errorf("link %d: span %s offset %v, want %s at offset %d", i, l.SpanContext.SpanID(),
				attrs(l.Attributes)["messaging.kafka.offset"].AsInterface(), want.sc.SpanID(), want.off)
		}
	}
}

// TestTxSpan: one span per HandleTx call, as a batch's: kind CONSUMER,
// "process {topic}", messaging.batch.message_count, a link per traced
// message with its offset, never the producer as parent; the TxHandler
// gets the run's State and a ctx carrying the span; a failed run's span
// has an Error status and error.type, and the error goes back unchanged.
func TestTxSpan(t *testing.T) {
	t.Setenv(tidemarkotel.EnvStabilityOptIn, "")
	tp, exp := recorder(t)
	h0, p0 := produced(t, "")
	h1, p1 := produced(t, "")
	msgs := []kafka.Message{message(h0), message(h1), message(nil), message(nil)}
	for i := range msgs {
		msgs[i].Offset = int64(20 + i)
	}
	st := &txState{}
	fail := fmt.Errorf("applying: %w", codedError{"BAD_ORDER"})
	var inCall []trace.SpanContext
	var gotState handler.State
	th := handler.ChainTx(handler.TxHandlerFunc(func(ctx context.Context, s handler.State, ms []kafka.Message) error {
		if len(exp.GetSpans()) != len(inCall) {
			t.Error("a span ended before HandleTx returned")
		}
		inCall, gotState = append(inCall, trace.SpanContextFromContext(ctx)), s
		if len(ms) == 1 {
			return fail
		}
		return nil
	}), tidemarkotel.TxMiddleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup("billing"),
		tidemarkotel.WithClientID("tidemark"), tidemarkotel.WithProducerAsParent()))
	if err := th.HandleTx(context.Background(), st, msgs); err != nil {
		t.Fatal(err)
	}
	if gotState != st {
		t.Errorf("HandleTx got state %v, want the run's %v", gotState, st)
	}
	if err := th.HandleTx(context.Background(), st, msgs[:1]); err != fail {
		t.Fatalf("a failed run returned %v through the middleware, want %v", err, fail)
	}
	if err := th.HandleTx(context.Background(), st, nil); err != nil {
		t.Fatalf("an empty run: %v", err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans for two runs (and an empty call), want 2", len(spans))
	}
	s := spans[0]
	if s.Name != "process orders" || s.SpanKind != trace.SpanKindConsumer || s.Parent.IsValid() || !inCall[0].Equal(s.SpanContext) {
		t.Errorf("run span %q kind %s parent %s, in the call %s; want \"process orders\", consumer, no parent, the call's",
			s.Name, s.SpanKind, s.Parent.SpanID(), inCall[0].SpanID())
	}
	checkAttrs(t, "run span", s.Attributes, map[attribute.Key]any{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "process",
		"messaging.operation.type":           "process",
		"messaging.destination.name":         "orders",
		"messaging.destination.partition.id": "3",
		"messaging.consumer.group.name":      "billing",
		"messaging.client.id":                "tidemark",
		"messaging.batch.message_count":      int64(4),
	})
	if s.Status.Code != codes.Unset {
		t.Errorf("status %v, want unset", s.Status)
	}
	if len(s.Links) != 2 {
		t.Fatalf("%d links, want 2 (two messages carry no context)", len(s.Links))
	}
	for i, want := range []struct {
		sc  trace.SpanContext
		off int64
	}{{p0, 20}, {p1, 21}} {
		l := s.Links[i]
		if l.SpanContext.SpanID() != want.sc.SpanID() || attrs(l.Attributes)["messaging.kafka.offset"].AsInt64() != want.off {
			t.Errorf("link %d: span %s offset %v, want %s at offset %d", i, l.SpanContext.SpanID(),
				attrs(l.Attributes)["messaging.kafka.offset"].AsInterface(), want.sc.SpanID(), want.off)
		}
	}
	f := spans[1]
	fa := attrs(f.Attributes)
	if len(inCall) != 3 || !inCall[1].Equal(f.SpanContext) || inCall[2].IsValid() {
		t.Errorf("the runs' ctx carried spans %v, want the failing run's span %s second, none for the empty call", inCall, f.SpanContext.SpanID())
	}
	if f.Status.Code != codes.Error || f.Status.Description != fail.Error() || fa["error.type"].AsString() != "BAD_ORDER" ||
		fa["messaging.batch.message_count"].AsInt64() != 1 {
		t.Errorf("failed run: status %v, error.type %q, %d messages; want Error %q, BAD_ORDER, 1",
			f.Status, fa["error.type"].AsString(), fa["messaging.batch.message_count"].AsInt64(), fail.Error())
	}
}

// txState is a handler.State that the test only compares: the
// middleware must pass it on, never use it.
type txState struct{ handler.State }

// TestCommitSpan: a commit event becomes a CLIENT span from its start to
// Kafka's answer, with the group, the one topic and partition it carries,
// and error.type when it failed.
func TestCommitSpan(t *testing.T) {
	t.Setenv(tidemarkotel.EnvStabilityOptIn, "")
	tp, exp := recorder(t)
	hook := tidemarkotel.CommitHook(tidemarkotel.WithTracerProvider(tp))
	start := time.Now().Add(-time.Second)
	hook(framework.CommitEvent{GroupID: "billing", Generation: 4, MemberID: "m-1", Reason: "interval",
		Offsets: []framework.CommitOffset{{Topic: "orders", Partition: 1, Offset: 100}}, Start: start, Duration: 20 * time.Millisecond})
	refused := fmt.Errorf("commit: %w", kafka.IllegalGeneration)
	two := []framework.CommitOffset{{Topic: "orders", Partition: 0, Offset: 5}, {Topic: "refunds", Partition: 0, Offset: 7}}
	hook(framework.CommitEvent{GroupID: "billing", Generation: 4, MemberID: "m-1", Reason: "rebalance",
		Offsets: two, Start: start, Duration: time.Millisecond, Err: refused})
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans for 2 commits, want 2", len(spans))
	}
	s := spans[0]
	if s.Name != "commit orders" || s.SpanKind != trace.SpanKindClient || s.Parent.IsValid() {
		t.Errorf("commit span %q kind %s parent %s, want \"commit orders\", client, a root", s.Name, s.SpanKind, s.Parent.SpanID())
	}
	if !s.StartTime.Equal(start) || s.EndTime.Sub(s.StartTime) != 20*time.Millisecond {
		t.Errorf("commit span from %s to %s, want %s for 20ms", s.StartTime, s.EndTime, start)
	}
	checkAttrs(t, "commit span", s.Attributes, map[attribute.Key]any{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "commit",
		"messaging.operation.type":           "settle",
		"messaging.consumer.group.name":      "billing",
		"messaging.destination.name":         "orders",
		"messaging.destination.partition.id": "1",
		"messaging.kafka.offset":             int64(100),
		"tidemark.commit.reason":             "interval",
		"tidemark.commit.partitions":         int64(1),
		"tidemark.commit.offsets":            []string{"orders/1=100"},
		"tidemark.group.generation":          int64(4),
	})
	f := spans[1]
	fa := attrs(f.Attributes)
	if f.Name != "commit" || f.Status.Code != codes.Error || fa["error.type"].AsString() != "ILLEGAL_GENERATION" {
		t.Errorf("failed commit: span %q status %v error.type %q; want \"commit\" (two topics), Error, ILLEGAL_GENERATION",
			f.Name, f.Status, fa["error.type"].AsString())
	}
	if _, has := fa["messaging.destination.name"]; has {
		t.Error("a commit of two topics names a destination")
	}
	if got := fa["tidemark.commit.offsets"].AsStringSlice(); !slices.Equal(got, []string{"orders/0=5", "refunds/0=7"}) {
		t.Errorf("offsets %v", got)
	}
}

// TestStabilityOptIn: messaging/dup adds the v1.24.0 names beside the
// current ones; messaging alone, or nothing, gives the current ones only.
func TestStabilityOptIn(t *testing.T) {
	old := []attribute.Key{"messaging.kafka.consumer.group", "messaging.kafka.destination.partition",
		"messaging.kafka.message.offset", "messaging.operation", "messaging.client_id"}
	for _, tc := range []struct {
		env string
		dup bool
	}{{"", false}, {"messaging", false}, {"http, messaging/dup", true}, {"http/dup", false}} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tidemarkotel.EnvStabilityOptIn, tc.env)
			tp, exp := recorder(t)
			h := tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup("billing"),
				tidemarkotel.WithClientID("c1"))(handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
			if err := h.Handle(context.Background(), message(nil)); err != nil {
				t.Fatal(err)
			}
			a := attrs(exp.GetSpans()[0].Attributes)
			for _, k := range old {
				if _, has := a[k]; has != tc.dup {
					t.Errorf("%s present: %v, want %v", k, has, tc.dup)
				}
			}
			if a["messaging.consumer.group.name"].AsString() != "billing" || a["messaging.kafka.offset"].AsInt64() != 42 {
				t.Errorf("current names missing: %v", a)
			}
			if tc.dup && (a["messaging.kafka.destination.partition"].AsInt64() != 3 || a["messaging.operation"].AsString() != "deliver" ||
				a["messaging.kafka.message.offset"].AsInt64() != 42) {
				t.Errorf("old names' values: %v", a)
			}
		})
	}
}
