// Package chaos runs tidemark consumers under faults and checks, with
// numbers, the promises of the framework's documentation: nothing is lost;
// a graceful hand-off repeats nothing; a SIGKILL repeats at most what the
// killed process handled since its last commit. Run is the harness;
// examples/chaos is its command (`go run ./examples/chaos`), and TestChaos
// runs a bounded run in `go test`.
//
// # A run
//
//   - A broker: the in-process kfake with a fixed port and a data
//     directory (StartFake), restarted by closing it and starting a new
//     cluster on the same port and directory; or a real broker, restarted
//     with scripts/kafka-local (RealBroker).
//   - A producer writing Value(partition, sequence) to a topic of 8
//     partitions at a steady rate, straight to the broker, retrying a
//     failed write with the same sequence numbers.
//   - A franz-go transactional producer writing TxnValue(partition,
//     sequence) into the same topic (Config.TxnRate), one transaction in
//     three aborted; the consumers then read at kafka.ReadCommitted, and
//     the checker holds them to: no record of an aborted transaction and
//     no marker handled, every committed record handled. "Committed" is
//     what a read_committed fetch of the final log delivers
//     (Input.LogCommitted). Where that differs from what the producer was
//     told, the report counts it as the broker's (Report.BrokerAborted).
//   - Consumer processes (instances c1, c2, ...), each one tidemark
//     Consumer (RunConsumer) with its own offset file and its own
//     Kafka-aware fault proxy (internal/kafkaproxy) between it and the
//     broker. A restarted instance reuses its offset file and proxy; a new
//     instance gets new ones. Each process appends every message it
//     handles to its own ledger (see ledger.go for the format), before its
//     handler returns.
//   - A fault schedule drawn from a seed (NewSchedule) and printed first:
//     SIGKILL and SIGTERM of an instance and its restart; instances joining
//     and leaving; commits held past the client timeout and answered with
//     coordinator errors (14, 15, 16, 27); latency with jitter,
//     connection resets and blackholes (some past the session timeout);
//     broker restarts. Network and commit faults act on one instance's
//     proxy. The last 15s of every 40s are calm: only graceful membership
//     changes, so that clean hand-offs happen throughout a run. The same
//     seed and flags give the same schedule.
//   - A poller reading the group's committed offsets and the log end every
//     200ms with its own client.
//   - When the fault phase ends: every fault is cleared, the producer
//     stops, the consumers drain until Kafka's committed offsets reach the
//     log end (or every message is in a ledger) and are stopped with
//     SIGTERM; then Check compares everything and Report.WriteTable prints
//     the figures.
//
// # How lost and duplicates are judged
//
// Lost: an offset below the final log end that is in no ledger. Ledger
// lines are written with one write(2) before the handler returns nil, so
// a process kill cannot take back a handled message (the kernel has the
// line; fsync runs in batches and would only matter for a machine crash,
// which the harness does not simulate). An acknowledged sequence number
// missing from the log is reported separately, as a broker loss.
//
// Duplicates: every handling of an offset after its first. Handlings of a
// partition, in time order, form segments of one process in one
// generation; a duplicate is attributed to the hand-off from the segment of
// the previous handling to its own:
//
//   - sigkill: the previous handler's process was SIGKILLed at or after its
//     last handling there and before the new owner's first, still in the
//     generation it handled in. Bound (checked): per kill and partition, no
//     more duplicates than the offsets the killed process had handled at or
//     above Kafka's committed offset read before the kill.
//   - a fault kind (broker-restart, blackhole, reset, commit-delay,
//     commit-error, latency): a fault on the previous owner's proxy, or a
//     broker restart, overlapped the previous owner's segment or the
//     hand-off, allowing Margin after the fault for its effects. Bound
//     (checked), for this and the next case: per hand-off and partition,
//     no more duplicates than the offsets the previous owner had handled
//     at or above Kafka's committed offset read before the next owner's
//     first handling; and only for offsets the previous owner (a zombie:
//     the zombie's repeat) handled before the explaining faults' effects
//     ended (their latest end plus Margin; a lapse: when it was recorded).
//   - a fault kind, for a lapsed membership: the previous owner gave its
//     partitions up without a commit (Stats.PartitionsLost grew; an L line
//     in its ledger) between its last handling and the new owner's first,
//     and a fault on any process (sigkill included), or a broker restart,
//     was in force during the session timeout before that: a member that
//     does not rejoin holds a rebalance up, and the members waiting in it
//     give their partitions up when their lease runs out. With no such
//     fault the duplicate counts as graceful.
//     The same holds when the group gives the partition back to the
//     process whose membership lapsed (its L line between its two
//     handlings, a later generation): a state rebuilt from its changelog
//     resumes at Kafka's commit when the file's last changes never reached
//     the changelog, and the hand-off to itself is bounded like any other.
//   - same-process: one process handled the offset twice otherwise. Broken
//     promise.
//   - graceful: none of the above: a clean hand-off repeated work. Broken
//     promise.
//
// # Invariants checked
//
//   - No handler call for an offset below the committed offset Kafka
//     reported before the call began.
//   - No process handles an offset below its own offset file's watermark
//     when it started, and offsets never go backwards within a process.
//   - Kafka's committed offset never decreases and never passes the log
//     end; no offset file holds a watermark beyond the log end at the end.
//   - Every value handled is the log's value at that offset.
//   - Every process ends as the harness ended it: a SIGTERMed one exits 0
//     within a minute, none exits by itself.
//
// # Caveats
//
//   - kfake restarts are clean shutdowns (kfake saves its state on Close);
//     only the real broker is also restarted with SIGKILL.
//   - The pinned kfake keeps a member whose JoinGroup answer could not be
//     delivered (its connection died) without a session timer, and every
//     later join restarts the rebalance timer that would drop it: under
//     constant churn the group stays in PreparingRebalance for good. On
//     kfake a janitor removes every member once the group has been out of
//     Stable for JanitorAfter (no member owns a partition then); each
//     intervention is recorded and shown as a kfake-janitor fault. A real
//     broker needs none.
//   - Times are compared across processes on one machine's wall clock.
package chaos
