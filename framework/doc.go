// Package framework runs a tidemark Consumer: a member of a Kafka consumer
// group that hands every message to a handler.Handler, records processed
// offsets in a local bbolt file (the source of truth) and commits them to
// Kafka in the background.
//
// A service builds one Consumer from a Config and runs it until its context
// ends; the Handler is the service's code, called once per message:
//
//	c, err := framework.New(framework.Config{
//		Brokers:    []string{"kafka-1:9092"},
//		GroupID:    "billing",
//		Topics:     []string{"orders"},
//		OffsetFile: "/var/lib/billing/offsets.db", // one per instance, on a volume that survives restarts
//		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
//			return bill(ctx, m.Value) // nil: done; an error: retried with backoff, never skipped
//		}),
//		Logger: logger, // a *zap.Logger; nil logs nothing
//	})
//	if err != nil {
//		return err // every invalid field is named
//	}
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	return c.Run(ctx) // on cancel: drains, flushes, commits, leaves the group
//
// Example runs the same on an in-process broker, with its output checked;
// package tidemarktest runs a service's own Handler that way in its tests.
// The Handler's contract (concurrency, ctx, the message's bytes) is
// handler.Handler's; Config's fields document every setting.
//
// # The path of one message
//
// For readers of the code: the engine's stages, and the files that hold
// them (docs/layout.md has the whole map).
//
// In pipeline order, one file per stage; each type's doc says which
// goroutine owns it. New builds each stage with the collaborators it needs
// (Consumer.wire); none reaches another through the Consumer.
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
//     Config.OutOfRange; the bounds and the policy are positions.go's), then
//     its goroutine starts (partition.go). The decided position is made
//     durable before any message is handled; a partition whose goroutine
//     starts with its first message is fetched meanwhile.
//   - fetch (fetch.go; leaders.go keeps the leader table): two loops per
//     broker (lanes: a partition behind its log's end, or not fetched
//     yet, is spread over both, so that one lane's request is in flight
//     while another's answer is handled; one keeping up stays in the
//     first) each send one Fetch for every partition of theirs with room
//     in its share of Config.MaxBufferedBytes, and queue each partition's
//     record batches on its inbox (queue.go). Each loop owns its
//     partitions' cursors under its own lock. Each loop keeps an incremental
//     fetch session with its broker (session.go, KIP-227): a request lists
//     only the partitions whose position changed, and an idle wide topic
//     costs requests of no partitions; a backlog wider than a request can
//     fill goes in requests outside the session that list only what fills
//     them, as a broker reads every partition of a session per request.
//   - decode (partition.go, records.go, txn.go): the partition's goroutine
//     decodes its batches, zero-copy, drops those of aborted transactions at
//     ReadCommitted, and hands each message in offset order to its
//     dispatcher. With OrderPartition and a Handler it exists only while
//     the partition has something to handle.
//   - dispatch (dispatch.go): the dispatcher runs the Handler (or
//     BatchHandler, or a TxHandler's runs: state.go) under Config.Ordering: on the partition's goroutine
//     (OrderPartition), or on its workers, up to MaxInFlight, one call per
//     key at a time (OrderKey) or in any order (OrderNone).
//   - invoke (invoke.go, failure.go): each call runs under the topic's
//     failure policy: retried with backoff, then dead-lettered
//     (deadletter.go), skipped or stopped; after an unclean end the first
//     calls run carefully and the crash-loop breaker may give a message up.
//   - mark (tracker.go): a call that returned nil marks its offsets done;
//     the watermark is the contiguous prefix of done offsets, and those done
//     above it are recorded as ranges.
//   - flush (package internal/offsetfile): the offset file's writer makes every
//     partition's watermark durable in one write to the file's journal,
//     and synced in one fsync-ed transaction every SyncInterval.
//   - commit (committer.go, coordinator.go): every CommitInterval the
//     committer sends Kafka's coordinator the synced watermarks that
//     changed, with the current generation, so Kafka's committed offset
//     never passes the file: committed <= synced <= durable <= processed.
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
// Stats and the offset file's records, as the page shows them) and, with
// Config.MetricsHandler, /metrics. Mount it on a
// server of yours, or set Config.StatusAddr and Run serves it. Liveness
// fails when Run is not running, when one of its loops (group, fetcher,
// committer) has been in one step longer than its timeouts allow, or while
// the offset file takes no writes; readiness fails until the consumer is a
// member of a generation with every assigned partition reconciled. A
// commit outage fails neither: the offset file keeps the watermarks and a
// restart would not help; /readyz and the page say so. `tidemark serve`
// serves the same page for a running consumer, or for its file alone.
//
// # Caveats
//
// The few to know before using it. docs/caveats.md lists every caveat, each
// with the page that has the details.
//
//   - A Handler must be safe for concurrent use: different partitions always
//     run at once, and OrderKey and OrderNone run up to MaxInFlight calls of
//     one partition at once (docs/handler.md).
//   - By default a message that always fails stalls its partition (retry
//     forever); choose a FailurePolicy to dead-letter, skip or stop
//     (docs/failures.md).
//   - After a crash (SIGKILL, OOM), what was handled since the last durable
//     flush is handled again; if another instance resumes the partition, so
//     is what was handled since the last commit
//     (docs/guarantees.md#duplicates-after-a-crash-are-bounded-and-counted).
//   - A Handler must return when its context is cancelled, DrainTimeout
//     after its partition is revoked or the consumer stops: one that ignores
//     it is abandoned 2 s later, and its message is handled again
//     (docs/handler.md).
//   - IsolationLevel is kafka.ReadUncommitted by default, as kafka-go's
//     Reader: records of aborted transactions are handled. Choose
//     kafka.ReadCommitted when producers use transactions
//     (docs/transactions.md).
//   - A Message's Key, Value and header values may be kept, but they slice
//     into the fetched bytes (up to 1 MiB, shared with other partitions'
//     messages, or more for a partition's part larger than that; or the
//     decompressed batch), which stay in memory while any of them is kept:
//     copy the bytes you keep for long (docs/handler.md).
//   - A TxHandler's state lives in this offset file. Without
//     Config.StateChangelog a partition that moves to another member, or
//     whose offsets are reset, stalls there rather than go on with a state
//     that misses messages; with it the next owner restores the state from
//     the changelog topic (a reset still stalls) (docs/state.md).
//   - One offset file, one process: the file is locked from New until Run
//     returns (or Close). A Consumer runs once; create a new one to run
//     again (docs/operations.md#looking-at-a-running-consumer).
//   - The status server (Config.StatusAddr) has no authentication, and
//     listens on loopback unless told otherwise: a Kubernetes probe needs
//     "0.0.0.0:PORT" (docs/operations.md#status-page-and-health-checks).
package framework
