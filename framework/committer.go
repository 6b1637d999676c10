package framework

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// committer is the last stage of the data path: its goroutine (run)
// commits the synced watermarks (never the processed ones) of the owned
// partitions to Kafka every CommitInterval and when reconciliation asks
// (soon), a revoke commits those of the partitions it stops, and each attempt is
// recorded in the offset file's commit ledger. Commits carry the
// membership's current generation, member id and instance id. mu lets one
// commit run at a time and guards the fields below it and the partitions'
// commit fields (committed, unknown).
type committer struct {
	cfg         *Config
	log         *zap.Logger
	ident       *identity
	owned       *ownedPartitions
	coordinator *coordinator
	store       *offsetfile.Store
	watch       *loopWatch // run's liveness (liveness.go)
	// capped, when set (a changelog: changelog.capFor), is the highest
	// offset Kafka may hold as committed for a partition: a synced
	// watermark above it is committed as far as it.
	capped func(offsetfile.Key) int64

	// outcomes counts the commit requests by offsetfile.CommitOutcome,
	// for Stats.
	outcomes [offsetfile.CommitUnknown + 1]atomic.Uint64

	// handoffOmitted counts offsets completed above a revoked partition's
	// watermark that its final commit's metadata could not carry.
	handoffOmitted atomic.Uint64

	// kick asks run for a round now (soon).
	kick chan struct{}

	mu         sync.Mutex
	fencedGen  int32 // commits of this generation were refused: skipped
	failures   int   // failed in a row
	failedFrom time.Time
}

// newCommitter makes the committer of the owned partitions, which commits
// with ident's generation through coordinator what store holds synced.
func newCommitter(cfg *Config, log *zap.Logger, ident *identity, owned *ownedPartitions, coordinator *coordinator,
	store *offsetfile.Store, watch *loopWatch) *committer {
	return &committer{cfg: cfg, log: log, ident: ident, owned: owned, coordinator: coordinator, store: store,
		watch: watch, fencedGen: -1, kick: make(chan struct{}, 1)}
}

// counts is the commit requests by outcome, for Stats.
func (k *committer) counts() CommitCounts {
	return CommitCounts{OK: k.outcomes[offsetfile.CommitOK].Load(), Fenced: k.outcomes[offsetfile.CommitFenced].Load(),
		Error: k.outcomes[offsetfile.CommitError].Load(), Unknown: k.outcomes[offsetfile.CommitUnknown].Load()}
}

// run commits every CommitInterval, and when soon asks, until ctx ends.
// Run starts it and waits for it.
func (k *committer) run(ctx context.Context) {
	t := time.NewTicker(k.cfg.CommitInterval)
	defer t.Stop()
	for {
		reason := "interval"
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-k.kick:
			reason = "reconciliation"
		}
		k.watch.busy() // liveness (liveness.go)
		k.sync(ctx)
		_ = k.commit(k.owned.all(), reason) // logged; retried at the next tick
		k.watch.idle()
	}
}

// soon asks for a round at once, without waiting for it: reconciliation
// decided positions Kafka does not hold yet. The round checkpoints them
// first, as every round does.
func (k *committer) soon() {
	select {
	case k.kick <- struct{}{}:
	default: // a round is asked for already
	}
}

// sync asks the offset file for a checkpoint before a commit, so that what
// was handled reaches Kafka within CommitInterval whatever SyncInterval
// says. It waits at most CommitInterval (50 ms at least): a disk that stalls
// delays commits, it does not stop the committer.
func (k *committer) sync(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, max(k.cfg.CommitInterval, 50*time.Millisecond))
	defer cancel()
	if err := k.store.Sync(sctx); err != nil && ctx.Err() == nil {
		k.log.Debug("the offset file's checkpoint before a commit did not finish; committing what is synced", zap.Error(err))
	}
}

// commit sends the synced watermark of each partition of parts
// that differs from what Kafka last confirmed. Only synced (fsync-ed)
// offsets are ever committed, so Kafka's committed offset never passes the
// offset file; none below the partition's commitFloor, so it never moves
// back to a checkpoint older than where the partition resumed. It returns nil once Kafka confirmed every one of them (or
// there was nothing to send), else why not: a revoke retries on a
// retriable error (see assignment.finalCommit).
func (k *committer) commit(parts []*partition, reason string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	gen, id := k.ident.get()
	switch {
	case gen < 0:
		return errNotMember
	case gen == k.fencedGen:
		return fmt.Errorf("generation %d: %w", gen, errGenerationFenced)
	}
	k.confirmUnknown(parts)
	offsets := map[string]map[int32]int64{}
	var meta map[topicPartition]string
	var todo []*partition
	var omitted int64
	for _, p := range parts {
		if p.heldFor != "" && p.heldFor != reason {
			continue // a revoke holds it for its final commit (hold)
		}
		wm, completed, ok := k.committable(p)
		if !ok {
			continue
		}
		// The ranges completed above the watermark ride along (handoff.go).
		m, left := encodeHandoff(wm, completed)
		if wm == p.committed && m == p.committedMeta {
			continue
		}
		if offsets[p.tp.topic] == nil {
			offsets[p.tp.topic] = map[int32]int64{}
		}
		offsets[p.tp.topic][p.tp.partition] = wm
		if m != "" || p.committedMeta != "" {
			if meta == nil {
				meta = map[topicPartition]string{}
			}
			meta[p.tp] = m
		}
		omitted += left
		todo = append(todo, p)
	}
	if len(todo) == 0 {
		return nil
	}
	// Requests in partition order, whatever order parts came in.
	slices.SortFunc(todo, func(x, y *partition) int { return compareTP(x.tp, y.tp) })
	start := time.Now()
	err := k.commitLedgered(offsets, meta, todo, gen, id)
	k.onCommit(reason, offsets, gen, id, start, err)
	if err != nil {
		for _, p := range todo {
			p.st.setCommitError(fmt.Errorf("commit (%s) of %s/%d: %w", reason, p.tp.topic, p.tp.partition, err))
		}
		if isFenced(err) {
			k.fencedGen = gen
			k.log.Warn("commit fenced: the generation ended; the offset file keeps the watermarks and the next owner reconciles them",
				zap.Int32("generation", gen), zap.Error(err))
			return err
		}
		k.failures++
		if k.failures == 1 {
			k.failedFrom = start
		}
		// A revoke's retries log their own outcome (finalCommit).
		if logWorthy(k.failures) {
			k.log.Warn("commit failed; the offset file keeps the watermarks and the committer retries",
				zap.String("reason", reason), zap.Int("failures_in_a_row", k.failures), zap.Any("offsets", offsets), zap.Error(err))
		}
		return err
	}
	if k.failures > 0 {
		k.log.Info("commits succeed again", zap.Int("failed_in_a_row", k.failures),
			zap.Duration("outage", time.Since(k.failedFrom)), zap.Any("offsets", offsets))
		k.failures = 0
	}
	for _, p := range todo {
		p.st.setCommitError(nil)
	}
	if omitted > 0 && reason != "interval" {
		// A hand-off: the next owner handles these again.
		k.handoffOmitted.Add(uint64(omitted))
		k.log.Warn("the final commit's metadata could not carry every range completed above the watermark; the next owner handles the rest again",
			zap.String("reason", reason), zap.Int64("offsets", omitted))
	}
	k.log.Debug("committed", zap.String("reason", reason), zap.Int("partitions", len(todo)), zap.Duration("took", time.Since(start)))
	return nil
}

// A CommitEvent describes one commit of offsets to Kafka, for
// Config.OnCommit. A commit of many partitions may go out as several
// requests (each of at most 512 KiB of offsets); the event covers them all.
// No event is made when there was nothing to commit or no request was sent
// (no generation, or one whose commits were refused already).
type CommitEvent struct {
	// GroupID, Generation and MemberID are the group identity the commit
	// was sent with.
	GroupID    string
	Generation int32
	MemberID   string
	// Reason is why the commit was sent: "interval" (every
	// CommitInterval), "reconciliation" (positions Kafka did not hold), or
	// a revoke's final commit: "rebalance", "eager rebalance", "shutdown".
	// A revoke whose commit fails with a retriable error tries again: each
	// try is an event.
	Reason string
	// Offsets are the committed positions, sorted by topic and partition:
	// each the next offset to handle, as Kafka stores it.
	Offsets []CommitOffset
	// Start is when the commit was sent and Duration how long Kafka took
	// to answer all of it (or the requests took to fail).
	Start    time.Time
	Duration time.Duration
	// Err is nil when Kafka confirmed every offset; else the first
	// request's error (a refused generation wraps kafka.IllegalGeneration,
	// kafka.UnknownMemberId or kafka.FencedInstanceID).
	Err error
}

// A CommitOffset is one partition's position in a CommitEvent.
type CommitOffset struct {
	Topic     string
	Partition int
	Offset    int64
}

// onCommit tells Config.OnCommit about the commit of offsets sent at start
// with generation gen and member id, which ended with err.
func (k *committer) onCommit(reason string, offsets map[string]map[int32]int64, gen int32, id string, start time.Time, err error) {
	if k.cfg.OnCommit == nil {
		return
	}
	ev := CommitEvent{GroupID: k.cfg.GroupID, Generation: gen, MemberID: id, Reason: reason,
		Start: start, Duration: time.Since(start), Err: err}
	for topic, parts := range offsets {
		for p, off := range parts {
			ev.Offsets = append(ev.Offsets, CommitOffset{Topic: topic, Partition: int(p), Offset: off})
		}
	}
	slices.SortFunc(ev.Offsets, func(a, b CommitOffset) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return a.Partition - b.Partition
	})
	k.cfg.OnCommit(ev)
}

// hold keeps the background rounds from committing parts, drained by a
// revoke for reason: only the revoke's final commit (of that reason) sends
// them, after OnRevoked. A round in progress finishes first.
func (k *committer) hold(parts []*partition, reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range parts {
		p.heldFor = reason
	}
}

// uncommitted returns the partitions of parts whose synced watermark
// Kafka has not confirmed.
func (k *committer) uncommitted(parts []*partition) []*partition {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*partition
	for _, p := range parts {
		if wm, _, ok := k.committable(p); ok && wm != p.committed {
			out = append(out, p)
		}
	}
	return out
}

// committable is p's synced record as far as it may be committed: its
// watermark capped (capped), without the completed ranges then; ok is
// false when there is nothing to commit.
func (k *committer) committable(p *partition) (int64, []offsetfile.Range, bool) {
	wm, completed, ok := k.store.SyncedProgress(p.key)
	if !ok || wm < 0 || wm < p.commitFloor.Load() {
		return wm, nil, false
	}
	if k.capped == nil {
		return wm, completed, true
	}
	if c := k.capped(p.key); c < wm {
		if c < 0 || c <= p.committed {
			return wm, nil, false
		}
		wm, completed = c, nil
	}
	return wm, completed, true
}

// errNotMember and errGenerationFenced are why commit sent nothing: no
// generation to commit with, or one whose commits Kafka refused already.
var (
	errNotMember        = errors.New("not a member of a generation")
	errGenerationFenced = errors.New("commits of this generation were refused (fenced)")
)

// commitLedgered commits offsets (the watermarks of todo) and records the
// attempt in each partition's commit ledger: offset, generation, time,
// outcome and latency. A confirmed commit updates the partition's committed
// offset; an unknown outcome is kept to confirm at the next commit.
func (k *committer) commitLedgered(offsets map[string]map[int32]int64, meta map[topicPartition]string, todo []*partition, gen int32, id string) error {
	chunks := commitChunks(k.cfg.GroupID, todo, meta, maxCommitBytes)
	if len(chunks) == 1 {
		return k.commitChunk(offsets, meta, todo, gen, id)
	}
	var first error
	for _, chunk := range chunks {
		sub := map[string]map[int32]int64{}
		for _, p := range chunk {
			if sub[p.tp.topic] == nil {
				sub[p.tp.topic] = map[int32]int64{}
			}
			sub[p.tp.topic][p.tp.partition] = offsets[p.tp.topic][p.tp.partition]
		}
		err := k.commitChunk(sub, meta, chunk, gen, id)
		if err != nil && first == nil {
			first = err
		}
		if isFenced(err) {
			break // the others would be refused too
		}
	}
	return first
}

// Kafka's group coordinator writes a commit's offsets to __consumer_offsets
// as one batch, which may not pass the topic's max.message.bytes (1 MiB by
// default): a commit of 10,000 partitions is refused whole
// (UNKNOWN_SERVER_ERROR, "larger than the maximum batch size"), every time.
// So a commit is sent in requests of at most maxCommitBytes of offsets, as
// the coordinator encodes them (commitBytes).
const maxCommitBytes = 512 << 10

// commitBytes is about what one partition's offset takes in the
// coordinator's batch: its key (group, topic, partition), its value
// (offset, leader epoch, metadata, timestamp) and the record's framing.
func commitBytes(group, topic, meta string) int {
	return 64 + len(group) + len(topic) + len(meta)
}

// commitChunks splits todo, in order, into runs whose offsets take at most
// limit bytes (a run holds one partition at least).
func commitChunks(group string, todo []*partition, meta map[topicPartition]string, limit int) [][]*partition {
	var out [][]*partition
	start, size := 0, 0
	for i, p := range todo {
		n := commitBytes(group, p.tp.topic, meta[p.tp])
		if i > start && size+n > limit {
			out = append(out, todo[start:i:i])
			start, size = i, 0
		}
		size += n
	}
	return append(out, todo[start:])
}

// commitChunk is commitLedgered for one request.
func (k *committer) commitChunk(offsets map[string]map[int32]int64, meta map[topicPartition]string, todo []*partition, gen int32, id string) error {
	at := time.Now()
	err := k.commitOffsets(offsets, meta, gen, id)
	latency := time.Since(at)
	outcome := commitOutcome(err)
	if int(outcome) < len(k.outcomes) {
		k.outcomes[outcome].Add(1)
	}
	for _, p := range todo {
		a := offsetfile.CommitAttempt{Offset: offsets[p.tp.topic][p.tp.partition], Generation: gen,
			At: at, Outcome: outcome, Latency: latency}
		if err != nil {
			a.Error = err.Error()
		}
		k.ledger(p, a)
		switch outcome {
		case offsetfile.CommitOK:
			p.committed, p.committedMeta = a.Offset, meta[p.tp]
			p.st.committed.Store(a.Offset)
			p.unknown = nil
		case offsetfile.CommitUnknown:
			p.unknown = &a
		}
	}
	return err
}

func (k *committer) ledger(p *partition, a offsetfile.CommitAttempt) {
	p.st.setLastCommit(a.Outcome.String())
	if err := k.store.SetCommitAttempt(p.key, a); err != nil {
		k.log.Warn("recording the commit attempt failed", zap.String("topic", p.tp.topic),
			zap.Int32("partition", p.tp.partition), zap.Int64("offset", a.Offset), zap.Error(err))
	}
}

// commitOutcome classifies a commit's error: a Kafka error code is a
// definite answer; anything else (timeout, connection lost) leaves the
// outcome unknown: the broker may have applied the commit.
func commitOutcome(err error) offsetfile.CommitOutcome {
	var kerr kafka.Error
	switch {
	case err == nil:
		return offsetfile.CommitOK
	case isFenced(err):
		return offsetfile.CommitFenced
	case errors.As(err, &kerr):
		return offsetfile.CommitError
	}
	return offsetfile.CommitUnknown
}

// confirmUnknown asks Kafka for the committed offsets of the partitions
// whose last commit had no answer, and records in the ledger whether it
// was applied. On failure it tries again at the next commit.
func (k *committer) confirmUnknown(owned []*partition) {
	var parts []*partition
	var tps []topicPartition
	for _, p := range owned {
		if p.unknown != nil {
			parts = append(parts, p)
			tps = append(tps, p.tp)
		}
	}
	if len(parts) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	got, err := k.coordinator.offsets(ctx, tps)
	if err != nil {
		k.log.Warn("confirming commits of unknown outcome failed; trying again at the next commit", zap.Error(err))
		return
	}
	for _, p := range parts {
		po, ok := got[p.tp]
		if !ok || po.err != nil {
			continue
		}
		log := k.log.With(zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition))
		k.confirm(p, log, *p.unknown, po.offset, "at the next commit")
		if po.offset >= p.unknown.Offset {
			p.committed = po.offset
			p.st.committed.Store(po.offset)
		}
		p.unknown = nil
	}
}

// confirm records in the ledger how the commit attempt a, whose outcome was
// unknown, turned out, given Kafka's committed offset now.
func (k *committer) confirm(p *partition, log *zap.Logger, a offsetfile.CommitAttempt, committed int64, when string) {
	cause := a.Error
	if committed >= a.Offset {
		a.Outcome = offsetfile.CommitOK
		a.Error = fmt.Sprintf("confirmed applied %s: Kafka's committed offset is %d (the attempt had no answer: %s)", when, committed, cause)
		log.Info("a commit of unknown outcome was applied", zap.Int64("offset", a.Offset), zap.Int64("kafka_committed", committed), zap.String("when", when))
	} else {
		a.Outcome = offsetfile.CommitError
		a.Error = fmt.Sprintf("confirmed not applied %s: Kafka's committed offset is %d (the attempt had no answer: %s)", when, committed, cause)
		log.Info("a commit of unknown outcome was not applied; the committer sends it again", zap.Int64("offset", a.Offset),
			zap.Int64("kafka_committed", committed), zap.String("when", when))
	}
	k.ledger(p, a)
}

// commitOffsets commits offsets with the given group identity, within
// Timeout.
func (k *committer) commitOffsets(offsets map[string]map[int32]int64, meta map[topicPartition]string, gen int32, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	return k.coordinator.commit(ctx, offsets, meta, gen, id)
}

// isFenced reports a commit refused because this member's generation is
// over: committing stops until the next one. RebalanceInProgress is not
// fenced: the group is completing a rebalance, and the commit is retried;
// nor is the consumer protocol's STALE_MEMBER_EPOCH: the member's newer
// epoch is on its way (its heartbeat), and the commit retried with it.
func isFenced(err error) bool {
	return errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.UnknownMemberId) ||
		errors.Is(err, kafka.FencedInstanceID) || errors.Is(err, errFencedMemberEpoch)
}
