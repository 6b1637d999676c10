package framework

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// assignment is the partitions this consumer owns and their lifecycle:
// start (reconcile with Kafka, reconcile.go; open the run for the crash-loop
// breaker; start the partition's run, parked or on a goroutine), revoke
// (drain, flush, final commit) and lose (stop without a commit). The membership's goroutine
// drives it (it is the membership's assignee). It keeps the owned
// partitions in parts, which the committer reads; it reads and records
// positions in store, asks the coordinator for Kafka's committed offsets
// and positions for the logs' bounds, commits through the committer, takes
// each partition's Stats record from board and hands each partition env.
// mu guards stuck and existing.
type assignment struct {
	cfg         *Config
	log         *zap.Logger
	store       *offsetfile.Store
	committer   *committer
	coordinator *coordinator
	positions   *positions
	identity    *identity
	parts       *ownedPartitions
	board       *partitionBoard
	env         *partitionEnv
	watch       *loopWatch // the group loop's liveness (liveness.go)
	// changelog, with Config.StateChangelog, writes the partitions'
	// changes (changelog.go) and restores their state (restore.go).
	changelog *changelog
	// runCtx is Run's context, set before the membership starts: each
	// partition's context is its child, so that a stop ends every
	// partition's calls at once, before the membership's goroutine gets
	// to the revoke (the membership's own contexts end earlier: the
	// consumer protocol's after each reconciliation).
	runCtx context.Context

	mu sync.Mutex
	// stuck lists the Handler calls abandoned at a revoke (see revoke).
	stuck []string
	// lost counts the partitions given up without a commit (lose), and
	// lostUncommitted the messages they had handled since their last
	// commit: their next owners handle at most that many again.
	lost, lostUncommitted atomic.Uint64
	// revokedUncommitted counts the messages handled since their last
	// commit in revoked partitions whose final commit did not land within
	// the hand-off's budget (finalCommit).
	revokedUncommitted atomic.Uint64
	// beforePersist, in internal tests, runs after the early fetch began
	// and before persist (start).
	beforePersist func()
	// existing is the subscribed topics' partition counts as first read
	// after Run started (seen): a partition beyond them appeared later,
	// and starts at its first offset whatever StartOffset says. Guarded by
	// mu; nil until the first read.
	existing map[string]int
}

// ownedPartitions is the partitions this consumer owns, by the
// assignment's writes; the committer reads them. Safe for concurrent use.
type ownedPartitions struct {
	mu    sync.Mutex
	parts map[topicPartition]*partition
}

// reserve makes room for n more partitions: an assignment fills the map
// once rather than growing it step by step.
func (o *ownedPartitions) reserve(n int) {
	o.mu.Lock()
	o.parts = reserved(o.parts, n)
	o.mu.Unlock()
}

// reserved returns m, or, when n is more than m holds, a copy of m with
// room for n more entries. At 10,000 partitions, growing the assignment's
// maps one entry at a time cost several milliseconds of a start.
func reserved[K comparable, V any](m map[K]V, n int) map[K]V {
	if n <= len(m) {
		return m
	}
	out := make(map[K]V, len(m)+n)
	maps.Copy(out, m)
	return out
}

// put records p as owned.
func (o *ownedPartitions) put(p *partition) {
	o.mu.Lock()
	o.parts[p.tp] = p
	o.mu.Unlock()
}

// drop forgets p, unless a newer run of its partition took its place.
func (o *ownedPartitions) drop(p *partition) {
	o.mu.Lock()
	if o.parts[p.tp] == p {
		delete(o.parts, p.tp)
	}
	o.mu.Unlock()
}

// lookup returns the owned partitions of tps.
func (o *ownedPartitions) lookup(tps []topicPartition) []*partition {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]*partition, 0, len(tps))
	for _, tp := range tps {
		if p := o.parts[tp]; p != nil {
			out = append(out, p)
		}
	}
	return out
}

// all returns the owned partitions, in no order.
func (o *ownedPartitions) all() []*partition {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]*partition, 0, len(o.parts))
	for _, p := range o.parts {
		out = append(out, p)
	}
	return out
}

// list returns the owned partitions, sorted.
func (o *ownedPartitions) list() []*partition {
	out := o.all()
	slices.SortFunc(out, func(x, y *partition) int { return compareTP(x.tp, y.tp) })
	return out
}

// owned implements assignee.
func (a *assignment) owned() []topicPartition {
	parts := a.parts.list()
	out := make([]topicPartition, len(parts))
	for i, p := range parts {
		out[i] = p.tp
	}
	return out
}

// seen implements assignee: the first counts read are the partitions that
// existed when the consumer started. An owned partition of a missing topic
// (deleted while consumed) gets the reason in its Stats: one that waits on
// a full buffer sends no fetch to fail, and would otherwise be revoked at
// the next rebalance without a word.
func (a *assignment) seen(counts map[string]int, missing []string) {
	a.mu.Lock()
	if a.existing == nil {
		a.existing = maps.Clone(counts)
	}
	a.mu.Unlock()
	if len(missing) == 0 {
		return
	}
	for _, p := range a.parts.list() {
		if slices.Contains(missing, p.tp.topic) {
			p.st.setError(fmt.Errorf("%s/%d: the topic no longer exists (metadata answers [%d] Unknown Topic Or Partition); the partition is revoked at the next rebalance",
				p.tp.topic, p.tp.partition, errUnknownTopicOrPartition))
		}
	}
}

// startsAtEnd reports whether tp, with no position in the offset file or
// Kafka, starts at its log end: with StartOffset LastOffset, unless tp
// appeared after the consumer started (a partition added, a topic
// created). Such a partition starts at its first offset, so that what was
// produced to it before the partition watch noticed it and the group
// assigned it is not skipped (Java's consumer and franz-go skip it).
func (a *assignment) startsAtEnd(tp topicPartition) bool {
	if a.cfg.StartOffset != kafka.LastOffset {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.existing == nil {
		return true // no metadata read yet: it existed at the start
	}
	if int(tp.partition) < a.existing[tp.topic] {
		return true
	}
	a.log.Info("the partition appeared after the consumer started; starting at its first offset, not at StartOffset LastOffset",
		zap.String("topic", tp.topic), zap.Int32("partition", tp.partition), zap.Int("partitions_at_start", a.existing[tp.topic]))
	return false
}

// stuckCalls lists the Handler calls abandoned at revokes.
func (a *assignment) stuckCalls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.stuck)
}

// start reconciles newly assigned partitions and starts their goroutines.
func (a *assignment) start(ctx context.Context, tps []topicPartition) {
	if len(tps) == 0 {
		return
	}
	gen, id := a.identity.get()
	// The log's bounds are listed while Kafka's committed offsets are read:
	// reconciliation needs both, and they come from different brokers.
	// The partitions are made meanwhile (at 10,000, about 10 ms).
	listed := make(chan []logBounds, 1)
	go func() { listed <- a.positions.bounds(ctx, tps, a.watch) }()
	type offsets struct {
		got map[topicPartition]fetchedOffset
		err error
	}
	read := make(chan offsets, 1)
	go func() {
		got, err := a.committedOffsets(ctx, tps)
		read <- offsets{got, err}
	}()
	a.parts.reserve(len(tps))
	a.board.reserve(len(tps))
	a.env.fetcher.reserve(len(tps))
	a.store.Reserve(len(tps))
	parts := make([]*partition, 0, len(tps))
	for _, tp := range tps {
		p := &partition{
			env:    a.env,
			key:    storeKey(a.cfg.GroupID, tp),
			tp:     tp,
			q:      new(inbox[*chunk]), // its ready channel, if it needs one: see open
			gen:    gen,
			member: id,
			done:   make(chan struct{}),
		}
		p.iv = invoker{p: p, policy: a.cfg.policy(tp.topic)}
		parts = append(parts, p)
	}
	r := <-read
	committed, err := r.got, r.err
	retried := err != nil
	for err != nil {
		if ctx.Err() != nil {
			<-listed
			return
		}
		a.log.Warn("reading Kafka's committed offsets failed; retrying", zap.Error(err))
		if !sleep(ctx, time.Second) {
			<-listed
			return
		}
		a.watch.busy()
		committed, err = a.committedOffsets(ctx, tps)
	}
	bounds := <-listed
	if bounds != nil && (retried || aboveLogEnd(tps, committed, bounds)) {
		// Listed before the committed offsets were read: a commit above
		// the log end it saw would look out of range. Listed again, after.
		bounds = a.positions.bounds(ctx, tps, a.watch)
	}
	if bounds == nil {
		return // ctx ended
	}
	for _, p := range parts {
		c := committed[p.tp]
		p.st = a.board.get(p.tp)
		// What the previous owner carried in its commit (handoff.go).
		p.kafkaOffset, p.committed, p.committedMeta = c.offset, c.offset, c.meta
		p.st.setState(StateReconciling)
	}
	starts, commit, back := a.reconcile(ctx, parts, bounds)
	// A run that starts parked is fetched before what reconcile decided is
	// durable: its messages wait in its inbox until it opens, after
	// persist. At 10,000 partitions persisting and opening the runs took
	// 40-60 ms, which the first fetch's answer now overlaps.
	early := a.changelog == nil && a.env.parksAtStart()
	if early {
		for i, p := range parts {
			if start, ok := starts[i]; ok {
				a.env.fetcher.add(p, start)
			}
		}
	}
	if a.beforePersist != nil {
		a.beforePersist()
	}
	a.persist(ctx, parts, starts, back)
	for i, p := range parts {
		start, ok := starts[i]
		if !ok {
			close(p.done) // stalled by policy: not running, not committed
			continue
		}
		pctx := p.begin(a.runCtx)
		if a.changelog != nil {
			// Registered before the committer can see p: nothing of it is
			// committed until its state is settled.
			lp := a.changelog.assigned(p.tp, start, true)
			a.parts.put(p)
			go a.changelog.start(pctx, p, lp, start, a.log) // restores if it must, then p.run
			continue
		}
		a.parts.put(p)
		if early {
			p.startParked(pctx, start) // its first chunk starts its goroutine
			continue
		}
		go p.run(pctx, start) // it closes done, which revoke waits for (bounded: see revoke)
	}
	if commit {
		a.committer.soon()
	}
}

// aboveLogEnd reports whether a committed offset is above the log end
// bounds listed for its partition.
func aboveLogEnd(tps []topicPartition, committed map[topicPartition]fetchedOffset, bounds []logBounds) bool {
	for i, tp := range tps {
		if committed[tp].offset > bounds[i].last {
			return true
		}
	}
	return false
}

// committedOffsets reads Kafka's committed offsets of tps, with their
// metadata; -1 where none.
func (a *assignment) committedOffsets(ctx context.Context, tps []topicPartition) (map[topicPartition]fetchedOffset, error) {
	fctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	got, err := a.coordinator.offsets(fctx, tps)
	if err != nil {
		return nil, err
	}
	out := make(map[topicPartition]fetchedOffset, len(tps))
	for _, tp := range tps {
		out[tp] = fetchedOffset{offset: -1}
	}
	for tp, o := range got {
		if o.err != nil {
			return nil, fmt.Errorf("%s/%d: %w", tp.topic, tp.partition, o.err)
		}
		if o.offset >= 0 {
			out[tp] = o
		}
	}
	return out, nil
}

// revoke stops parts: each drains (the Handler call in flight finishes,
// bounded by DrainTimeout), the offset file is flushed, and if commit is set
// their final watermarks are committed with the current generation, so the
// next owner starts exactly there. Lost partitions (the membership lapsed)
// are stopped without a commit: it would be refused.
func (a *assignment) revoke(tps []topicPartition, commit bool, reason string) {
	a.stop(a.parts.lookup(tps), commit, reason)
}

// stop stops parts (see revoke).
func (a *assignment) stop(parts []*partition, commit bool, reason string) {
	if len(parts) == 0 {
		return
	}
	began := time.Now()
	// Each run's end queues its run state: room for them at once.
	a.store.Reserve(len(parts))
	for _, p := range parts {
		p.stopRun()
	}
	// Each partition's goroutine returns once its Handler calls return.
	// After DrainTimeout their context is cancelled; a call that ignores
	// it is given drainGrace more, then abandoned: its message is not
	// marked done (it is handled again by the next owner), and Run
	// reports it.
	timer := time.NewTimer(a.cfg.DrainTimeout)
	defer timer.Stop()
	late := running(parts, timer.C)
	for _, p := range late {
		p.cancelCalls()
	}
	if len(late) > 0 {
		timer.Reset(drainGrace)
		for _, p := range running(late, timer.C) {
			p.abandoned.Store(true)
			call := fmt.Sprintf("%s/%d offset %d", p.tp.topic, p.tp.partition, p.st.processed.Load())
			a.log.Error("a Handler call ignored its cancelled context past DrainTimeout; abandoning it: its message is not marked done",
				zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition), zap.Int64("offset", p.st.processed.Load()),
				zap.Duration("waited", a.cfg.DrainTimeout+drainGrace))
			a.mu.Lock()
			a.stuck = append(a.stuck, call)
			a.mu.Unlock()
		}
	}
	for _, p := range parts {
		p.hcancel() // a run revoked before it began has not
	}
	a.committer.hold(parts, reason)
	fctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	err := a.store.Sync(fctx) // the final commit sends what is synced
	cancel()
	if err != nil {
		a.log.Error("flushing the offset file on revoke failed; the watermarks recorded before it stay valid", zap.Error(err))
	}
	if a.changelog != nil && commit {
		// The changelog first: the final commit reaches no further.
		lctx, cancel := context.WithDeadline(context.Background(), began.Add(a.commitBudget(reason)))
		a.changelog.flush(lctx, partitionTPs(parts))
		cancel()
	}
	a.revoked(parts, !commit)
	if commit {
		a.finalCommit(parts, reason, began.Add(a.commitBudget(reason)))
	}
	for _, p := range parts {
		a.parts.drop(p)
		if a.changelog != nil {
			a.changelog.released(p.tp)
		}
		p.st.setState(StateRevoked)
	}
	tps := make([]topicPartition, len(parts))
	for i, p := range parts {
		tps[i] = p.tp
	}
	a.log.Info("partitions revoked", zap.String("reason", reason), zap.Bool("committed", commit),
		zap.Int("count", len(tps)), zap.String("partitions", partitionList(tps, 2000)))
}

// running waits for the runs of parts to finish until expired fires, and
// returns those still running then.
func running(parts []*partition, expired <-chan time.Time) []*partition {
	var left []*partition
	fired := false
	for _, p := range parts {
		if !fired {
			select {
			case <-p.done:
				continue
			case <-expired:
				fired = true
			}
		}
		select {
		case <-p.done:
		default:
			left = append(left, p)
		}
	}
	return left
}

// commitBudget is how long a revoke may take, its drain included, before
// its final commit stops being retried. At a rebalance, RebalanceTimeout
// less one HeartbeatInterval: an eager revoke runs while the coordinator
// waits up to RebalanceTimeout for this member's join, the generation
// valid until then; a cooperative one delays only the rejoin that hands
// the partitions on, and no rebalance should take longer. At a graceful
// stop, DrainTimeout: Run returns within the bound it had with a single
// try (DrainTimeout, plus drainGrace for a Handler that ignores its
// context, plus one Timeout), inside a supervisor's grace period.
func (a *assignment) commitBudget(reason string) time.Duration {
	if reason == reasonShutdown {
		return a.cfg.DrainTimeout
	}
	return a.cfg.RebalanceTimeout - a.cfg.HeartbeatInterval
}

// reasonShutdown is the revoke reason of a graceful stop.
const reasonShutdown = "shutdown"

// finalCommit commits the final watermarks of revoked parts, retrying with
// backoff while the commit fails with a retriable error and the deadline
// has not passed: the generation stays valid through the rest of the
// rebalance, and every commit that lands spares the next owner what was
// handled since the last one (a single try dropped them at the first
// COORDINATOR_NOT_AVAILABLE). What has not landed by the deadline, or was
// fenced, is counted (Stats.RevokedUncommitted) and logged: the next
// owners, unless it is this consumer again, handle at most that many again.
func (a *assignment) finalCommit(parts []*partition, reason string, deadline time.Time) {
	bo := newBackoff(50*time.Millisecond, time.Second)
	tries := 0
	var err error
	for {
		tries++
		if err = a.committer.commit(parts, reason); err == nil || isFenced(err) || errors.Is(err, errGenerationFenced) || errors.Is(err, errNotMember) {
			break
		}
		d := bo.next()
		if time.Now().Add(d).After(deadline) {
			break
		}
		a.watch.busy() // liveness: each try is a step
		time.Sleep(d)
	}
	if err == nil {
		if tries > 1 {
			a.log.Info("the final commit of revoked partitions landed after retries", zap.String("reason", reason), zap.Int("tries", tries))
		}
		return
	}
	again, total := uncommittedCounts(a.committer.uncommitted(parts))
	a.revokedUncommitted.Add(total)
	a.log.Warn("the final commit of revoked partitions did not land within its budget (RebalanceTimeout - HeartbeatInterval at a rebalance, DrainTimeout at a stop); "+
		"their next owners handle again up to these many messages, handled since the last commit",
		zap.String("reason", reason), zap.Int("tries", tries), zap.Duration("budget", a.commitBudget(reason)),
		zap.Uint64("messages", total), zap.Any("per_partition", again), zap.Error(err))
}

// lose gives parts up without a commit: the membership lapsed or was
// fenced, so they may be someone else's already (Stats.PartitionsLost).
// What each had handled since its last commit is counted and logged
// (Stats.LostUncommitted): a next owner other than this consumer handles
// that again.
func (a *assignment) lose(tps []topicPartition, reason string) {
	parts := a.parts.lookup(tps)
	if len(parts) == 0 {
		return
	}
	a.lost.Add(uint64(len(parts)))
	a.stop(parts, false, reason)
	again, total := uncommittedCounts(parts)
	a.lostUncommitted.Add(total)
	a.log.Warn("partitions given up without a commit; claimed at the next join, else their next owners handle again up to these many messages, handled since the last commit",
		zap.String("reason", reason), zap.Uint64("messages", total), zap.Any("per_partition", again))
}

// openRuns reads each starting partition's run state for the crash-loop
// breaker (found open, the last run ended uncleanly) and queues the record
// that this run holds the partition: reconcile's flush makes it durable
// with the watermarks, before any message is handled.
func (a *assignment) openRuns(parts []*partition, starts map[int]int64) {
	if len(starts) == 0 {
		return
	}
	limit := max(a.cfg.CrashLoopRestarts, 0)
	for i, p := range parts {
		if _, ok := starts[i]; !ok {
			continue
		}
		rec, _ := a.store.Get(p.key)
		p.iv.br = newBreaker(rec.Run, limit)
		p.st.setCareful(p.iv.br.careful)
		if p.iv.br.careful {
			p.st.rare().carefulEntries.Add(1)
			a.log.Warn("the last run ended uncleanly (crash, kill, power loss); handling the first messages carefully, one at a time, with their offsets durable",
				zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition),
				zap.Int64("in_flight_at_the_end", p.iv.br.prev.Inflight), zap.Int32("unclean_restarts", p.iv.br.prev.Crashes))
		}
		if a.cfg.TxHandler != nil {
			// A run of an earlier assignment still in the handler
			// (abandoned at its revoke) can no longer commit.
			a.store.FenceState(p.key)
		}
		// The previous in-flight offset is kept in memory only: counted
		// again only if this run calls the Handler on it.
		if err := a.store.SetRun(p.key, offsetfile.RunState{Open: true, Inflight: -1}); err != nil {
			a.log.Error("recording the run state failed", zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition), zap.Error(err))
		}
	}
}

// setWatermark records a watermark decided by reconciliation.
func (a *assignment) setWatermark(p *partition, wm int64) {
	if err := a.store.SetWatermark(p.key, wm, p.gen, p.member); err != nil {
		a.log.Error("recording the watermark failed", zap.String("topic", p.tp.topic),
			zap.Int32("partition", p.tp.partition), zap.Int64("offset", wm), zap.Error(err))
	}
}

// partitionTPs is the partitions of parts.
func partitionTPs(parts []*partition) []topicPartition {
	out := make([]topicPartition, len(parts))
	for i, p := range parts {
		out[i] = p.tp
	}
	return out
}

// drainGrace is how long a revoke waits, past DrainTimeout, for a Handler
// call that ignores its cancelled context.
const drainGrace = 2 * time.Second

// uncommittedCounts is what each of parts handled since its last commit
// (partition.uncommitted), by "topic/partition", and their total: what
// their next owners may handle again.
func uncommittedCounts(parts []*partition) (map[string]uint64, uint64) {
	again := make(map[string]uint64, len(parts))
	var total uint64
	for _, p := range parts {
		n := p.uncommitted()
		again[fmt.Sprintf("%s/%d", p.tp.topic, p.tp.partition)] = n
		total += n
	}
	return again, total
}
