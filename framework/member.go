package framework

import (
	"context"
	"errors"
	"sync"
	"time"
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
	// seen reports the subscribed topics' partition counts, each time the
	// membership reads them: the first report tells which partitions
	// existed when the consumer started (Config.StartOffset).
	seen(counts map[string]int)
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
