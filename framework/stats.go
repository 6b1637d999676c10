package framework

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/handler"
)

// Stats is a snapshot of the consumer's state.
type Stats struct {
	Group      string `json:"group"`
	Generation int32  `json:"generation"` // current generation; 0 when not a member
	Member     string `json:"member"`     // member id in the current generation
	// GroupProtocol is Config.GroupProtocol: "classic", or "consumer"
	// (KIP-848), where Generation is the member epoch.
	GroupProtocol string `json:"group_protocol"`
	// MemberEpoch is the member epoch the coordinator gave this member
	// with GroupProtocol "consumer" (also in Generation, which commits
	// carry); 0 with "classic", and when not a member.
	MemberEpoch int32 `json:"member_epoch"`
	// StateChangelog is Config.StateChangelog (the changelog suffix; ""
	// without one) and StateRebuild Config.StateRebuild: which of the
	// partitions' restore and rebuild fields can move.
	StateChangelog string `json:"state_changelog,omitempty"`
	StateRebuild   bool   `json:"state_rebuild,omitempty"`
	// BufferedBytes is what is fetched and not yet handled, across all
	// partitions; it stays within Config.MaxBufferedBytes.
	BufferedBytes int64 `json:"buffered_bytes"`
	// FetchRequests counts the fetch requests sent since Run started.
	FetchRequests uint64 `json:"fetch_requests"`
	// FetchSessionResets counts the incremental fetch sessions (KIP-227) a
	// broker refused since Run started: evicted from its cache, or out of
	// step. Each costs one request that lists every partition; a steady
	// climb says the broker's max.incremental.fetch.session.cache.slots is
	// too small for its fetchers.
	FetchSessionResets uint64 `json:"fetch_session_resets"`
	// OffsetFileError is the error of the offset file's last write, ""
	// once a write succeeds again: while it is set, durable watermarks do
	// not move, and partitions stop at MaxUndurable (DurableWait).
	OffsetFileError string `json:"offset_file_error,omitempty"`
	// Rebalances counts the generations this consumer joined since Run
	// started. RebalanceTime is the time it spent joining them: from Run's
	// start, or the end of the generation before, until the new
	// generation's partitions were revoked and the added ones reconciled.
	// Rebalancing is set while that goes on.
	Rebalances    uint64        `json:"rebalances"`
	RebalanceTime time.Duration `json:"rebalance_time_ns"`
	Rebalancing   bool          `json:"rebalancing"`
	// PartitionsLost counts the partitions given up without a commit since
	// Run started, because the membership lapsed (no heartbeat or join
	// confirmed it for a session, the coordinator no longer knew the
	// member, another generation began) or was fenced. The next join
	// claims them back; those the group hands to other members instead are
	// handled again from Kafka's committed offset.
	PartitionsLost uint64 `json:"partitions_lost"`
	// LostUncommitted counts the messages those partitions had handled at
	// or above Kafka's last confirmed commit when they were given up: their
	// next owners handle at most this many again (none where this consumer
	// got them back).
	LostUncommitted uint64 `json:"lost_uncommitted"`
	// RevokedUncommitted counts the messages handled at or above Kafka's
	// last confirmed commit in partitions revoked (handed on at a
	// rebalance, or at a graceful stop) whose final commit did not land:
	// it is retried while it fails with a retriable error, until
	// RebalanceTimeout less one HeartbeatInterval (at a rebalance) or
	// DrainTimeout (at a graceful stop) has passed since the revoke began,
	// its drain included. Their next owners handle at most this many again
	// (none where this consumer gets them back).
	RevokedUncommitted uint64 `json:"revoked_uncommitted"`
	// HandoffOmitted counts the offsets completed above a revoked
	// partition's watermark that its final commit could not carry to the
	// next owner (the metadata is bounded under Kafka's 4,096 bytes): the
	// next owner handles them again. See docs/guarantees.md.
	HandoffOmitted uint64 `json:"handoff_omitted"`
	// JoinError is the error of the last attempt to join the group
	// (finding the coordinator, connecting to it, JoinGroup, SyncGroup),
	// naming the brokers it tried; "" once a join succeeds.
	// JoinFailingSince is when the attempts began failing, JoinFailures how
	// many failed in a row.
	JoinError        string    `json:"join_error,omitempty"`
	JoinFailingSince time.Time `json:"join_failing_since,omitzero"`
	JoinFailures     int       `json:"join_failures,omitempty"`
	// MissingTopics lists the subscribed topics (Config.Topics) that the
	// last metadata read said do not exist (a typo, not created yet),
	// sorted: nothing of them is consumed, Ready fails naming them, and a
	// warning is logged when the list changes. A topic created later is
	// assigned at the next partition watch (within 5 s) and leaves the
	// list.
	MissingTopics []string `json:"missing_topics,omitempty"`
	// DeadLetterError says why a dead-letter topic takes no messages now:
	// it could not be checked yet (Kafka unreachable when Run started), or
	// its last write failed (a partition holds in StateDeadLettering and
	// retries); "" once a check or a write succeeds. DeadLetterErrorSince
	// is when it began. With several topics, the oldest trouble.
	DeadLetterError      string    `json:"dead_letter_error,omitempty"`
	DeadLetterErrorSince time.Time `json:"dead_letter_error_since,omitzero"`
	// Commits counts the commit requests sent to Kafka, by outcome.
	Commits CommitCounts `json:"commits"`
	// HandlerLatency is the distribution of Handler (BatchHandler) call
	// durations, retries included; empty unless MeasureHandlerLatency was
	// called. Calls of 100 µs or more are each timed; quicker ones are
	// sampled, one in 16 timed and counted 16 times, so Count matches the
	// calls on average, not exactly. FlushLatency is the distribution of the offset file's flushes:
	// journal writes and checkpoints (transactions, fsync included).
	HandlerLatency Histogram        `json:"handler_latency"`
	FlushLatency   Histogram        `json:"flush_latency"`
	Partitions     []PartitionStats `json:"partitions"`
}

// CommitCounts counts commit requests by outcome (see
// PartitionStats.LastCommit): one request commits every partition it
// carries.
type CommitCounts struct {
	OK      uint64 `json:"ok"`
	Fenced  uint64 `json:"fenced"`
	Error   uint64 `json:"error"`
	Unknown uint64 `json:"unknown"`
}

// PartitionState is the lifecycle state of a partition in this consumer.
type PartitionState string

// Partition states, as shown in Stats and logs.
const (
	StateReconciling   PartitionState = "reconciling"    // assigned; comparing the offset file with Kafka
	StateRunning       PartitionState = "running"        // fetching and handling
	StateRetrying      PartitionState = "retrying"       // the Handler failed on a message; retrying it with backoff
	StateStalled       PartitionState = "stalled"        // stopped by policy (out of range with Stall); needs an operator
	StateStopped       PartitionState = "stopped"        // the Stop failure policy gave up on a message; waiting for Resume
	StatePaused        PartitionState = "paused"         // paused by Consumer.Pause; waiting for Resume
	StateDeadLettering PartitionState = "dead-lettering" // writing a message to the dead-letter topic failed; retrying
	StateDraining      PartitionState = "draining"       // revoked; waiting for the Handler call in flight
	StateRevoked       PartitionState = "revoked"        // not assigned to this consumer now
)

// PartitionStates returns every PartitionState, in lifecycle order: a new
// slice on each call. Monitoring that shows one series per state (package
// metrics) takes the list from here.
func PartitionStates() []PartitionState {
	return []PartitionState{StateReconciling, StateRunning, StateRetrying, StateStalled, StateStopped,
		StatePaused, StateDeadLettering, StateDraining, StateRevoked}
}

// PartitionStats describes one partition this consumer owns or owned.
// Offsets are "next offset" positions, like Kafka's committed offsets; -1
// means unknown.
type PartitionStats struct {
	Topic     string         `json:"topic"`
	Partition int            `json:"partition"`
	State     PartitionState `json:"state"`
	// Processed is the in-memory watermark: every offset below it was
	// handled (or does not exist).
	Processed int64 `json:"processed"`
	// Durable is the watermark recorded in the offset file: what the next
	// run resumes from after this process dies (SIGKILL, OOM).
	Durable int64 `json:"durable"`
	// Synced is the watermark of the offset file's last fsync (see
	// Config.SyncInterval): what survives a crash of the machine, and what
	// the committer sends to Kafka.
	Synced int64 `json:"synced"`
	// Committed is the offset Kafka last confirmed for the group.
	Committed int64 `json:"committed"`
	// HighWatermark is the log end seen by the last fetch; Lag is
	// HighWatermark - Processed.
	HighWatermark int64 `json:"high_watermark"`
	Lag           int64 `json:"lag"`
	// LastStable is the last stable offset (LSO) seen by the last fetch at
	// IsolationLevel kafka.ReadCommitted, -1 at ReadUncommitted: every
	// transaction below it is decided, and Lag is LastStable - Processed.
	// TransactionWait is how long the partition has been held at
	// LastStable, below HighWatermark, by a transaction still open: it
	// handled all it may, and the rest waits for that transaction's commit
	// or abort. 0 when not held.
	LastStable      int64         `json:"last_stable_offset"`
	TransactionWait time.Duration `json:"transaction_wait_ns"`
	// Aborted counts the records of aborted transactions dropped at
	// ReadCommitted since the consumer started.
	Aborted uint64 `json:"aborted"`
	// Handled counts the messages done since the consumer started: handled
	// by the Handler, or given up on by the failure policy (dead-lettered
	// or skipped, which DeadLettered and Skipped count too).
	Handled uint64 `json:"handled"`
	// BufferedBytes is what is fetched for this partition and not yet
	// handled.
	BufferedBytes int64 `json:"buffered_bytes"`
	// Attempts is the number of attempts on the message at Processed while
	// it is failing; 0 when the partition is not retrying.
	Attempts int `json:"attempts"`
	// LastError is the last Handler or fetch error, or reset, if any, and
	// LastErrorAt when it happened. It stays after the partition recovered
	// (State says whether it is in trouble now), so that the cause of a
	// past stall or retry can still be read; its time tells how old it is.
	LastError   string    `json:"last_error"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// PanicStack is the goroutine's stack when LastError is a Handler's
	// panic (a *handler.PanicError), "" otherwise.
	PanicStack string `json:"panic_stack,omitempty"`
	// CommitError is the error of the last commit to Kafka if it failed; it
	// is cleared by the next successful commit.
	CommitError string `json:"commit_error"`
	// LastCommit is the outcome of the last commit attempt: "ok", "fenced",
	// "error", "unknown" (no answer; confirmed at the next commit), or ""
	// before the first one. The offset file keeps the full ledger.
	LastCommit string `json:"last_commit"`
	// Paused is set between Pause and Resume.
	Paused bool `json:"paused"`
	// DeadLettered and Skipped count the messages the failure policy gave
	// up on since the consumer started (the offset file keeps totals and a
	// list).
	DeadLettered uint64 `json:"dead_lettered"`
	Skipped      uint64 `json:"skipped"`
	// UncleanRestarts is the crash-loop breaker's count for the message in
	// flight: unclean restarts in a row that each had it in flight. Careful
	// is set while the partition, after an unclean end, makes each offset
	// durable around its Handler call.
	UncleanRestarts int32 `json:"unclean_restarts"`
	Careful         bool  `json:"careful"`
	// InFlight counts the messages in Handler (or BatchHandler) calls;
	// Waiting those fetched and waiting for an earlier message of their key
	// (OrderKey) or for a call slot. CompletedAhead counts the messages
	// completed above Processed, waiting for an older one: recorded in the
	// offset file, never handled again by this consumer.
	InFlight       int `json:"in_flight"`
	Waiting        int `json:"waiting"`
	CompletedAhead int `json:"completed_ahead"`
	// OldestIncomplete is the oldest offset taken for handling and not yet
	// done (the one holding Processed back), -1 if none; OldestAge how long
	// ago it was taken.
	OldestIncomplete int64         `json:"oldest_incomplete"`
	OldestAge        time.Duration `json:"oldest_age_ns"`
	// WindowFull is set while the partition takes no new message because
	// MaxWindow messages are pending above Processed: OldestIncomplete is
	// holding them all.
	WindowFull bool `json:"window_full"`
	// DurableWait is set while the partition waits for the offset file to
	// make its handled messages durable (MaxUndurable reached): the disk is
	// slow, or failing (see Stats.OffsetFileError).
	DurableWait bool `json:"durable_wait"`
	// LagTime is the lag in time: the age, from its record timestamp, of
	// the oldest message not handled yet; 0 when Lag is 0. It is exact
	// while that message is taken for handling (fetched, decoded); when it
	// is not fetched yet, LagTime is the age of the last message taken,
	// which is at least as old.
	LagTime time.Duration `json:"lag_time_ns"`
	// HandlerErrors counts the Handler (BatchHandler) calls that failed
	// (returned an error or panicked); Retries the calls that tried a
	// message again after a failure.
	HandlerErrors uint64 `json:"handler_errors"`
	Retries       uint64 `json:"retries"`
	// BreakerTrips counts the messages the crash-loop breaker gave to the
	// failure policy; CarefulEntries the runs that started in careful mode
	// after an unclean end.
	BreakerTrips   uint64 `json:"breaker_trips"`
	CarefulEntries uint64 `json:"careful_entries"`
	// Restoring is set while the partition's state is restored from its
	// changelog (Config.StateChangelog; the partition is reconciling
	// meanwhile, and Ready waits for it); RestoreTotal counts the
	// changelog records it read and RestoreRemaining those left (Kafka
	// Streams' restore-total and restore-remaining-records-total).
	Restoring        bool   `json:"restoring"`
	RestoreTotal     uint64 `json:"restore_total"`
	RestoreRemaining int64  `json:"restore_remaining"`
	// StateRebuilds counts the times the partition's state was emptied
	// and rebuilt from the log start (Config.StateRebuild).
	StateRebuilds uint64 `json:"state_rebuilds,omitempty"`
}

// Stats returns a snapshot of every partition this consumer owns or owned,
// sorted by topic and partition. It is safe to call at any time, from any
// goroutine, including after Run returned.
func (c *Consumer) Stats() Stats {
	gen, member := c.identity.get()
	ms := c.member.status()
	s := Stats{Group: c.cfg.GroupID, Generation: max(gen, 0), Member: member, GroupProtocol: c.cfg.GroupProtocol,
		StateChangelog: c.cfg.StateChangelog, StateRebuild: c.cfg.StateRebuild}
	if s.GroupProtocol == GroupProtocolConsumer {
		s.MemberEpoch = s.Generation
	}
	s.BufferedBytes, s.FetchRequests = c.fetcher.buffered.Load(), c.fetcher.requests.Load()
	s.FetchSessionResets = c.fetcher.sessionResets.Load()
	s.Rebalances, s.RebalanceTime, s.Rebalancing = ms.rebalances, ms.rebalanceTime, ms.rebalancing
	s.PartitionsLost, s.LostUncommitted = c.assignment.lost.Load(), c.assignment.lostUncommitted.Load()
	s.RevokedUncommitted = c.assignment.revokedUncommitted.Load()
	s.HandoffOmitted = c.committer.handoffOmitted.Load()
	s.JoinError, s.JoinFailingSince, s.JoinFailures = ms.joinErr, ms.joinSince, ms.joinFailures
	s.MissingTopics = ms.missing
	s.DeadLetterError, s.DeadLetterErrorSince = c.deadLetters.status()
	s.Commits = c.committer.counts()
	s.FlushLatency = c.flushLatency.snapshot()
	if err := c.store.Err(); err != nil {
		s.OffsetFileError = err.Error()
	}
	parts := c.board.list()
	var calls latency // the partitions' Handler latencies, summed
	for _, p := range parts {
		if h := p.latency.Load(); h != nil {
			calls.add(h)
		}
	}
	s.HandlerLatency = calls.snapshot()
	for _, p := range parts {
		key := storeKey(c.cfg.GroupID, p.tp)
		s.Partitions = append(s.Partitions, p.snapshot(func() (synced, durable int64) {
			s, _ := c.store.Synced(key)
			d, _ := c.store.Durable(key)
			return s.Watermark, d.Watermark
		}))
	}
	sort.Slice(s.Partitions, func(i, j int) bool {
		a, b := s.Partitions[i], s.Partitions[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
	return s
}

// partitionBoard holds the partitionStats of every partition this consumer
// owned or paused, for Stats and Pause. The assignment takes a partition's
// record from it at each assignment; Pause and Resume use it from any
// goroutine. mu guards the maps.
type partitionBoard struct {
	mu    sync.Mutex
	parts map[topicPartition]*partitionStats
	// pending holds the paused partitions never assigned to this consumer:
	// kept out of Stats (the partition may not even exist) until assigned.
	pending map[topicPartition]*partitionStats
}

func newPartitionBoard() *partitionBoard {
	return &partitionBoard{parts: map[topicPartition]*partitionStats{}, pending: map[topicPartition]*partitionStats{}}
}

// reserve makes room for n more partitions (see reserved).
func (b *partitionBoard) reserve(n int) {
	b.mu.Lock()
	b.parts = reserved(b.parts, n)
	b.mu.Unlock()
}

// get returns the long-lived record of a partition assigned now, created
// on its first assignment and kept across generations for Stats.
func (b *partitionBoard) get(tp topicPartition) *partitionStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.parts[tp]
	if p == nil {
		if p = b.pending[tp]; p != nil {
			delete(b.pending, tp) // paused before its first assignment
		} else {
			p = newPartitionStats(tp)
		}
		b.parts[tp] = p
	}
	return p
}

// pausable returns tp's record for Pause and Resume: a pending one if tp
// was never assigned.
func (b *partitionBoard) pausable(tp topicPartition) *partitionStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.parts[tp]; st != nil {
		return st
	}
	st := b.pending[tp]
	if st == nil {
		st = newPartitionStats(tp)
		st.state = StateRevoked // not assigned yet
		b.pending[tp] = st
	}
	return st
}

// forgetPending drops a pause of a partition never assigned.
func (b *partitionBoard) forgetPending(tp topicPartition) {
	b.mu.Lock()
	delete(b.pending, tp)
	b.mu.Unlock()
}

// list returns the records of the partitions assigned at least once.
func (b *partitionBoard) list() []*partitionStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*partitionStats, 0, len(b.parts))
	for _, p := range b.parts {
		out = append(out, p)
	}
	return out
}

// partitionStats is what Stats reports about a partition. It outlives
// generations: a partition keeps its counters when it is revoked and
// assigned again. The partition's goroutine and its workers, the group
// loop (reconciliation, revokes), the committer and the fetcher write it;
// Stats reads it from any goroutine. Its counters are atomics, the rest is
// guarded by mu; its gate (gate.go) has its own lock.
type partitionStats struct {
	tp topicPartition

	processed atomic.Int64
	hwm       atomic.Int64
	committed atomic.Int64
	handled   atomic.Uint64
	buffered  atomic.Int64 // fetched, not yet handled: kept by the fetcher
	// rareP holds the counters of what most partitions never do; made at
	// the first write (rare).
	rareP atomic.Pointer[rareStats]

	slowCalls atomic.Bool // the last timed Handler call took slowCall or more (invoke)
	// latency is the Handler call durations (invoke), summed into
	// Stats.HandlerLatency; made at the first timed call (histogram).
	latency atomic.Pointer[latency]
	// inFlight and waiting count the messages in calls and waiting for
	// their key (dispatch.go); windowFull is set while the partition waits
	// for room in MaxWindow; tracker is the running partition's, for its
	// oldest incomplete offset.
	inFlight   atomic.Int64
	waiting    atomic.Int64
	windowFull atomic.Bool
	// durableWait is set while the partition waits for the offset file
	// (MaxUndurable).
	durableWait atomic.Bool
	tracker     atomic.Pointer[tracker]

	mu         sync.Mutex
	state      PartitionState
	attempts   int
	lastErr    string
	panicStack string    // of lastErr, when it is a Handler's panic
	errAt      time.Time // when lastErr was set
	// commitErr is the last commit's error, "" once a commit succeeded.
	commitErr string
	// lastCommit is the outcome of the last commit attempt.
	lastCommit string
	// gate is Pause, Resume and the messages Stop holds (gate.go); state
	// is what the partition's owner says it does, and Stats shows the two
	// together (gate.show).
	gate gate
}

// rareStats are a partition's counters of failures, careful mode,
// transactions, restores and rebuilds: a partition of a wide topic that
// sees none of them does not carry them (partitionStats.rare). Their
// writers are those of partitionStats.
type rareStats struct {
	// lso is the last stable offset at ReadCommitted (-1 otherwise);
	// heldLSO and heldSince say since when fetching has been held at the
	// LSO heldLSO by an open transaction (0: not held). Kept by the
	// fetcher. aborted counts the dropped records (the partition's
	// goroutine).
	lso       atomic.Int64
	heldLSO   atomic.Int64
	heldSince atomic.Int64
	aborted   atomic.Uint64

	deadLettered atomic.Uint64
	skipped      atomic.Uint64
	unclean      atomic.Int32 // unclean restarts in a row with the current message in flight
	careful      atomic.Bool

	handlerErrors  atomic.Uint64
	retries        atomic.Uint64
	breakerTrips   atomic.Uint64
	carefulEntries atomic.Uint64
	// restoring, restoreTotal and restoreRemaining are a restore's
	// progress (restore.go).
	restoring        atomic.Bool
	restoreTotal     atomic.Uint64
	restoreRemaining atomic.Int64
	// rebuilds counts StateRebuild's rebuilds (reconcile.go).
	rebuilds atomic.Uint64
}

func newRareStats() *rareStats {
	r := &rareStats{}
	r.lso.Store(-1)
	return r
}

// noRare is what a partition without rareStats shows: never written.
var noRare = newRareStats()

// rare returns p's rareStats for a write, made at the first; any
// goroutine may call it.
func (p *partitionStats) rare() *rareStats {
	if r := p.rareP.Load(); r != nil {
		return r
	}
	if r := newRareStats(); p.rareP.CompareAndSwap(nil, r) {
		return r
	}
	return p.rareP.Load()
}

// rareView returns p's rareStats for a read, or noRare: it never makes one.
func (p *partitionStats) rareView() *rareStats {
	if r := p.rareP.Load(); r != nil {
		return r
	}
	return noRare
}

// setCareful shows whether the partition runs in careful mode; clearing
// it makes no rareStats.
func (p *partitionStats) setCareful(on bool) {
	if on {
		p.rare().careful.Store(true)
	} else if r := p.rareP.Load(); r != nil {
		r.careful.Store(false)
	}
}

func newPartitionStats(tp topicPartition) *partitionStats {
	p := &partitionStats{tp: tp, state: StateReconciling}
	p.processed.Store(-1)
	p.hwm.Store(-1)
	p.committed.Store(-1)
	p.slowCalls.Store(true) // time the first calls until one is quick
	return p
}

// histogram returns the partition's Handler latency histogram, made at the
// first call: 10,000 partitions whose calls are never timed keep none.
func (p *partitionStats) histogram() *latency {
	if h := p.latency.Load(); h != nil {
		return h
	}
	p.latency.CompareAndSwap(nil, new(latency))
	return p.latency.Load()
}

func (p *partitionStats) setState(s PartitionState) {
	p.mu.Lock()
	p.state = s
	if s == StateRunning {
		// A stop or a revoke keeps the count of the message it held.
		p.attempts = 0
	}
	p.mu.Unlock()
}

func (p *partitionStats) setRetrying(attempts int, err error) {
	p.mu.Lock()
	p.state = StateRetrying
	p.attempts = attempts
	p.lastErr, p.errAt, p.panicStack = err.Error(), time.Now(), panicStack(err)
	p.mu.Unlock()
}

func (p *partitionStats) setDeadLettering(err error) {
	p.mu.Lock()
	p.state = StateDeadLettering
	p.lastErr, p.errAt, p.panicStack = err.Error(), time.Now(), panicStack(err)
	p.mu.Unlock()
}

func (p *partitionStats) setError(err error) {
	p.mu.Lock()
	p.lastErr, p.errAt, p.panicStack = err.Error(), time.Now(), panicStack(err)
	p.mu.Unlock()
}

func (p *partitionStats) setCommitError(err error) {
	p.mu.Lock()
	if err == nil {
		p.commitErr = ""
	} else {
		p.commitErr = err.Error()
	}
	p.mu.Unlock()
}

// observeLSO records a fetch's last stable offset and high watermark,
// and whether that fetch reached next, the LSO of an open transaction.
func (p *partitionStats) observeLSO(lso, hwm, next int64, now time.Time) {
	r := p.rare()
	r.lso.Store(lso)
	switch {
	case lso >= hwm || next < lso:
		r.heldSince.Store(0)
	case r.heldSince.Load() == 0 || r.heldLSO.Load() != lso:
		r.heldLSO.Store(lso)
		r.heldSince.Store(now.UnixNano())
	}
}

func (p *partitionStats) setLastCommit(outcome string) {
	p.mu.Lock()
	p.lastCommit = outcome
	p.mu.Unlock()
}

// snapshot reads the offsets in the order they advance (Kafka's committed
// offset, then the synced and durable watermarks from the file func, then
// the processed one), so that a snapshot taken while they move still shows
// committed <= synced <= durable <= processed. Kafka's offset above the
// file's checkpoint (reconciliation resumed at Kafka's offset, or moved back
// below it, and the checkpoint has not caught up) shows as -1, unknown.
func (p *partitionStats) snapshot(file func() (synced, durable int64)) PartitionStats {
	s := PartitionStats{Topic: p.tp.topic, Partition: int(p.tp.partition)}
	s.Committed = p.committed.Load()
	s.Synced, s.Durable = file()
	if s.Committed > s.Synced {
		s.Committed = -1
	}
	s.Processed = p.processed.Load()
	s.HighWatermark = p.hwm.Load()
	s.Handled = p.handled.Load()
	s.BufferedBytes = p.buffered.Load()
	r := p.rareView()
	s.LastStable, s.Aborted = r.lso.Load(), r.aborted.Load()
	end := s.HighWatermark
	if s.LastStable >= 0 {
		end = s.LastStable
		if since := r.heldSince.Load(); since > 0 && s.Processed >= s.LastStable && s.LastStable < s.HighWatermark {
			s.TransactionWait = max(time.Since(time.Unix(0, since)), 0)
		}
	}
	if end >= 0 && s.Processed >= 0 {
		s.Lag = max(end-s.Processed, 0)
	}
	s.DeadLettered, s.Skipped = r.deadLettered.Load(), r.skipped.Load()
	s.UncleanRestarts, s.Careful = r.unclean.Load(), r.careful.Load()
	s.InFlight, s.Waiting = int(p.inFlight.Load()), int(p.waiting.Load())
	s.WindowFull, s.OldestIncomplete = p.windowFull.Load(), -1
	s.DurableWait = p.durableWait.Load()
	s.HandlerErrors, s.Retries = r.handlerErrors.Load(), r.retries.Load()
	s.BreakerTrips, s.CarefulEntries = r.breakerTrips.Load(), r.carefulEntries.Load()
	s.Restoring, s.RestoreTotal, s.StateRebuilds = r.restoring.Load(), r.restoreTotal.Load(), r.rebuilds.Load()
	if s.Restoring {
		s.RestoreRemaining = r.restoreRemaining.Load()
	}
	if tr := p.tracker.Load(); tr != nil {
		var at, ts int64
		s.CompletedAhead, s.OldestIncomplete, at, ts = tr.state()
		if tr.calling() {
			s.InFlight++ // a direct-mode call, which only the tracker shows
		}
		if at > 0 {
			s.OldestAge = max(time.Since(time.Unix(0, at)), 0)
		}
		if s.Lag > 0 && ts > 0 {
			s.LagTime = max(time.Since(time.Unix(0, ts)), 0)
		}
	}
	p.mu.Lock()
	base := p.state
	s.Attempts, s.LastError, s.LastErrorAt, s.CommitError = p.attempts, p.lastErr, p.errAt, p.commitErr
	s.PanicStack, s.LastCommit = p.panicStack, p.lastCommit
	p.mu.Unlock()
	s.State, s.Paused = p.gate.show(base, int64(s.InFlight))
	return s
}

// panicStack is the stack a *handler.PanicError in err's chain carries, or
// "".
func panicStack(err error) string {
	if pe, ok := errors.AsType[*handler.PanicError](err); ok {
		return string(pe.Stack)
	}
	return ""
}
