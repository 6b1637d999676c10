// Package framework runs a tidemark Consumer: a member of a Kafka consumer
// group that hands every message to a handler.Handler, records processed
// offsets in a local bbolt file (the source of truth) and commits them to
// Kafka in the background.
//
// # The path of one message
//
// In pipeline order, one file per stage; each type's doc says which
// goroutine owns it.
//
//   - membership (member.go, classic.go): the Consumer is a member of its
//     group on the classic protocol, spoken by package internal/wire: it
//     offers the cooperative-sticky assignor (KIP-429), so that a rebalance
//     moves only the partitions that must move, then range for groups that
//     hold eager-only members; with Config.InstanceID it is a static member
//     (KIP-345). Each assignment change goes to the assignment.
//   - assignment (assign.go, reconcile.go): a newly assigned partition is
//     reconciled: the offset file's watermark L, Kafka's committed offset C
//     and the log's bounds decide where it resumes (L > C: a commit was late
//     or failed, resume at L and commit it; C > L: another member went
//     further; neither: Config.StartOffset; outside the log:
//     Config.OutOfRange), then its goroutine starts (partition.go).
//   - fetch (fetch.go; leaders.go looks up leaders): one loop per broker
//     sends one Fetch for every partition that broker leads with room in its
//     share of Config.MaxBufferedBytes, and queues each partition's record
//     batches on its inbox (queue.go).
//   - decode (partition.go, records.go, txn.go): the partition's goroutine
//     decodes its batches, zero-copy, drops those of aborted transactions at
//     ReadCommitted, and hands each message in offset order to its
//     dispatcher.
//   - dispatch (dispatch.go): the dispatcher runs the Handler (or
//     BatchHandler) under Config.Ordering: on the partition's goroutine
//     (OrderPartition), or on its workers, up to MaxInFlight, one call per
//     key at a time (OrderKey) or in any order (OrderNone).
//   - invoke (invoke.go, failure.go): each call runs under the topic's
//     failure policy: retried with backoff, then dead-lettered
//     (deadletter.go), skipped or stopped; after an unclean end the first
//     calls run carefully and the crash-loop breaker may give a message up.
//   - mark (tracker.go): a call that returned nil marks its offsets done;
//     the watermark is the contiguous prefix of done offsets, and those done
//     above it are recorded as ranges.
//   - flush (package offsetstore): the offset file's writer makes every
//     partition's watermark durable in one fsync-ed transaction.
//   - commit (committer.go, coordinator.go): every CommitInterval the
//     committer sends Kafka's coordinator the durable watermarks that
//     changed, with the current generation, so Kafka's committed offset
//     never passes the file: committed <= durable <= processed.
//
// When a partition is revoked (it moves to another member) or the consumer
// stops, it stops fetching, waits for the Handler calls in flight (their
// context is cancelled after DrainTimeout), the file is flushed and the
// final watermark committed while the generation is still valid, so the
// next owner starts exactly there. A partition that stays with its owner
// through a rebalance is not touched. A commit refused because the
// generation ended (IllegalGeneration, UnknownMemberId, FencedInstanceId)
// stops committing until the next one; any other error is retried at the
// next interval, and every attempt is recorded in the file's commit ledger
// (an unknown outcome is confirmed against Kafka later). A slow or failing
// commit never blocks handling, nor the heartbeats, which run on their own
// connection and schedule.
//
// # Status page and health checks
//
// Consumer.StatusHandler serves, read-only, /healthz (Healthy), /readyz
// (Ready), /status (an HTML page that refreshes itself: the consumer and
// one row per partition, the ones in trouble first), /status.json (the
// InspectSnapshot) and, with Config.MetricsHandler, /metrics. Mount it on a
// server of yours, or set Config.StatusAddr and Run serves it. Liveness
// fails when Run is not running, when one of its loops (group, fetcher,
// committer) has been in one step longer than its timeouts allow, or while
// the offset file takes no writes; readiness fails until the consumer is a
// member of a generation with every assigned partition reconciled. A
// commit outage fails neither: the offset file keeps the watermarks and a
// restart would not help; /readyz and the page say so. StatusPage serves
// the page from any snapshot source (cmd/tidemark serve).
//
// # Caveats
//
//   - One Consumer, one offset file, one process: the file is locked while
//     the Consumer holds it (from New until Run returns, or Close).
//   - A Consumer runs once; create a new one to run again.
//   - Handler calls for one partition are sequential by default
//     (OrderPartition); OrderKey and OrderNone run up to MaxInFlight at
//     once. Different partitions always run concurrently, so a Handler must
//     be safe for concurrent use.
//   - With OrderKey or OrderNone, a drain cut short by DrainTimeout leaves
//     offsets completed above the watermark: this instance skips them when
//     it gets the partition back (the offset file lists them), another
//     instance handles them again (Kafka's commit carries the watermark
//     only).
//   - A message waiting for its key is copied out of the fetched response:
//     with OrderKey a hot key costs a copy per waiting message.
//   - By default a message that always fails stalls its partition (retry
//     forever); choose a FailurePolicy to dead-letter, skip or stop.
//   - The dead-letter topic is at least once: a write that timed out after
//     the broker applied it is written again, and a partition revoked while
//     dead-lettering is dead-lettered again by its next owner.
//   - Careful mode after an unclean end serialises the first Handler calls
//     (up to 200 messages or 5 s per partition) and fsyncs around each. The
//     breaker counts crashes while a message is in flight; a crash caused
//     elsewhere (another goroutine of the service) while the same message is
//     in flight at every restart would be blamed on that message.
//   - Handling runs at most Config.MaxUndurable messages per partition ahead
//     of the offset file: a disk that stops taking writes stops handling
//     (Stats.OffsetFileError, PartitionStats.DurableWait) until a write
//     succeeds.
//   - Pause and Resume live in memory: a paused partition is consumed again
//     after the process restarts, or by another member after a rebalance.
//   - DrainTimeout must stay below RebalanceTimeout - HeartbeatInterval; New
//     refuses a Config where it does not. A Handler that ignores its context
//     is abandoned 2 s after DrainTimeout: its message is not marked done (the
//     next owner handles it again), and Run reports it in its error.
//   - After a crash (SIGKILL, OOM) of an instance, the messages it handled
//     since its last durable flush are handled again by whoever resumes the
//     partition; if that is a different instance, so are those handled since
//     the last commit.
//   - In a group that holds a member speaking only eager protocols (an older
//     tidemark, a kafka-go Reader), the coordinator chooses range, and every
//     rebalance revokes every partition, as eager rebalancing does. In the
//     rebalance where such a member joins a cooperative group, a partition
//     this consumer still holds may be handed to it before this consumer
//     revoked it: up to DrainTimeout of messages can be handled twice.
//   - Kafka 4's consumer group protocol (KIP-848) is not spoken yet; the
//     classic protocol used here stays supported by Kafka 4.x.
//   - A Message's Key, Value and header values are never reused and may be
//     kept, but they slice into the fetched response (or its decompressed
//     batch), which stays in memory while any of them is kept: copy the
//     bytes you keep for long.
//   - A Kafka node in a controlled shutdown hands its partitions on and
//     answers fetches for them with nothing until its process exits, 1-2 s
//     later: at the default MetadataMaxAge (5m) a rolling restart pauses
//     those partitions that long; a lower MetadataMaxAge finds the moves
//     sooner, at one Metadata request per interval.
//   - When the coordinator's broker dies, Kafka names a new one about 11 s
//     later; with no heartbeat answered for SessionTimeout less one
//     HeartbeatInterval a member gives up every partition and joins again,
//     claiming them back, so at the 10 s default all its partitions pause
//     until then. A SessionTimeout above the failover (Java's default is
//     45 s) rides it through.
//   - IsolationLevel is kafka.ReadUncommitted by default, as kafka-go's
//     Reader: records of aborted transactions are handled. With
//     kafka.ReadCommitted they are dropped, and a transaction left open
//     (up to its producer's transaction.timeout.ms, 1 minute by default)
//     holds every later record of its partitions back: PartitionStats'
//     TransactionWait says so.
//   - Only the v2 record batch format (Kafka 0.11 and later) is read. A batch
//     or record that cannot be decoded stalls its partition at that offset
//     until it is reassigned; nothing is skipped.
//   - Fetched bytes not yet handled are bounded by Config.MaxBufferedBytes,
//     counted as the broker sends them (compressed batches at their compressed
//     size), plus one record batch larger than a request asked for; each
//     partition also holds the batch it is handling, decoded and decompressed.
//   - The status server (Config.StatusAddr) listens on loopback unless told
//     otherwise: a Kubernetes probe needs "0.0.0.0:PORT". It has no
//     authentication: what it shows (group, topics, offsets, errors) is
//     readable by whoever reaches the port. Healthy fails while the offset
//     file takes no writes (a full disk): give the liveness probe a
//     failureThreshold that tolerates a passing error, since the writer
//     retries and a restart does not free the disk.
//   - Fetches read uncommitted: records of aborted transactions are handed to
//     the Handler. Transaction markers are skipped and never hold the
//     watermark back.
package framework
