// Package tidemark is an embedded, offset-tracking Kafka consumer framework
// for Go services. This package has no API of its own: it documents the
// module, and its tests are the end-to-end scenarios.
//
// The engine speaks Kafka's protocol itself (package internal/wire, on
// franz-go's kmsg codec), with its own fetching and group membership.
// github.com/segmentio/kafka-go is the user's face: a Handler gets a
// kafka.Message; Config takes kafka.IsolationLevel, kafka.FirstOffset or
// kafka.LastOffset and a kafka-go sasl.Mechanism (TLS is a crypto/tls
// Config); kafka-go's compression codecs decompress fetched batches; and
// Kafka error codes are returned as kafka.Error values.
//
// You implement a handler.Handler (one method, like http.Handler) and run a
// framework.Consumer inside your service. The Consumer joins the consumer
// group, calls the Handler for every message, records processed offsets in a
// local bbolt file (package offsetstore), and commits durable watermarks to
// Kafka in the background. The file is the source of truth: on every
// assignment it is reconciled with Kafka's committed offset, so a commit that
// failed, timed out or landed late neither loses nor repeats work.
//
// The API is in package framework (Consumer, Config, Stats, the status page
// and health checks), package handler (the Handler contract and middleware)
// and package metrics (Prometheus). The command cmd/tidemark inspects and
// repairs offset files.
//
// # Guarantees
//
//   - At least once: an offset is recorded only after the Handler returned
//     nil for it (or a failure policy gave up on it, recorded in the file),
//     and Kafka's committed offset never passes the file's durable watermark.
//     Failed or late commits, crashes, broker restarts and rebalances never
//     skip a message.
//   - A restart on the same offset file does not handle again what was
//     durable, even when Kafka's committed offset is behind; after a SIGKILL
//     it handles again at most Config.MaxUndurable messages per partition.
//   - Rebalances are cooperative when every member offers cooperative-sticky
//     (KIP-429): a partition that stays with its owner keeps running. One that
//     moves is drained and its final watermark committed before its next
//     owner starts, so nothing is handled twice. When a member speaks only
//     eager protocols, the group uses range and every rebalance revokes every
//     partition. When an instance dies, its partitions' next owners start at
//     Kafka's committed offset.
//   - Order follows Config.Ordering: OrderPartition (the default) calls a
//     partition's messages one at a time, in offset order; OrderKey calls
//     different keys at once, each key in order, up to MaxInFlight calls per
//     partition; OrderNone calls any at once. A BatchHandler gets runs of
//     consecutive messages instead.
//
// Package framework's Caveats list the limits to know first, and
// docs/caveats.md all of them. The repository's README.md and
// docs/guarantees.md state every promise precisely, with the tests that
// show it.
package tidemark
