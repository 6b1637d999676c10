// Package tidemark is an embedded, offset-tracking Kafka consumer framework
// for Go services built on github.com/segmentio/kafka-go.
//
// You implement a handler.Handler (one method, like http.Handler) and run a
// framework.Consumer inside your service. tidemark joins the consumer group,
// gives every assigned partition its own goroutine that handles messages in
// offset order, records processed offsets in a local bbolt file (the source
// of truth, package offsetstore), and commits contiguous watermarks to Kafka
// in the background. On every assignment and restart it reconciles the file
// with Kafka, so a commit that failed, timed out or landed late never loses
// or repeats work.
//
//	c, err := framework.New(framework.Config{
//		Brokers:    []string{"localhost:9092"},
//		GroupID:    "billing",
//		Topics:     []string{"orders"},
//		OffsetFile: "/var/lib/billing/offsets.db",
//		Handler:    handler.HandlerFunc(process),
//	})
//	if err != nil { ... }
//	err = c.Run(ctx) // until ctx is cancelled; drains, commits, leaves the group
//
// # Guarantees
//
//   - At least once: an offset is recorded only after the Handler returned
//     nil for it, and Kafka's committed offset never passes the durable
//     (fsync-ed) watermark in the file. A crash, a failed or late commit, or
//     a broker restart never skips a message.
//   - No repeat after a restart of the same instance: a consumer restarted
//     on the same offset file resumes at the file's watermark even when
//     Kafka's committed offset is behind it; messages whose offsets were
//     durable are not handled again.
//   - Hand-off between instances: on a graceful rebalance each partition
//     drains and commits its final watermark before the group moves on, so
//     the next owner starts exactly there. When an instance dies (SIGKILL,
//     power loss) the next owner starts at Kafka's committed offset: the
//     messages handled since the last commit (at most CommitInterval's worth
//     plus the flush in progress) are handled again.
//   - Every commit attempt is recorded in the file (the commit ledger); one
//     whose answer never came is confirmed against Kafka afterwards.
//
// # Caveats
//
//   - The offset file is per instance and per host: one process at a time
//     (the file is locked; a second opener gets an "in use" error). Moving a
//     service to a new host without the file falls back to Kafka's
//     committed offsets, with the hand-off duplicates described above.
//   - Handlers of one partition run one at a time; a Handler that blocks
//     forever stalls its partition, and one that ignores its context delays
//     rebalances beyond DrainTimeout.
//   - By default a failing message is retried forever, with backoff: the
//     partition stalls visibly (Stats, logs) rather than skipping it. A
//     framework.FailurePolicy dead-letters, skips (recorded in the file) or
//     stops after MaxAttempts; a message in flight at every one of several
//     crashes in a row goes to that policy without another Handler call
//     (the crash-loop breaker).
//   - Only the classic consumer-group protocol with eager assignors (what
//     kafka-go implements) is used: every rebalance revokes every partition.
//   - A position outside the log (retention, a recreated topic) is reset to
//     the log start by default, loudly: an error log and a record in the file.
//   - Records of aborted transactions are delivered (reads are uncommitted).
//
// The packages: handler (the Handler contract and middleware), framework
// (the Consumer), offsetstore (the bbolt file). The command cmd/tidemark
// inspects and repairs offset files.
package tidemark
