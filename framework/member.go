package framework

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Membership: how this consumer belongs to its consumer group. One type per
// group protocol implements membership (classic.go: JoinGroup, SyncGroup,
// Heartbeat, LeaveGroup); the rest of the engine sees only this interface.
// The membership drives the partitions' lifecycle through an assignee (the
// assignment, assign.go): what to start, what to revoke with a final
// commit, what to give up as lost.

// ErrFencedInstance is returned by Run when another consumer joined the
// group with the same Config.InstanceID: this one stops, committing nothing
// more (its commits would be refused), and loses nothing (the offset file
// keeps its watermarks).
var ErrFencedInstance = errors.New("tidemark: fenced: another consumer joined the group with the same InstanceID")

// membership is this consumer's membership in its group. run is the
// membership's own goroutine; the other methods are safe from any
// goroutine.
type membership interface {
	// run joins the group and keeps the membership until ctx ends, telling
	// the assignee what to start and revoke as the assignment changes;
	// then it revokes everything (committing, unless fenced) and leaves the
	// group (a static member stays). It returns ErrFencedInstance or
	// another error that stops the consumer, or nil.
	run(ctx context.Context) error
	// status is what Stats and Ready show of the membership.
	status() memberStatus
}

// identity is this consumer's place in its group: the generation (or
// member epoch) and member id that commits carry; the generation is -1 when
// not a member. The membership writes it; the assignment, the committer and
// Stats read it. Safe for concurrent use.
type identity struct {
	mu  sync.Mutex
	gen int32
	id  string
}

func newIdentity() *identity { return &identity{gen: -1} }

// get returns the generation and the member id.
func (i *identity) get() (gen int32, id string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.gen, i.id
}

// member returns the member id.
func (i *identity) member() string {
	_, id := i.get()
	return id
}

// setGen sets the generation (-1: not a member).
func (i *identity) setGen(gen int32) {
	i.mu.Lock()
	i.gen = gen
	i.mu.Unlock()
}

// setID sets the member id ("" to join as a new member).
func (i *identity) setID(id string) {
	i.mu.Lock()
	i.id = id
	i.mu.Unlock()
}

// memberStatus is a membership's state for Stats and Ready.
type memberStatus struct {
	rebalances    uint64        // generations joined
	rebalanceTime time.Duration // spent joining them, the join going on included
	rebalancing   bool          // a join is going on
	// settling: a generation was joined and its assignment is not
	// reconciled yet.
	settling bool
	// joinErr is the last join's error, "" once one succeeded; joinSince
	// is when joins began failing, joinFailures how many in a row.
	joinErr      string
	joinSince    time.Time
	joinFailures int
	// missing lists the subscribed topics that do not exist, as the last
	// metadata read said.
	missing []string
}

// memberBook is what every membership keeps for Stats and Ready, whatever
// its protocol: the rebalances, the join errors, the subscribed topics that
// do not exist. Safe for concurrent use.
type memberBook struct {
	cfg *Config
	log *zap.Logger
	a   assignee

	mu sync.Mutex
	// For Stats: generations (member epochs) joined, the time spent
	// joining them, and when the join going on began (zero if none).
	rebalances     uint64
	rebalanceTime  time.Duration
	rebalanceSince time.Time
	// settling is set from a join's success until the partitions it
	// added are reconciled (rebalanced), or at once if it added none:
	// Consumer.Ready waits for it.
	settling bool
	// joinErr is the last join's error, "" once a join succeeded;
	// joinFailingSince is when joins began failing, joinFailures how many
	// failed in a row (Stats, Ready).
	joinErr          string
	joinFailingSince time.Time
	joinFailures     int
	// missing lists the subscribed topics the last metadata read said do
	// not exist (Stats.MissingTopics, Ready); warned about when it changes.
	missing []string
}

// status is the book as memberStatus.
func (b *memberBook) status() memberStatus {
	n, d, on := b.rebalanceStats()
	b.mu.Lock()
	defer b.mu.Unlock()
	return memberStatus{rebalances: n, rebalanceTime: d, rebalancing: on, settling: b.settling,
		joinErr: b.joinErr, joinSince: b.joinFailingSince, joinFailures: b.joinFailures,
		missing: slices.Clone(b.missing)}
}

// joinFailed notes a failed join (err), or a successful one (nil).
func (b *memberBook) joinFailed(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.joinErr, b.joinFailingSince, b.joinFailures = "", time.Time{}, 0
		return
	}
	if b.joinFailures == 0 {
		b.joinFailingSince = time.Now()
	}
	b.joinFailures++
	b.joinErr = err.Error()
}

// rebalancing notes that a join begins, unless one is going on.
func (b *memberBook) rebalancing() {
	b.mu.Lock()
	if b.rebalanceSince.IsZero() {
		b.rebalanceSince = time.Now()
	}
	b.mu.Unlock()
}

// joined notes a join's success: settling until rebalanced (or settled).
func (b *memberBook) joined() {
	b.mu.Lock()
	b.settling = true
	b.mu.Unlock()
}

// settled notes that the join added nothing to reconcile: readiness need
// not wait for the revoked partitions' drain.
func (b *memberBook) settled() {
	b.mu.Lock()
	b.settling = false
	b.mu.Unlock()
}

// rebalanced notes that the join going on ended, with a generation joined
// or not.
func (b *memberBook) rebalanced(joined bool) {
	b.mu.Lock()
	if !b.rebalanceSince.IsZero() {
		b.rebalanceTime += time.Since(b.rebalanceSince)
		b.rebalanceSince = time.Time{}
	}
	if joined {
		b.rebalances++
	}
	b.settling = false
	b.mu.Unlock()
}

// rebalanceStats returns the generations joined, the time spent joining
// (the join going on included) and whether one is going on.
func (b *memberBook) rebalanceStats() (uint64, time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.rebalanceTime
	if !b.rebalanceSince.IsZero() {
		d += time.Since(b.rebalanceSince)
	}
	return b.rebalances, d, !b.rebalanceSince.IsZero()
}

// noteTopics records which subscribed topics md says do not exist, and
// the counts it read for the assignment (assignee.seen). A change of the
// missing set is logged: a topic that does not exist (a typo, not created
// yet) would otherwise leave the consumer idle without a word; it is
// assigned once it exists (the classic protocol's partition watch, or the
// coordinator's own metadata with the consumer protocol).
func (b *memberBook) noteTopics(md *kmsg.MetadataResponse) {
	var missing []string
	for _, t := range md.Topics {
		if t.Topic != nil && slices.Contains(b.cfg.Topics, *t.Topic) && t.ErrorCode == errUnknownTopicOrPartition {
			missing = append(missing, *t.Topic)
		}
	}
	slices.Sort(missing)
	b.a.seen(subscribedCounts(partitionCountsOf(md), b.cfg.Topics), missing)
	b.mu.Lock()
	before := b.missing
	b.missing = missing
	b.mu.Unlock()
	switch {
	case slices.Equal(before, missing):
	case len(missing) > 0:
		b.log.Warn("subscribed topic(s) do not exist; nothing of them is consumed until they are created (then they are assigned within the partition watch's interval)",
			zap.Strings("missing_topics", missing), zap.Strings("topics", b.cfg.Topics), zap.Duration("watch_interval", partitionWatchInterval))
	default:
		b.log.Info("every subscribed topic exists now", zap.Strings("were_missing", before))
	}
}

// assignee is what a membership drives: the partitions this consumer owns.
// The membership's goroutine calls it.
type assignee interface {
	// owned lists the partitions owned now, sorted.
	owned() []topicPartition
	// start reconciles newly assigned partitions and starts them.
	start(ctx context.Context, tps []topicPartition)
	// revoke stops partitions: drained, flushed, and with commit set their
	// final watermarks committed with the current generation.
	revoke(tps []topicPartition, commit bool, reason string)
	// lose gives partitions up without a commit: the membership lapsed
	// or was fenced, so they may be someone else's already.
	lose(tps []topicPartition, reason string)
	// seen reports the subscribed topics' partition counts, and those that
	// do not exist, each time the membership reads them: the first report
	// tells which partitions existed when the consumer started
	// (Config.StartOffset).
	seen(counts map[string]int, missing []string)
}

// generationEnd says why a generation ended, as its heartbeats saw it.
type generationEnd int

const (
	endStop       generationEnd = iota // Run's ctx ended
	endRebalance                       // the group is rebalancing: rejoin, keeping the partitions (cooperative)
	endLost                            // the membership lapsed: partitions may be someone else's now
	endFenced                          // another process took the InstanceID
	endPartitions                      // a subscribed topic has new partitions: rejoin so they are assigned
	endRevoked                         // partitions were revoked: rejoin so they can move
)
