package metrics

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tidemark/tidemark/framework"
)

// Label names. Every metric carries group; the per-partition ones topic
// and partition; the per-state ones state; tidemark_commits_total outcome;
// tidemark_group_protocol protocol. Their values come from bounded sets:
// the consumer's group, its topics and partitions,
// framework.PartitionStates, the four commit outcomes and the two group
// protocols.
const (
	labelGroup     = "group"
	labelTopic     = "topic"
	labelPartition = "partition"
	labelState     = "state"
	labelOutcome   = "outcome"
	labelProtocol  = "protocol"
)

// Commit outcomes, the values of tidemark_commits_total's outcome label
// (framework.CommitCounts).
var commitOutcomes = []string{"ok", "fenced", "error", "unknown"}

// kind is how a metric is exposed.
type kind int

const (
	counter kind = iota
	gauge
	histogram
)

// def describes one metric the Collector exports.
type def struct {
	name   string
	kind   kind
	labels []string
	help   string
}

var (
	consumerLabels  = []string{labelGroup}
	partitionLabels = []string{labelGroup, labelTopic, labelPartition}
)

// The metrics, as indexes into defs and Collector.descs.
const (
	// Per partition: counters since the consumer started.
	mHandled = iota
	mHandlerErrors
	mRetries
	mDeadLettered
	mSkipped
	mAborted
	mRestoreRecords
	mStateRebuilds
	// Per partition: gauges of an owned partition.
	mLag
	mLagSeconds
	mProcessed
	mDurable
	mCommitted
	mHighWatermark
	mLastStable
	mTransactionWait
	mUndurable
	mUncommitted
	mInFlight
	mWaiting
	mBuffered
	mCareful
	mWindowFull
	mDurableWait
	mRestoring
	mRestoreRemaining
	// Per partition and state.
	mPartitionState
	// Per consumer.
	mHandlerDuration
	mFlushDuration
	mCommits
	mRebalances
	mRebalanceSeconds
	mRebalancing
	mPartitionsLost
	mLostUncommitted
	mRevokedUncommitted
	mBreakerTrips
	mCarefulEntries
	mPartitions
	mGeneration
	mGroupProtocol
	mMemberEpoch
	mOffsetFileError
	mFetchRequests
	mFetchSessionResets
	mConsumerBuffered
	numMetrics
)

// defs are the metrics, in the order of the README's table.
var defs = [numMetrics]def{
	mHandled: {"tidemark_handled_messages_total", counter, partitionLabels,
		"Messages of the partition this consumer is done with since it started: handled by the Handler, or given up on by the failure policy (dead-lettered or skipped)."},
	mHandlerErrors: {"tidemark_handler_errors_total", counter, partitionLabels,
		"Handler (BatchHandler) calls for the partition that failed: returned an error or panicked."},
	mRetries: {"tidemark_handler_retries_total", counter, partitionLabels,
		"Handler calls for the partition that tried a message again after a failure."},
	mDeadLettered: {"tidemark_dead_lettered_messages_total", counter, partitionLabels,
		"Messages of the partition the failure policy wrote to the dead-letter topic."},
	mSkipped: {"tidemark_skipped_messages_total", counter, partitionLabels,
		"Messages of the partition the failure policy skipped (listed in the offset file)."},
	mAborted: {"tidemark_aborted_messages_total", counter, partitionLabels,
		"Records of aborted transactions of the partition dropped, never handled (IsolationLevel ReadCommitted)."},
	mLag: {"tidemark_lag_messages", gauge, partitionLabels,
		"Messages between the partition's processed watermark and the log end seen by the last fetch (at ReadCommitted, the last stable offset)."},
	mLagSeconds: {"tidemark_lag_seconds", gauge, partitionLabels,
		"Lag in time: age, from its record timestamp, of the oldest message of the partition not handled yet; 0 without lag."},
	mProcessed: {"tidemark_processed_offset", gauge, partitionLabels,
		"The partition's processed watermark: every offset below it was handled (next-offset position)."},
	mDurable: {"tidemark_durable_offset", gauge, partitionLabels,
		"The partition's watermark recorded in the offset file (its journal or the file): where the next run resumes after this process dies."},
	mCommitted: {"tidemark_committed_offset", gauge, partitionLabels,
		"The partition's offset Kafka last confirmed as committed for the group."},
	mHighWatermark: {"tidemark_high_watermark_offset", gauge, partitionLabels,
		"The partition's log end (high watermark) seen by the last fetch."},
	mLastStable: {"tidemark_last_stable_offset", gauge, partitionLabels,
		"The partition's last stable offset (LSO) seen by the last fetch, at IsolationLevel ReadCommitted: no record at or above it is handled yet."},
	mTransactionWait: {"tidemark_transaction_wait_seconds", gauge, partitionLabels,
		"How long the partition has been held at its last stable offset by an open transaction, having handled all below it; 0 when not held (ReadCommitted)."},
	mUndurable: {"tidemark_undurable_messages", gauge, partitionLabels,
		"Messages of the partition handled and not yet durable in the offset file (processed - durable): what a crash would handle again."},
	mUncommitted: {"tidemark_uncommitted_messages", gauge, partitionLabels,
		"Messages of the partition durable in the offset file and not yet committed to Kafka (durable - committed)."},
	mInFlight: {"tidemark_in_flight_messages", gauge, partitionLabels,
		"Messages of the partition in Handler (BatchHandler) calls."},
	mWaiting: {"tidemark_waiting_messages", gauge, partitionLabels,
		"Messages of the partition fetched and waiting for an earlier message of their key or for a call slot."},
	mBuffered: {"tidemark_buffered_bytes", gauge, partitionLabels,
		"Bytes fetched for the partition and not yet handled."},
	mCareful: {"tidemark_careful_mode", gauge, partitionLabels,
		"1 while the partition is in careful mode after an unclean end (each offset made durable around its Handler call), else 0."},
	mWindowFull: {"tidemark_window_full", gauge, partitionLabels,
		"1 while the partition takes no new message because MaxWindow messages are pending above its watermark, else 0."},
	mRestoreRecords: {"tidemark_restore_records_total", counter, partitionLabels,
		"Changelog records read to restore the partition's state (Config.StateChangelog; Kafka Streams' restore-total); rate() of it is the restore rate. Exported with a changelog."},
	mStateRebuilds: {"tidemark_state_rebuilds_total", counter, partitionLabels,
		"Times the partition's state was emptied and rebuilt from the log start (Config.StateRebuild). Exported with StateRebuild."},
	mRestoring: {"tidemark_restoring", gauge, partitionLabels,
		"1 while the partition's state is restored from its changelog (the partition takes no message meanwhile), else 0. Exported with a changelog."},
	mRestoreRemaining: {"tidemark_restore_remaining_records", gauge, partitionLabels,
		"Changelog records left to read by the partition's restore going on (Kafka Streams' restore-remaining-records-total); 0 when none."},
	mDurableWait: {"tidemark_durable_wait", gauge, partitionLabels,
		"1 while the partition waits for the offset file to make its handled messages durable (MaxUndurable reached), else 0."},
	mPartitionState: {"tidemark_partition_state", gauge, []string{labelGroup, labelTopic, labelPartition, labelState},
		"1 for the partition's current lifecycle state, 0 for the others: one series per state."},
	mHandlerDuration: {"tidemark_handler_duration_seconds", histogram, consumerLabels,
		"Duration of Handler (BatchHandler) calls, retries included."},
	mFlushDuration: {"tidemark_offset_file_flush_duration_seconds", histogram, consumerLabels,
		"Duration of the offset file's flushes: journal writes, and checkpoints (a transaction, fsync included)."},
	mCommits: {"tidemark_commits_total", counter, []string{labelGroup, labelOutcome},
		"Commit requests sent to Kafka, by outcome: ok, fenced (the generation ended), error (not applied), unknown (no answer)."},
	mRebalances: {"tidemark_rebalances_total", counter, consumerLabels,
		"Generations of the group this consumer joined."},
	mRebalanceSeconds: {"tidemark_rebalance_seconds_total", counter, consumerLabels,
		"Time this consumer spent joining generations, until their partitions were revoked and the added ones reconciled; the join going on included."},
	mRebalancing: {"tidemark_rebalancing", gauge, consumerLabels,
		"1 while this consumer is joining a generation, else 0."},
	mPartitionsLost: {"tidemark_partitions_lost_total", counter, consumerLabels,
		"Partitions given up without a commit because the membership lapsed or was fenced: unless given back at the next join, their next owners handle again what was handled since the last commit."},
	mLostUncommitted: {"tidemark_lost_uncommitted_messages_total", counter, consumerLabels,
		"Messages handled since the last commit in the partitions given up without a commit: their next owners handle at most this many again."},
	mRevokedUncommitted: {"tidemark_revoked_uncommitted_messages_total", counter, consumerLabels,
		"Messages handled since the last commit in revoked partitions whose final commit did not land in its budget (RebalanceTimeout - HeartbeatInterval at a rebalance, DrainTimeout at a stop): their next owners handle at most this many again."},
	mBreakerTrips: {"tidemark_breaker_trips_total", counter, consumerLabels,
		"Messages the crash-loop breaker gave to the failure policy without a Handler call, over all partitions."},
	mCarefulEntries: {"tidemark_careful_mode_entries_total", counter, consumerLabels,
		"Partition runs that started in careful mode after an unclean end, over all partitions."},
	mPartitions: {"tidemark_partitions", gauge, []string{labelGroup, labelState},
		"Partitions this consumer owns or owned, by lifecycle state: one series per state."},
	mGeneration: {"tidemark_generation", gauge, consumerLabels,
		"The group generation this consumer is a member of (with the consumer group protocol, its member epoch); 0 when not a member."},
	mGroupProtocol: {"tidemark_group_protocol", gauge, []string{labelGroup, labelProtocol},
		"1, with the group protocol this consumer speaks (Config.GroupProtocol) as its label: classic, or consumer (KIP-848)."},
	mMemberEpoch: {"tidemark_member_epoch", gauge, consumerLabels,
		"With the consumer group protocol (KIP-848), the member epoch the coordinator gave this member; 0 when not a member. Not exported with the classic protocol."},
	mOffsetFileError: {"tidemark_offset_file_error", gauge, consumerLabels,
		"1 while the offset file's last write failed (durable watermarks do not move), else 0."},
	mFetchRequests: {"tidemark_fetch_requests_total", counter, consumerLabels,
		"Fetch requests this consumer sent."},
	mFetchSessionResets: {"tidemark_fetch_session_resets_total", counter, consumerLabels,
		"Incremental fetch sessions a broker refused (evicted or out of step); each costs one request listing every partition."},
	mConsumerBuffered: {"tidemark_consumer_buffered_bytes", gauge, consumerLabels,
		"Bytes fetched and not yet handled across all partitions; bounded by MaxBufferedBytes."},
}

// Collector exports a framework.Consumer's Stats as Prometheus metrics. It
// implements prometheus.Collector: register it with a prometheus.Registerer,
// or serve it with Handler. Each Collect takes one Stats snapshot and
// derives every metric from it, so the figures of one scrape agree with
// each other. It is safe for concurrent use.
type Collector struct {
	stats  func() framework.Stats
	states []framework.PartitionState
	descs  [numMetrics]*prometheus.Desc
	// bounds are the histogram bucket bounds, in seconds, of
	// framework.LatencyBounds.
	bounds []float64
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector of c's Stats. It calls
// c.MeasureHandlerLatency, so that tidemark_handler_duration_seconds counts
// Handler calls from then on (see MeasureHandlerLatency: quick calls are
// sampled). It returns an error for a nil Consumer. It starts no goroutine.
func NewCollector(c *framework.Consumer) (*Collector, error) {
	if c == nil {
		return nil, errors.New("tidemark metrics: NewCollector: nil *framework.Consumer")
	}
	col, err := newCollector(c.Stats)
	if err != nil {
		return nil, err
	}
	c.MeasureHandlerLatency()
	return col, nil
}

// newCollector builds a Collector over a source of snapshots, and checks
// its descriptions.
func newCollector(stats func() framework.Stats) (*Collector, error) {
	col := &Collector{stats: stats, states: framework.PartitionStates()}
	for i, d := range defs {
		col.descs[i] = prometheus.NewDesc(d.name, d.help, d.labels, nil)
		if err := col.descs[i].Err(); err != nil {
			return nil, fmt.Errorf("tidemark metrics: %s: %w", d.name, err)
		}
	}
	for _, b := range framework.LatencyBounds {
		col.bounds = append(col.bounds, b.Seconds())
	}
	return col, nil
}

// Describe sends the description of every metric Collect can send.
func (col *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range col.descs {
		ch <- d
	}
}

// Collect takes one Stats snapshot and sends every metric derived from it.
func (col *Collector) Collect(ch chan<- prometheus.Metric) {
	col.emit(col.stats(), promSink{col: col, ch: ch})
}

// labels are the label values of one series, in the order of its
// definition's label names.
type labels struct {
	v [4]string
	n int
}

func lv(v ...string) labels {
	var l labels
	l.n = copy(l.v[:], v)
	return l
}

func (l labels) with(v string) labels {
	l.v[l.n] = v
	l.n++
	return l
}

// sink receives the series of one snapshot: promSink sends them to a
// prometheus registry (Collect), textSink writes the text exposition
// (Handler).
type sink interface {
	metric(i int, v float64, l labels)
	histogram(i int, h *framework.Histogram, l labels)
}

// emit derives every series from one snapshot.
func (col *Collector) emit(s framework.Stats, out sink) {
	g := lv(s.Group)
	var trips, entries uint64
	byState := make(map[framework.PartitionState]int, len(col.states))
	for i := range s.Partitions {
		p := &s.Partitions[i]
		trips += p.BreakerTrips
		entries += p.CarefulEntries
		byState[p.State]++
		col.partition(out, &s, p)
	}

	out.histogram(mHandlerDuration, &s.HandlerLatency, g)
	out.histogram(mFlushDuration, &s.FlushLatency, g)
	for i, n := range [...]uint64{s.Commits.OK, s.Commits.Fenced, s.Commits.Error, s.Commits.Unknown} {
		out.metric(mCommits, float64(n), g.with(commitOutcomes[i]))
	}
	out.metric(mRebalances, float64(s.Rebalances), g)
	out.metric(mRebalanceSeconds, s.RebalanceTime.Seconds(), g)
	out.metric(mRebalancing, flag(s.Rebalancing), g)
	out.metric(mPartitionsLost, float64(s.PartitionsLost), g)
	out.metric(mLostUncommitted, float64(s.LostUncommitted), g)
	out.metric(mRevokedUncommitted, float64(s.RevokedUncommitted), g)
	out.metric(mBreakerTrips, float64(trips), g)
	out.metric(mCarefulEntries, float64(entries), g)
	for _, st := range col.states {
		out.metric(mPartitions, float64(byState[st]), g.with(string(st)))
		delete(byState, st)
	}
	for st, n := range byState { // a state PartitionStates does not list
		out.metric(mPartitions, float64(n), g.with(string(st)))
	}
	out.metric(mGeneration, float64(s.Generation), g)
	if s.GroupProtocol != "" {
		out.metric(mGroupProtocol, 1, g.with(s.GroupProtocol))
	}
	if s.GroupProtocol == framework.GroupProtocolConsumer {
		out.metric(mMemberEpoch, float64(s.MemberEpoch), g)
	}
	out.metric(mOffsetFileError, flag(s.OffsetFileError != ""), g)
	out.metric(mFetchRequests, float64(s.FetchRequests), g)
	out.metric(mFetchSessionResets, float64(s.FetchSessionResets), g)
	out.metric(mConsumerBuffered, float64(s.BufferedBytes), g)
}

// partition sends one partition's series. Counters are sent for every
// partition the consumer owns or owned (they only grow); the gauges of its
// position and work only while it is owned (not revoked), so that a
// partition that moved is shown by its new owner alone; a position that is
// unknown (-1) is left out.
func (col *Collector) partition(out sink, s *framework.Stats, p *framework.PartitionStats) {
	l := lv(s.Group, p.Topic, strconv.Itoa(p.Partition))
	out.metric(mHandled, float64(p.Handled), l)
	out.metric(mHandlerErrors, float64(p.HandlerErrors), l)
	out.metric(mRetries, float64(p.Retries), l)
	out.metric(mDeadLettered, float64(p.DeadLettered), l)
	out.metric(mSkipped, float64(p.Skipped), l)
	if p.LastStable >= 0 { // ReadCommitted: a series the others do without
		out.metric(mAborted, float64(p.Aborted), l)
	}
	restored := s.StateChangelog != "" // series the consumers without a changelog do without
	if restored {
		out.metric(mRestoreRecords, float64(p.RestoreTotal), l)
	}
	if s.StateRebuild {
		out.metric(mStateRebuilds, float64(p.StateRebuilds), l)
	}
	known := false
	for _, st := range col.states {
		known = known || st == p.State
		out.metric(mPartitionState, flag(st == p.State), l.with(string(st)))
	}
	if !known { // a state PartitionStates does not list
		out.metric(mPartitionState, 1, l.with(string(p.State)))
	}
	if p.State == framework.StateRevoked {
		return
	}
	if p.HighWatermark >= 0 && p.Processed >= 0 {
		out.metric(mLag, float64(p.Lag), l)
		out.metric(mLagSeconds, p.LagTime.Seconds(), l)
	}
	for _, o := range [...]struct {
		i int
		v int64
	}{{mProcessed, p.Processed}, {mDurable, p.Durable}, {mCommitted, p.Committed}, {mHighWatermark, p.HighWatermark}, {mLastStable, p.LastStable}} {
		if o.v >= 0 {
			out.metric(o.i, float64(o.v), l)
		}
	}
	if p.LastStable >= 0 {
		out.metric(mTransactionWait, p.TransactionWait.Seconds(), l)
	}
	if p.Processed >= 0 && p.Durable >= 0 {
		out.metric(mUndurable, float64(max(p.Processed-p.Durable, 0)), l)
	}
	if p.Durable >= 0 && p.Committed >= 0 {
		out.metric(mUncommitted, float64(max(p.Durable-p.Committed, 0)), l)
	}
	out.metric(mInFlight, float64(p.InFlight), l)
	out.metric(mWaiting, float64(p.Waiting), l)
	out.metric(mBuffered, float64(p.BufferedBytes), l)
	out.metric(mCareful, flag(p.Careful), l)
	out.metric(mWindowFull, flag(p.WindowFull), l)
	out.metric(mDurableWait, flag(p.DurableWait), l)
	if restored {
		out.metric(mRestoring, flag(p.Restoring), l)
		out.metric(mRestoreRemaining, float64(p.RestoreRemaining), l)
	}
}

func flag(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// cumulative returns a Histogram's buckets as Prometheus has them: upper
// bounds in seconds and cumulative counts, +Inf left out (it is the count).
func (col *Collector) cumulative(h *framework.Histogram, f func(bound float64, count uint64)) {
	var cum uint64
	if len(h.Bounds) == 0 { // an empty Histogram: framework.LatencyBounds
		for _, b := range col.bounds {
			f(b, 0)
		}
		return
	}
	for j, b := range h.Bounds {
		if j < len(h.Counts) {
			cum += h.Counts[j]
		}
		f(b.Seconds(), cum)
	}
}

// promSink sends const metrics to a registry's channel.
type promSink struct {
	col *Collector
	ch  chan<- prometheus.Metric
}

// metric sends a counter or gauge; an error (a bug: wrong label count)
// goes to the registry as an invalid metric rather than a panic.
func (e promSink) metric(i int, v float64, l labels) {
	t := prometheus.GaugeValue
	if defs[i].kind == counter {
		t = prometheus.CounterValue
	}
	m, err := prometheus.NewConstMetric(e.col.descs[i], t, v, l.v[:l.n]...)
	if err != nil {
		m = prometheus.NewInvalidMetric(e.col.descs[i], err)
	}
	e.ch <- m
}

func (e promSink) histogram(i int, h *framework.Histogram, l labels) {
	buckets := make(map[float64]uint64, len(e.col.bounds))
	e.col.cumulative(h, func(b float64, n uint64) { buckets[b] = n })
	m, err := prometheus.NewConstHistogram(e.col.descs[i], h.Count, h.Sum.Seconds(), buckets, l.v[:l.n]...)
	if err != nil {
		m = prometheus.NewInvalidMetric(e.col.descs[i], err)
	}
	e.ch <- m
}

// Handler serves c's metrics in the Prometheus exposition formats, from a
// Collector of c and nothing else (register the Collector in your own
// registry to serve it beside other metrics). A scrape that accepts the
// text format, as Prometheus's always do, gets it written straight from
// one Stats snapshot, gzip-compressed when the client accepts it (see the
// package doc for why); any other format is served by promhttp over a
// registry of its own holding the Collector. Its signature fits
// framework.Config.MetricsHandler. If the Collector cannot be built (a nil
// Consumer), every request is answered 500 with the error.
func Handler(c *framework.Consumer) http.Handler {
	col, err := NewCollector(c)
	if err != nil {
		return errorHandler(err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(col); err != nil {
		return errorHandler(fmt.Errorf("tidemark metrics: %w", err))
	}
	return &handler{col: col, prom: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
}

func errorHandler(err error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	})
}
