// Package tidemarkotel traces a tidemark consumer with OpenTelemetry,
// following the messaging semantic conventions (v1.43.0): a span for each
// Handler call, one for each BatchHandler call or TxHandler run, and one
// for each commit of offsets to Kafka. It is a module of its own, so that tidemark itself
// does not depend on OpenTelemetry.
//
//	cfg := framework.Config{
//		GroupID: "billing",
//		Handler: handler.Chain(h, tidemarkotel.Middleware(
//			tidemarkotel.WithTracerProvider(tp),
//			tidemarkotel.WithConsumerGroup("billing"))),
//		OnCommit: tidemarkotel.CommitHook(tidemarkotel.WithTracerProvider(tp)),
//		// ...
//	}
//
// # The process span
//
// Middleware starts a span when tidemark calls the Handler and ends it when
// the call returns: kind CONSUMER, named "process {topic}", with
//
//   - messaging.system "kafka", messaging.operation.name and
//     messaging.operation.type "process";
//   - messaging.destination.name (the topic), messaging.destination.partition.id;
//   - messaging.consumer.group.name, given by WithConsumerGroup (a
//     middleware does not know the Consumer's group); messaging.client.id
//     with WithClientID;
//   - messaging.kafka.offset, messaging.kafka.message.key (when the key is
//     not null and has a string form: see WithKeyFormatter),
//     messaging.kafka.message.tombstone (a null value),
//     messaging.message.body.size;
//   - on failure, an Error status with the error's text and error.type:
//     Kafka's name of a Kafka error code in the error's chain
//     (UNKNOWN_TOPIC_OR_PARTITION), "context.Canceled" or
//     "context.DeadlineExceeded", the value of an ErrorType() string method
//     in the chain, else the error's Go type ("*errors.errorString"); a
//     panic through the middleware is "*handler.PanicError", as the
//     framework's Recover makes it.
//
// Each retry of a message is a Handler call and so a span of its own. The
// Handler's ctx carries the span: spans the Handler starts are its
// children.
//
// The producer's context is read from the message's W3C traceparent and
// tracestate headers (WithPropagator reads others). By default it is a
// link of the process span, which starts a trace of its own, as the
// current conventions say: "For each message it accounts for, the Process
// span SHOULD link to the message's creation context". WithProducerAsParent
// makes it the parent instead (and keeps the link), joining the producer's
// trace, as the Kafka examples of the older conventions show and as most
// tracing back ends draw best. Baggage that the propagator extracts is put
// in the Handler's ctx either way.
//
// BatchMiddleware does the same for a BatchHandler: one span per
// HandleBatch call, with messaging.batch.message_count, and a link to each
// message's producer context that carries the message's offset.
// TxMiddleware makes the same span of each HandleTx call of a TxHandler
// (a run applied to the partition's state), wrapped with handler.ChainTx:
//
//	cfg.TxHandler = handler.ChainTx(h, tidemarkotel.TxMiddleware(
//		tidemarkotel.WithTracerProvider(tp),
//		tidemarkotel.WithConsumerGroup("billing")))
//
// # The commit span
//
// CommitHook, set as framework.Config.OnCommit, makes a span of each commit
// of offsets: kind CLIENT, named "commit {topic}" ("commit" for several
// topics), from when tidemark sent it to when Kafka answered, with
// messaging.operation.type "settle" and messaging.operation.name "commit",
// the group, the destination and partition when there is only one, the
// offset when there is one partition, and tidemark's own
// tidemark.commit.reason, tidemark.commit.partitions,
// tidemark.commit.offsets and tidemark.group.generation.
//
// # Metrics
//
// WithMeterProvider adds the conventions' metrics: the
// messaging.process.duration histogram (seconds; the conventions' buckets)
// and the messaging.client.consumed.messages counter (a batch or a
// TxHandler run counts its messages), each by system, operation name, topic, partition, group and
// error.type; and the commits' durations in
// messaging.client.operation.duration. Without it there are none.
//
// # OTEL_SEMCONV_STABILITY_OPT_IN
//
// The messaging conventions are not stable, and names moved: the group was
// messaging.kafka.consumer.group, the partition
// messaging.kafka.destination.partition, the offset
// messaging.kafka.message.offset, the operation messaging.operation
// ("deliver"), the client messaging.client_id, and the metrics
// messaging.deliver.duration and messaging.deliver.messages (v1.24.0, the
// version the conventions' migration plan starts from). With
// "messaging/dup" in OTEL_SEMCONV_STABILITY_OPT_IN (a comma-separated
// list), the spans carry those names beside the current ones and the old
// metrics are recorded beside the new, so that dashboards can move over.
// Unset, or "messaging", means the current names only: this package has
// no earlier release whose names it would owe by default. Span names are
// the current ones either way. The variable is read when Middleware,
// BatchMiddleware, TxMiddleware or CommitHook is called.
//
// # Caveats
//
//   - No span is made for a message that was fetched and never handed to
//     the Handler (buffered when its partition was revoked or the consumer
//     stopped), nor for one that the crash-loop breaker sends to its failure
//     policy without a call, nor for a dead-letter write: a span is a call.
//   - A process span ends when the Handler returns, not when its offset is
//     durable or committed: that is the commit span's.
//   - A commit span is a root: the committer works for many messages at
//     once, on its own goroutine. It links to no process span.
//   - tidemark wraps the Handler in handler.Recover outside this
//     middleware, so a panic ends the span as a failure and is then an
//     error like any other; with Config.DisableRecover the span ends but
//     the process crashes before an exporter that batches sends it.
//   - A batch span has a link per traced message; the SDK keeps 128 links
//     per span by default (sdktrace.SpanLimits.LinkCountLimit): a
//     BatchSize above that loses the rest unless the limit is raised.
//   - A commit span lists at most MaxCommitOffsets positions in
//     tidemark.commit.offsets; tidemark.commit.partitions counts them all.
//   - The default propagator is W3C Trace Context alone, not the global
//     one (which is a no-op until set): pass WithPropagator to read B3 or
//     baggage.
//   - A TxHandler run's span ends when HandleTx returns, before tidemark
//     queues the run's changes with its watermark: a run that fails there
//     (a full disk) has a span without error.type, and is called again.
//   - The message key becomes an attribute: with keys that identify
//     people, use WithKeyFormatter to hash or drop them.
package tidemarkotel
