package tidemarkotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/plugin/tidemarkotel"
)

// collect reads every metric of reader by name.
func collect(t *testing.T, reader sdkmetric.Reader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// TestMetrics: with WithMeterProvider, each call is measured in
// messaging.process.duration (seconds) and counted in
// messaging.client.consumed.messages (a batch or a TxHandler run by its size), by topic,
// partition, group and error.type; commits in
// messaging.client.operation.duration. messaging/dup adds v1.24.0's
// messaging.deliver.duration and messaging.deliver.messages.
func TestMetrics(t *testing.T) {
	for _, dup := range []bool{false, true} {
		t.Run(map[bool]string{false: "current", true: "dup"}[dup], func(t *testing.T) {
			t.Setenv(tidemarkotel.EnvStabilityOptIn, map[bool]string{false: "", true: "messaging/dup"}[dup])
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			tp, _ := recorder(t)
			opts := []tidemarkotel.Option{tidemarkotel.WithTracerProvider(tp), tidemarkotel.WithMeterProvider(mp),
				tidemarkotel.WithConsumerGroup("billing")}
			fail := errors.New("boom")
			h := tidemarkotel.Middleware(opts...)(handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
				time.Sleep(2 * time.Millisecond)
				if m.Offset == 2 {
					return fail
				}
				return nil
			}))
			for off := range int64(3) {
				m := message(nil)
				m.Offset = off
				_ = h.Handle(context.Background(), m)
			}
			bh := tidemarkotel.BatchMiddleware(opts...)(handler.BatchHandlerFunc(func(context.Context, []kafka.Message) error {
				time.Sleep(2 * time.Millisecond)
				return nil
			}))
			_ = bh.HandleBatch(context.Background(), []kafka.Message{message(nil), message(nil), message(nil), message(nil)})
			th := tidemarkotel.TxMiddleware(opts...)(handler.TxHandlerFunc(func(context.Context, handler.State, []kafka.Message) error {
				time.Sleep(2 * time.Millisecond)
				return nil
			}))
			_ = th.HandleTx(context.Background(), nil, []kafka.Message{message(nil), message(nil)})
			tidemarkotel.CommitHook(opts...)(framework.CommitEvent{GroupID: "billing", Reason: "interval",
				Offsets: []framework.CommitOffset{{Topic: "orders", Partition: 3, Offset: 5}}, Start: time.Now(), Duration: 3 * time.Millisecond})

			got := collect(t, reader)
			base := attribute.NewSet(attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.name", "process"),
				attribute.String("messaging.destination.name", "orders"), attribute.String("messaging.destination.partition.id", "3"),
				attribute.String("messaging.consumer.group.name", "billing"))
			failed := attribute.NewSet(append(base.ToSlice(), attribute.String("error.type", "*errors.errorString"))...)

			dur, ok := got["messaging.process.duration"]
			if !ok || dur.Unit != "s" {
				t.Fatalf("messaging.process.duration: %+v, want a histogram in s", dur)
			}
			counts := map[attribute.Distinct]uint64{}
			for _, dp := range dur.Data.(metricdata.Histogram[float64]).DataPoints {
				counts[dp.Attributes.Equivalent()] = dp.Count
				if least, _ := dp.Min.Value(); least < 0.002 {
					t.Errorf("a call of at least 2ms measured %gs", least)
				}
			}
			if counts[base.Equivalent()] != 4 || counts[failed.Equivalent()] != 1 || len(counts) != 2 {
				t.Errorf("process.duration counts %v, want 4 calls without error (2, a batch and a run) and 1 with", counts)
			}
			msgs, ok := got["messaging.client.consumed.messages"]
			if !ok || msgs.Unit != "{message}" {
				t.Fatalf("messaging.client.consumed.messages: %+v", msgs)
			}
			sums := map[attribute.Distinct]int64{}
			for _, dp := range msgs.Data.(metricdata.Sum[int64]).DataPoints {
				sums[dp.Attributes.Equivalent()] = dp.Value
			}
			if sums[base.Equivalent()] != 8 || sums[failed.Equivalent()] != 1 {
				t.Errorf("consumed.messages %v, want 8 without error (2 + a batch of 4 + a run of 2) and 1 with", sums)
			}
			op, ok := got["messaging.client.operation.duration"]
			if !ok || len(op.Data.(metricdata.Histogram[float64]).DataPoints) != 1 {
				t.Errorf("messaging.client.operation.duration: %+v, want the commit", op)
			} else if name, _ := op.Data.(metricdata.Histogram[float64]).DataPoints[0].Attributes.Value("messaging.operation.name"); name.AsString() != "commit" {
				t.Errorf("the commit's operation name %q", name.AsString())
			}
			_, hasOld := got["messaging.deliver.duration"]
			_, hasOldCount := got["messaging.deliver.messages"]
			if hasOld != dup || hasOldCount != dup {
				t.Errorf("v1.24.0 metrics present: %v %v, want %v", hasOld, hasOldCount, dup)
			}
			if dup {
				var total int64
				for _, dp := range got["messaging.deliver.messages"].Data.(metricdata.Sum[int64]).DataPoints {
					if g, _ := dp.Attributes.Value("messaging.kafka.consumer.group"); g.AsString() != "billing" {
						t.Errorf("deliver.messages without v1.24.0's group attribute: %v", dp.Attributes.ToSlice())
					}
					total += dp.Value
				}
				if total != 9 {
					t.Errorf("deliver.messages counted %d, want 9", total)
				}
			}
		})
	}
}
