// Package metrics exports a tidemark framework.Consumer's Stats as
// Prometheus metrics. It is the only tidemark package that imports the
// Prometheus client: a program that does not import it does not compile
// Prometheus.
//
// # Serving them
//
// Handler serves one Consumer's metrics, and nothing else:
//
//	http.Handle("/metrics", metrics.Handler(consumer))
//
// Prometheus scrapes get the text format, gzip-compressed, written straight
// from the snapshot; a client that wants protobuf is served by promhttp over
// a registry holding the Collector.
//
// To serve them beside other metrics (the Go runtime's, the service's own),
// register a Collector in that registry instead:
//
//	col, err := metrics.NewCollector(consumer)
//	if err != nil {
//		return err
//	}
//	prometheus.MustRegister(col) // or reg.Register(col)
//
// # What is exported
//
// Every metric carries the label group (Config.GroupID); the per-partition
// ones also topic and partition; tidemark_partition_state and
// tidemark_partitions one series per framework.PartitionStates state, so
// that an alert can match a state that has no partition now;
// tidemark_commits_total one series per outcome (ok, fenced, error,
// unknown). No label holds an offset, a key or an error text: the number
// of series is fixed by the partitions the consumer owns or owned. The
// README's Metrics section lists every metric; examples/grafana holds a
// dashboard built on them.
//
// Per partition: the counters tidemark_handled_messages_total,
// tidemark_handler_errors_total, tidemark_handler_retries_total,
// tidemark_dead_lettered_messages_total and
// tidemark_skipped_messages_total; the positions
// tidemark_processed_offset, tidemark_durable_offset,
// tidemark_committed_offset and tidemark_high_watermark_offset, and the
// gaps between them tidemark_lag_messages, tidemark_lag_seconds,
// tidemark_undurable_messages (handled, not yet durable in the offset
// file) and tidemark_uncommitted_messages (durable, not yet committed to
// Kafka);
// the work in progress tidemark_in_flight_messages,
// tidemark_waiting_messages and tidemark_buffered_bytes; and the 0/1
// gauges tidemark_partition_state, tidemark_careful_mode,
// tidemark_window_full and tidemark_durable_wait.
//
// Per consumer: the histograms tidemark_handler_duration_seconds and
// tidemark_offset_file_flush_duration_seconds; tidemark_commits_total,
// tidemark_rebalances_total, tidemark_rebalance_seconds_total,
// tidemark_rebalancing, tidemark_partitions_lost_total,
// tidemark_lost_uncommitted_messages_total,
// tidemark_revoked_uncommitted_messages_total, tidemark_breaker_trips_total,
// tidemark_careful_mode_entries_total, tidemark_partitions,
// tidemark_generation, tidemark_group_protocol, tidemark_member_epoch (the
// consumer group protocol's only), tidemark_offset_file_error,
// tidemark_fetch_requests_total and tidemark_consumer_buffered_bytes.
//
// # Caveats
//
//   - NewCollector (and so Handler) calls Consumer.MeasureHandlerLatency:
//     from then on Handler calls are timed, two clock reads a timed call
//     (about 70 ns). Calls of 100 µs or more are each timed; quicker ones
//     are sampled, one in 16 timed and counted 16 times, so that a no-op
//     Handler does not pay a third more CPU per message: the histogram's
//     count is exact for real work and right on average for quick calls.
//     It cannot be turned off again for that Consumer.
//   - Each scrape takes one Consumer.Stats snapshot and builds every series
//     from it: its cost grows with the partitions, 28 series each (nine of
//     them tidemark_partition_state). Handler writes the text format
//     straight from the snapshot, which costs about 8 ms of CPU a scrape
//     with 1,000 partitions (bench/'s metrics section); a Collector in a
//     registry costs about 2.5 µs a series there (60 ms a scrape of 1,000
//     partitions), which is also Handler's cost for a client that asks for
//     protobuf only.
//   - Counters count from the Consumer's start, in memory: a restarted
//     process starts them at 0 again, which PromQL's rate and increase read
//     as a counter reset. The offset file's own totals (tidemark inspect)
//     survive restarts; these do not.
//   - A partition that was revoked keeps its counters (they only grow) and
//     its tidemark_partition_state series (state "revoked"), but its
//     position, lag and work gauges are left out: after a rebalance each
//     partition's gauges come from its current owner alone, so summing them
//     over a group's members counts each partition once. A position not
//     known yet (-1 in Stats) is left out too, rather than shown as -1.
//   - tidemark_lag_messages is measured against the log end seen by the last
//     fetch of the partition. A paused partition is left out of fetch
//     requests, so its lag stays where it was when it was paused, however
//     much is produced meanwhile; tidemark_lag_seconds follows
//     PartitionStats.LagTime (exact while the oldest unhandled message is
//     fetched, otherwise the age of the last message taken, which is at
//     least as old).
//   - tidemark_handled_messages_total counts the messages the partition is
//     done with: a message the failure policy dead-lettered or skipped is
//     counted there as well as in its own counter.
//   - Two Consumers of the same group in one registry would export the same
//     series: Register refuses the second Collector. Tell them apart with a
//     label of your own, prometheus.WrapRegistererWith(prometheus.Labels{
//     "consumer": name}, reg).
//   - The latency histograms have the fixed buckets of
//     framework.LatencyBounds, 50 µs to 60 s.
//   - The Consumer's Stats are read, never changed: a Collector may outlive
//     Run, and keeps exporting the last figures.
package metrics
