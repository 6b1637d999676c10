package tidemarkotel

import (
	"context"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/framework"
)

// Attributes of the commit span that the conventions have no name for.
const (
	// CommitReasonKey is why tidemark committed: framework.CommitEvent.Reason.
	CommitReasonKey = attribute.Key("tidemark.commit.reason")
	// CommitPartitionsKey is how many partitions the commit carried.
	CommitPartitionsKey = attribute.Key("tidemark.commit.partitions")
	// CommitOffsetsKey lists the committed positions, "topic/partition=offset",
	// the first MaxCommitOffsets of them.
	CommitOffsetsKey = attribute.Key("tidemark.commit.offsets")
	// GenerationKey is the group generation the commit was sent with.
	GenerationKey = attribute.Key("tidemark.group.generation")
)

// MaxCommitOffsets bounds the positions a commit span lists in
// CommitOffsetsKey: a commit of 10,000 partitions every second would
// otherwise make each span hundreds of kilobytes.
const MaxCommitOffsets = 64

// CommitHook returns a function for framework.Config.OnCommit that makes a
// span of each commit of offsets to Kafka: kind CLIENT, named "commit
// {topic}" ("commit" when the commit carries several topics), from when
// the commit was sent to when Kafka answered, with messaging.operation.type
// "settle", messaging.operation.name "commit", the group from the commit
// (WithConsumerGroup is not needed), the destination and partition when
// there is one, messaging.kafka.offset when the commit carries one
// partition, and error.type when it failed. A commit is tidemark's own
// work, on its own goroutine: its span is the root of a trace of its own.
// With WithMeterProvider, its duration is also recorded in the
// messaging.client.operation.duration histogram.
func CommitHook(opts ...Option) func(framework.CommitEvent) {
	in := newInstruments(opts)
	return in.commit
}

func (in *instruments) commit(ev framework.CommitEvent) {
	name := "commit"
	oneTopic := len(ev.Offsets) > 0
	for _, o := range ev.Offsets {
		if o.Topic != ev.Offsets[0].Topic {
			oneTopic = false
			break
		}
	}
	n := names{dup: in.n.dup, group: ev.GroupID, clientID: in.n.clientID}
	attrs := []attribute.KeyValue{semconv.MessagingSystemKafka, semconv.MessagingOperationName("commit"),
		semconv.MessagingOperationTypeSettle}
	var metricAttrs []attribute.KeyValue
	if ev.GroupID != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(ev.GroupID))
		if n.dup {
			attrs = append(attrs, oldConsumerGroup.String(ev.GroupID))
		}
	}
	if oneTopic {
		topic := ev.Offsets[0].Topic
		name += " " + topic
		attrs = append(attrs, semconv.MessagingDestinationName(topic))
		if len(ev.Offsets) == 1 {
			o := ev.Offsets[0]
			attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(o.Partition)))
			if n.dup {
				attrs = append(attrs, oldPartition.Int(o.Partition))
			}
			attrs = n.offset(attrs, o.Offset)
		}
	}
	metricAttrs = append(metricAttrs, attrs[:3]...) // system, operation name and type
	if ev.GroupID != "" {
		metricAttrs = append(metricAttrs, semconv.MessagingConsumerGroupName(ev.GroupID))
	}
	if oneTopic {
		metricAttrs = append(metricAttrs, semconv.MessagingDestinationName(ev.Offsets[0].Topic))
	}
	attrs = n.client(attrs)
	listed := make([]string, 0, min(len(ev.Offsets), MaxCommitOffsets))
	for i, o := range ev.Offsets {
		if i == MaxCommitOffsets {
			break
		}
		listed = append(listed, fmt.Sprintf("%s/%d=%d", o.Topic, o.Partition, o.Offset))
	}
	attrs = append(attrs, CommitReasonKey.String(ev.Reason), CommitPartitionsKey.Int(len(ev.Offsets)),
		CommitOffsetsKey.StringSlice(listed), GenerationKey.Int(int(ev.Generation)))

	end := ev.Start.Add(ev.Duration)
	ctx, span := in.tracer.Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(ev.Start), trace.WithAttributes(attrs...))
	if ev.Err != nil {
		et := errorType(ev.Err)
		span.SetAttributes(et)
		span.SetStatus(codes.Error, ev.Err.Error())
		metricAttrs = append(metricAttrs, et)
	}
	span.End(trace.WithTimestamp(end))
	if in.operation != nil {
		in.operation.Record(ctx, ev.Duration.Seconds(), metric.WithAttributeSet(attribute.NewSet(metricAttrs...)))
	}
}
