package tidemarkotel

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/handler"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/tidemark/tidemark/plugin/tidemarkotel"

// durationBuckets are the bucket boundaries the conventions advise for
// messaging durations, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// instruments are the tracer, meters and names of one set of options.
type instruments struct {
	cfg    config
	n      names
	tracer trace.Tracer

	// Nil without WithMeterProvider; the old ones nil without messaging/dup.
	duration, oldDuration metric.Float64Histogram
	consumed, oldConsumed metric.Int64Counter
	operation             metric.Float64Histogram // commits
}

func newInstruments(opts []Option) *instruments {
	cfg := newConfig(opts)
	in := &instruments{cfg: cfg, n: names{dup: dupNames(), group: cfg.group, clientID: cfg.clientID},
		tracer: cfg.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))}
	if cfg.mp == nil {
		return in
	}
	m := cfg.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	// A refused instrument is a no-op one; the error goes to OTel's handler,
	// as instrumentation libraries do: a middleware has no error to return.
	var err error
	if in.duration, err = m.Float64Histogram(processDurationName, metric.WithUnit("s"),
		metric.WithDescription("Duration of processing operation."), metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		otel.Handle(err)
	}
	if in.consumed, err = m.Int64Counter(consumedMessagesName, metric.WithUnit("{message}"),
		metric.WithDescription("Number of messages that were delivered to the application.")); err != nil {
		otel.Handle(err)
	}
	if in.operation, err = m.Float64Histogram("messaging.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of messaging operation initiated by a producer or consumer client."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		otel.Handle(err)
	}
	if in.n.dup {
		if in.oldDuration, err = m.Float64Histogram(oldDurationMetric, metric.WithUnit("s"),
			metric.WithDescription("Measures the duration of deliver operation."), metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
			otel.Handle(err)
		}
		if in.oldConsumed, err = m.Int64Counter(oldMessagesMetric, metric.WithUnit("{message}"),
			metric.WithDescription("Measures the number of delivered messages.")); err != nil {
			otel.Handle(err)
		}
	}
	return in
}

// Middleware returns a handler.Middleware that traces each Handler call
// with one span: kind CONSUMER, named "process {topic}", started when the
// call starts and ended when it returns, with the messaging conventions'
// attributes (see the package documentation). The producer's context in
// the message's traceparent and tracestate headers becomes a link of the
// span, or its parent with WithProducerAsParent. The Handler's ctx
// carries the span.
func Middleware(opts ...Option) handler.Middleware {
	in := newInstruments(opts)
	return func(next handler.Handler) handler.Handler {
		return handler.HandlerFunc(func(ctx context.Context, msg kafka.Message) error {
			return in.handle(ctx, msg, next)
		})
	}
}

func (in *instruments) handle(ctx context.Context, msg kafka.Message, next handler.Handler) (err error) {
	start := time.Now()
	attrs := in.n.common(msg.Topic, msg.Partition, "process", in.n.dup)
	attrs = append(attrs, semconv.MessagingOperationTypeProcess)
	attrs = in.n.client(attrs)
	attrs = in.n.offset(attrs, msg.Offset)
	attrs = append(attrs, semconv.MessagingMessageBodySize(len(msg.Value)))
	if msg.Key != nil {
		if k, ok := in.cfg.key(msg.Key); ok {
			attrs = append(attrs, semconv.MessagingKafkaMessageKey(k))
		}
	}
	if msg.Value == nil {
		attrs = append(attrs, semconv.MessagingKafkaMessageTombstone(true))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(start),
		trace.WithAttributes(attrs...)}
	parent := ctx
	if sc, bag := in.producer(msg.Headers); sc.IsValid() || bag.Len() > 0 {
		if sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			if in.cfg.asParent {
				parent = trace.ContextWithRemoteSpanContext(parent, sc)
			}
		}
		if bag.Len() > 0 {
			parent = baggage.ContextWithBaggage(parent, bag)
		}
	}
	ctx, span := in.tracer.Start(parent, "process "+msg.Topic, opts...)
	returned := false
	defer func() { in.end(ctx, span, start, msg.Topic, msg.Partition, 1, err, !returned) }()
	err = next.Handle(ctx, msg)
	returned = true
	return err
}

// BatchMiddleware is Middleware for a handler.BatchHandler: one span per
// HandleBatch call, named "process {topic}", with
// messaging.batch.message_count and a link to each message's producer
// context (a link carries the message's offset). A batch has many
// producers, so none is the parent, whatever WithProducerAsParent says.
// When a batch fails, tidemark calls the BatchHandler again with halves of
// it: each call is a span.
func BatchMiddleware(opts ...Option) handler.BatchMiddleware {
	in := newInstruments(opts)
	return func(next handler.BatchHandler) handler.BatchHandler {
		return handler.BatchHandlerFunc(func(ctx context.Context, msgs []kafka.Message) error {
			if len(msgs) == 0 {
				return next.HandleBatch(ctx, msgs)
			}
			return in.handleRun(ctx, msgs, func(ctx context.Context) error { return next.HandleBatch(ctx, msgs) })
		})
	}
}

// TxMiddleware is BatchMiddleware for a handler.TxHandler: one span per
// HandleTx call (a run), the same as a batch's, with the State passed on
// untouched. The span ends when HandleTx returns, before tidemark queues
// the run's changes for the offset file: a run whose changes fail to be
// queued has an ended span without error.type, and the run is retried
// (split as a failed batch is), each call a span.
func TxMiddleware(opts ...Option) handler.TxMiddleware {
	in := newInstruments(opts)
	return func(next handler.TxHandler) handler.TxHandler {
		return handler.TxHandlerFunc(func(ctx context.Context, st handler.State, msgs []kafka.Message) error {
			if len(msgs) == 0 {
				return next.HandleTx(ctx, st, msgs)
			}
			return in.handleRun(ctx, msgs, func(ctx context.Context) error { return next.HandleTx(ctx, st, msgs) })
		})
	}
}

// handleRun traces call, a BatchHandler's or TxHandler's call with msgs
// (not empty, of one partition).
func (in *instruments) handleRun(ctx context.Context, msgs []kafka.Message, call func(context.Context) error) (err error) {
	start := time.Now()
	topic, partition := msgs[0].Topic, msgs[0].Partition
	attrs := in.n.common(topic, partition, "process", in.n.dup)
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingBatchMessageCount(len(msgs)))
	attrs = in.n.client(attrs)
	links := make([]trace.Link, 0, len(msgs))
	for _, m := range msgs {
		if sc, _ := in.producer(m.Headers); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: in.n.offset(nil, m.Offset)})
		}
	}
	ctx, span := in.tracer.Start(ctx, "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(start), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	returned := false
	defer func() { in.end(ctx, span, start, topic, partition, len(msgs), err, !returned) }()
	err = call(ctx)
	returned = true
	return err
}

// producer reads the producer's span context and baggage from headers.
// It extracts into an empty context, so that a span already in the
// Handler's ctx is never taken for the producer's.
func (in *instruments) producer(headers []kafka.Header) (trace.SpanContext, baggage.Baggage) {
	if len(headers) == 0 {
		return trace.SpanContext{}, baggage.Baggage{}
	}
	pctx := in.cfg.prop.Extract(context.Background(), headerCarrier(headers))
	return trace.SpanContextFromContext(pctx), baggage.FromContext(pctx)
}

// end ends the span of a call of n messages that began at start and
// returned err (or panicked), and records the call's metrics.
func (in *instruments) end(ctx context.Context, span trace.Span, start time.Time, topic string, partition, n int, err error, panicked bool) {
	var et attribute.KeyValue
	switch {
	case panicked:
		et = errorTypePanic
		span.SetStatus(codes.Error, "the handler panicked")
	case err != nil:
		et = errorType(err)
		span.SetStatus(codes.Error, err.Error())
	}
	failed := et.Valid()
	if failed {
		span.SetAttributes(et)
	}
	now := time.Now()
	span.End(trace.WithTimestamp(now))
	if in.duration == nil {
		return
	}
	secs := now.Sub(start).Seconds()
	attrs := in.n.common(topic, partition, "process", false)
	if failed {
		attrs = append(attrs, et)
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	in.duration.Record(ctx, secs, set)
	in.consumed.Add(ctx, int64(n), set)
	if in.oldDuration != nil {
		old := in.n.old(topic, partition)
		if failed {
			old = append(old, et)
		}
		oldSet := metric.WithAttributeSet(attribute.NewSet(old...))
		in.oldDuration.Record(ctx, secs, oldSet)
		in.oldConsumed.Add(ctx, int64(n), oldSet)
	}
}

// headerCarrier reads a message's headers for a propagator. Kafka allows
// a key twice; the last one wins, as the one added last (a relay adding
// its own context to a forwarded message). Set does nothing: the
// middleware only reads, and the message is the Handler's.
type headerCarrier []kafka.Header

func (h headerCarrier) Get(key string) string {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Key == key {
			return string(h[i].Value)
		}
	}
	return ""
}

func (h headerCarrier) Set(string, string) {}

func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for i, hd := range h {
		keys[i] = hd.Key
	}
	return keys
}
