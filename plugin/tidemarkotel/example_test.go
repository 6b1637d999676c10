package tidemarkotel_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/plugin/tidemarkotel"
)

// Trace a consumer on an in-process broker: a producer writes its span's
// context into the message's traceparent header; the process span links
// to it, and the commit gets a span of its own.
func Example() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	addr := broker.ListenAddrs()[0]

	// Spans go to memory here; a service exports them (otlptrace).
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	// The producer's side: a span, injected as W3C headers.
	pctx, send := tp.Tracer("shop").Start(context.Background(), "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(pctx, carrier)
	msg := kafka.Message{Key: []byte("order-1"), Value: []byte("2 apples")}
	for k, v := range carrier {
		msg.Headers = append(msg.Headers, kafka.Header{Key: k, Value: []byte(v)})
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "orders", BatchTimeout: time.Millisecond, Transport: tr}
	if err := w.WriteMessages(pctx, msg); err != nil {
		panic(err)
	}
	_ = w.Close()
	send.End()

	dir, _ := os.MkdirTemp("", "tidemarkotel-example")
	defer os.RemoveAll(dir)
	ctx, stop := context.WithCancel(context.Background())
	c, err := framework.New(framework.Config{
		Brokers:    []string{addr},
		GroupID:    "billing",
		Topics:     []string{"orders"},
		OffsetFile: filepath.Join(dir, "offsets.db"),
		Handler: handler.Chain(handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			stop() // a real service stops on SIGTERM instead
			return nil
		}), tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup("billing"))),
		OnCommit: tidemarkotel.CommitHook(tidemarkotel.WithTracerProvider(tp)),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil { // drains and commits on cancel
		panic(err)
	}

	var last sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		switch s.SpanKind() {
		case trace.SpanKindConsumer:
			linked := len(s.Links()) == 1 && s.Links()[0].SpanContext.SpanID() == send.SpanContext().SpanID()
			fmt.Printf("%s, linked to the producer: %v\n", s.Name(), linked)
		case trace.SpanKindClient:
			last = s // one commit per round; the last carries the final offset
		}
	}
	for _, a := range last.Attributes() {
		if a.Key == "messaging.kafka.offset" {
			fmt.Printf("%s: offset %d\n", last.Name(), a.Value.AsInt64())
		}
	}
	// Output:
	// process orders, linked to the producer: true
	// commit orders: offset 1
}
