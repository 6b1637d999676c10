package tidemarkotel_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/plugin/tidemarkotel"
)

// broker starts an in-process broker with one topic of one partition,
// and returns its address, the topic and a group. With KAFKA_BROKERS set
// (make test-kafka) it uses that broker instead, with a topic and a group
// named for this run, the topic deleted at the end.
func broker(t *testing.T, topic, group string) (addr, topicName, groupName string) {
	t.Helper()
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		addr = strings.Split(env, ",")[0]
		suffix := fmt.Sprintf("-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
		topic, group = topic+suffix, group+suffix
		tr := &kafka.Transport{}
		cl := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 30 * time.Second, Transport: tr}
		resp, err := cl.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{
			Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
		if err == nil {
			err = resp.Errors[topic]
		}
		if err != nil {
			t.Fatalf("creating topic %s on %s: %v", topic, addr, err)
		}
		t.Cleanup(func() {
			_, _ = cl.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
			tr.CloseIdleConnections() // goleak: the transport's connections end here
		})
		return addr, topic, group
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0], topic, group
}

// produceTraced produces n records to topic with a franz-go client traced
// by kotel (which writes each record's traceparent header), and returns
// the producer spans by offset.
func produceTraced(t *testing.T, addr, topic string, n int, exp *tracetest.InMemoryExporter, tr *kotel.Tracer) map[int64]trace.SpanContext {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.WithHooks(kotel.NewKotel(kotel.WithTracer(tr)).Hooks()...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)})
	}
	if err := kc.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	byOffset := map[int64]trace.SpanContext{}
	for _, s := range exp.GetSpans() {
		if s.SpanKind != trace.SpanKindProducer {
			continue
		}
		off, ok := attrs(s.Attributes)["messaging.kafka.message.offset"]
		if !ok {
			t.Fatalf("kotel's producer span has no offset: %v", s.Attributes)
		}
		byOffset[off.AsInt64()] = s.SpanContext
	}
	if len(byOffset) != n {
		t.Fatalf("%d producer spans for %d records", len(byOffset), n)
	}
	return byOffset
}

// consumerConfig is a Config with short intervals, as the core's tests
// use.
func consumerConfig(t *testing.T, addr, topic, group string, h handler.Handler) framework.Config {
	return framework.Config{
		Brokers:           []string{addr},
		GroupID:           group,
		Topics:            []string{topic},
		OffsetFile:        filepath.Join(t.TempDir(), "offsets.db"),
		Handler:           h,
		InspectSocket:     framework.InspectDisabled,
		CommitInterval:    100 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		DrainTimeout:      2 * time.Second,
		FetchMaxWait:      200 * time.Millisecond,
	}
}

// spansOf returns the ended spans of kind.
func spansOf(exp *tracetest.InMemoryExporter, kind trace.SpanKind) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range exp.GetSpans() {
		if s.SpanKind == kind {
			out = append(out, s)
		}
	}
	return out
}

// TestEndToEnd: records produced by franz-go with kotel's tracing are
// consumed by a Consumer with the middleware and the commit hook: one
// process span per record, each linked to (or, with
// WithProducerAsParent, the child of) the producer span of its record,
// and commit spans up to the last offset.
func TestEndToEnd(t *testing.T) {
	for _, asParent := range []bool{false, true} {
		t.Run(map[bool]string{false: "link", true: "parent"}[asParent], func(t *testing.T) {
			const n = 20
			addr, topic, group := broker(t, "orders", "billing")
			tp, exp := recorder(t)
			producers := produceTraced(t, addr, topic, n, exp,
				kotel.NewTracer(kotel.TracerProvider(tp), kotel.TracerPropagator(propagation.TraceContext{})))

			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			var mu sync.Mutex
			inCall := map[int64]trace.SpanContext{}
			h := handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
				mu.Lock()
				defer mu.Unlock()
				inCall[m.Offset] = trace.SpanContextFromContext(ctx)
				return nil
			})
			opts := []tidemarkotel.Option{tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup(group)}
			if asParent {
				opts = append(opts, tidemarkotel.WithProducerAsParent())
			}
			cfg := consumerConfig(t, addr, topic, group, handler.Chain(h, tidemarkotel.Middleware(opts...)))
			cfg.OnCommit = tidemarkotel.CommitHook(tidemarkotel.WithTracerProvider(tp))
			c, err := framework.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			deadline := time.Now().Add(30 * time.Second)
			for !committedAt(exp, n) {
				if time.Now().After(deadline) {
					stop()
					<-done
					t.Fatalf("no commit span reached offset %d in 30s; spans: %d", n, len(exp.GetSpans()))
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}

			process := spansOf(exp, trace.SpanKindConsumer)
			if len(process) != n {
				t.Fatalf("%d process spans for %d records handled once each", len(process), n)
			}
			for _, s := range process {
				a := attrs(s.Attributes)
				off := a["messaging.kafka.offset"].AsInt64()
				producer, ok := producers[off]
				switch {
				case !ok:
					t.Fatalf("process span of offset %d, which was not produced", off)
				case s.Name != "process "+topic || a["messaging.consumer.group.name"].AsString() != group ||
					a["messaging.destination.partition.id"].AsString() != "0" || a["messaging.kafka.message.key"].AsString() != fmt.Sprintf("k%d", off):
					t.Errorf("offset %d: span %q with %v", off, s.Name, s.Attributes)
				case !inCall[off].Equal(s.SpanContext):
					t.Errorf("offset %d: the Handler's ctx carried span %s, not the process span %s", off, inCall[off].SpanID(), s.SpanContext.SpanID())
				case len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != producer.SpanID() || s.Links[0].SpanContext.TraceID() != producer.TraceID():
					t.Errorf("offset %d: links %+v, want the producer span %s", off, s.Links, producer.SpanID())
				case asParent && (s.Parent.SpanID() != producer.SpanID() || s.SpanContext.TraceID() != producer.TraceID()):
					t.Errorf("offset %d: parent %s, want the producer span %s, in its trace", off, s.Parent.SpanID(), producer.SpanID())
				case !asParent && (s.Parent.IsValid() || s.SpanContext.TraceID() == producer.TraceID()):
					t.Errorf("offset %d: parent %s in the producer's trace, want a root of its own", off, s.Parent.SpanID())
				}
			}

			commits := spansOf(exp, trace.SpanKindClient)
			if len(commits) == 0 {
				t.Fatal("no commit span")
			}
			for _, s := range commits {
				a := attrs(s.Attributes)
				if s.Name != "commit "+topic || a["messaging.consumer.group.name"].AsString() != group ||
					a["messaging.operation.type"].AsString() != "settle" || !s.EndTime.After(s.StartTime) {
					t.Errorf("commit span %q from %s to %s with %v", s.Name, s.StartTime, s.EndTime, s.Attributes)
				}
			}
		})
	}
}

// committedAt reports whether a commit span carries offset off, without
// error.
func committedAt(exp *tracetest.InMemoryExporter, off int64) bool {
	for _, s := range spansOf(exp, trace.SpanKindClient) {
		a := attrs(s.Attributes)
		if _, failed := a["error.type"]; !failed && a["messaging.kafka.offset"].AsInt64() == off {
			return true
		}
	}
	return false
}

// TestNoSpanForBufferedMessages: messages fetched but never handed to the
// Handler have no span: offset 3 fails forever (the default policy retries
// it), so the 46 behind it wait in the buffer until the consumer stops.
// Process spans are exactly the Handler calls, retries included.
func TestNoSpanForBufferedMessages(t *testing.T) {
	const n, stuck = 50, 3
	addr, topic, group := broker(t, "clicks", "analytics")
	tp, exp := recorder(t)
	produceTraced(t, addr, topic, n, exp, kotel.NewTracer(kotel.TracerProvider(tp), kotel.TracerPropagator(propagation.TraceContext{})))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var c *framework.Consumer
	var mu sync.Mutex
	var calls []int64
	var buffered int64
	attempts := 0
	h := handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, m.Offset)
		if m.Offset != stuck {
			return nil
		}
		if attempts++; attempts == 3 {
			buffered = c.Stats().Partitions[0].BufferedBytes
			stop()
		}
		return fmt.Errorf("offset %d is refused", m.Offset)
	})
	cfg := consumerConfig(t, addr, topic, group, handler.Chain(h, tidemarkotel.Middleware(tidemarkotel.WithTracerProvider(tp))))
	cfg.RetryBackoff, cfg.MaxRetryBackoff = 5*time.Millisecond, 20*time.Millisecond
	var err error
	if c, err = framework.New(cfg); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(calls)
	if buffered == 0 || calls[len(calls)-1] != stuck {
		t.Fatalf("calls for offsets %v, %d bytes buffered at the stop: the test needs messages fetched and never handed over", calls, buffered)
	}
	var spanned []int64
	failed := 0
	for _, s := range spansOf(exp, trace.SpanKindConsumer) {
		a := attrs(s.Attributes)
		spanned = append(spanned, a[attribute.Key("messaging.kafka.offset")].AsInt64())
		if _, ok := a["error.type"]; ok {
			failed++
		}
	}
	slices.Sort(spanned)
	if !slices.Equal(spanned, calls) {
		t.Errorf("process spans of offsets %v, want exactly the Handler calls %v (%d bytes were buffered)", spanned, calls, buffered)
	}
	if want := len(calls) - stuck; failed != want {
		t.Errorf("%d spans with error.type, want %d: one per failed call of offset %d", failed, want, stuck)
	}
}

// TestEndToEndTx: a TxHandler wrapped in TxMiddleware, in a Consumer:
// one process span per run, each with its run's size and a link (with
// its offset) to the producer span of each of its records, every record
// in exactly one run's span, and the spans' ctx the runs'. The state
// holds each record once.
func TestEndToEndTx(t *testing.T) {
	const n = 30
	addr, topic, group := broker(t, "ledger", "accounts")
	tp, exp := recorder(t)
	producers := produceTraced(t, addr, topic, n, exp,
		kotel.NewTracer(kotel.TracerProvider(tp), kotel.TracerPropagator(propagation.TraceContext{})))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	inCall := map[trace.SpanID]int{} // the runs' spans, by their size
	th := handler.TxHandlerFunc(func(ctx context.Context, st handler.State, msgs []kafka.Message) error {
		for _, m := range msgs {
			if err := st.Put(m.Key, m.Value); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		inCall[trace.SpanContextFromContext(ctx).SpanID()] = len(msgs)
		return nil
	})
	cfg := consumerConfig(t, addr, topic, group, nil)
	cfg.TxHandler = handler.ChainTx(th, tidemarkotel.TxMiddleware(tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithConsumerGroup(group)))
	cfg.BatchSize = 8
	cfg.OnCommit = tidemarkotel.CommitHook(tidemarkotel.WithTracerProvider(tp))
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !committedAt(exp, n) {
		if time.Now().After(deadline) {
			stop()
			<-done
			t.Fatalf("no commit span reached offset %d in 30s; spans: %d", n, len(exp.GetSpans()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Committed at n means durable at n: the runs' changes are in the file.
	held := 0
	if err := c.ViewState(topic, 0, func(st handler.State) error {
		return st.ForEach(func(_, _ []byte) error { held++; return nil })
	}); err != nil {
		t.Error(err)
	}
	if held != n {
		t.Errorf("the state holds %d keys, want %d", held, n)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	linked := map[int64]int{}
	runs := spansOf(exp, trace.SpanKindConsumer)
	if len(runs) != len(inCall) || len(runs) < n/cfg.BatchSize {
		t.Fatalf("%d process spans for %d runs (of at most %d records)", len(runs), len(inCall), cfg.BatchSize)
	}
	for _, s := range runs {
		a := attrs(s.Attributes)
		size := a["messaging.batch.message_count"].AsInt64()
		if s.Name != "process "+topic || a["messaging.consumer.group.name"].AsString() != group || s.Parent.IsValid() ||
			a["messaging.destination.partition.id"].AsString() != "0" || int64(inCall[s.SpanContext.SpanID()]) != size {
			t.Errorf("span %q parent %s with %v; the run in its ctx had %d records", s.Name, s.Parent.SpanID(), s.Attributes,
				inCall[s.SpanContext.SpanID()])
		}
		if len(s.Links) != int(size) {
			t.Errorf("a run of %d records has %d links", size, len(s.Links))
		}
		for _, l := range s.Links {
			off := attrs(l.Attributes)["messaging.kafka.offset"].AsInt64()
			if p, ok := producers[off]; !ok || l.SpanContext.SpanID() != p.SpanID() {
				t.Errorf("a link to span %s names offset %d, whose producer span is %s", l.SpanContext.SpanID(), off, p.SpanID())
			}
			linked[off]++
		}
	}
	for off := range int64(n) {
		if linked[off] != 1 {
			t.Errorf("offset %d is linked from %d run spans, want 1", off, linked[off])
		}
	}
}
