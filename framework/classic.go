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
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/wire"
)

// classicMember is the membership of the classic group protocol: JoinGroup
// and SyncGroup to form each generation (the leader member assigns the
// partitions, assignor.go), Heartbeat to keep it, LeaveGroup to leave.
//
// Rebalances are cooperative when every member offers cooperative-sticky
// (KIP-429): a partition that stays with its owner keeps running through a
// rebalance, untouched; one that moves is revoked (drained, its final
// watermark committed) and then the member rejoins, so that the next
// generation hands it to its new owner. When the group chose range (a member
// speaks only eager protocols), every partition is revoked before each join,
// as kafka-go's ConsumerGroup did. With Config.InstanceID the member is
// static (KIP-345): a restart within SessionTimeout gets its partitions back
// without a rebalance.
//
// Goroutines: Run runs the membership loop (run) on its own goroutine, the
// group loop, which alone drives the assignment (assignee); run starts,
// per join, one goroutine for the join (joinAndSync: JoinGroup, SyncGroup,
// the leader's assignment; it alone uses coord and watched meanwhile)
// while the loop waits for its result or for the lease's end, and, per
// generation, one heartbeat goroutine (heartbeats on their own schedule
// and their own connection, never behind a JoinGroup, a commit or a
// drain). mu guards the status, read by Stats; ident is the identity it
// keeps.
type classicMember struct {
	cfg         *Config
	log         *zap.Logger
	a           assignee
	ident       *identity
	coordinator *coordinator
	cl          *cluster
	deadLetters *deadLetters
	watch       *loopWatch // the group loop's liveness (liveness.go)
	// coord is the connection to the coordinator for JoinGroup, SyncGroup
	// and LeaveGroup, used by run only.
	coord *wire.Conn

	mu       sync.Mutex
	protocol string // the assignor the group chose
	// heartbeatAt is when the last heartbeat was answered.
	heartbeatAt time.Time
	// claims are the partitions given up as lost since the last join: the
	// next join claims them as owned, so that the sticky assignor gives
	// them back, and their offset file's watermarks, not Kafka's older
	// commits, set where they resume. The run loop's only: the lease's end
	// during a join is one of its events.
	claims []topicPartition
	// watched is the subscribed topics' partition counts the current
	// assignment was computed from, the partition watch's baseline (await):
	// the leader's, as it assigned; a follower's, read before its
	// JoinGroup, so never above the leader's (the leader reads after every
	// member joined). A partition created after the leader's read is then
	// growth to every member. nil if the read failed. The run loop's only.
	watched map[string]int
	// book is the status Stats reads and the subscribed topics' notes
	// (member.go), kept as every membership keeps them.
	book memberBook
}

// newClassicMember makes the membership that drives a: it writes ident,
// finds the group's coordinator through coordinator, reads the topics
// through cl, checks the dead-letter topics before each join, and stamps
// watch.
func newClassicMember(cfg *Config, log *zap.Logger, a assignee, ident *identity, coordinator *coordinator,
	cl *cluster, deadLetters *deadLetters, watch *loopWatch) *classicMember {
	return &classicMember{cfg: cfg, log: log, a: a, ident: ident, coordinator: coordinator, cl: cl,
		deadLetters: deadLetters, watch: watch, book: memberBook{cfg: cfg, log: log, a: a}}
}

// status implements membership.
func (mb *classicMember) status() memberStatus { return mb.book.status() }

// run is the membership loop: join, sync, start and revoke partitions,
// heartbeat until the generation ends, and again; at ctx's end every
// partition is revoked (drained, committed) and the member leaves the group
// (a static one stays, unless Config.LeaveOnClose). It returns
// ErrFencedInstance, or nil.
func (mb *classicMember) run(ctx context.Context) error {
	cfg := mb.cfg
	var fatal error
	defer func() {
		// Graceful end: drain and commit everything while the generation is
		// still valid, then leave so that the others rebalance at once.
		graceful := fatal == nil || errors.Is(fatal, errNoDeadLetterTopic)
		mb.a.revoke(mb.a.owned(), graceful, reasonShutdown)
		if graceful && (cfg.InstanceID == "" || cfg.LeaveOnClose) {
			mb.leave()
		}
		mb.closeCoordinator()
		mb.ident.setGen(-1)
		mb.mu.Lock()
		mb.protocol = ""
		mb.mu.Unlock()
		mb.book.rebalanced(false)
	}()
	bo := newBackoff(cfg.JoinGroupBackoff/4, cfg.JoinGroupBackoff*4)
	eager := true // until a generation chooses cooperative-sticky
	// confirmed is when the coordinator last confirmed this membership (a
	// sync, a heartbeat): partitions kept through a failing rejoin are
	// dropped once it is a session timeout old.
	confirmed := time.Now()
	for ctx.Err() == nil {
		mb.watch.busy() // liveness (liveness.go): each step stamps it
		// Until every dead-letter topic is known to exist (Kafka may not be
		// reachable yet): one that does not ends Run.
		if fatal = mb.deadLetters.check(ctx); fatal != nil {
			return fatal
		}
		mb.book.rebalancing()
		if eager {
			mb.a.revoke(mb.a.owned(), true, "eager rebalance")
		}
		// While the join is pending no heartbeat confirms the membership:
		// if the coordinator cannot be reached, it completes the rebalance
		// without this member and hands its partitions on after
		// RebalanceTimeout (or drops it after SessionTimeout). Kept
		// partitions are given up as lost before either can happen: the
		// join runs on a goroutine of its own and the lease's end is an
		// event to this loop, which alone drives the assignment.
		lease := min(cfg.SessionTimeout, cfg.RebalanceTimeout) - cfg.HeartbeatInterval
		leaseEnd := time.NewTimer(time.Until(confirmed.Add(lease)))
		// A graceful stop during a join lets the join complete when
		// partitions are kept (bounded by RebalanceTimeout): the coordinator
		// forms the next generation with this member in it, and the final
		// commit of the kept partitions needs that generation; one made with
		// the old one would be refused, and their next owners would handle
		// again what was handled since the last commit.
		jctx, jcancel := context.WithCancel(context.WithoutCancel(ctx))
		var keeps atomic.Bool // read by the stop's AfterFunc: partitions are kept through the join
		keeps.Store(len(mb.a.owned()) > 0)
		stopJoin := context.AfterFunc(ctx, func() {
			if !keeps.Load() {
				jcancel()
				return
			}
			time.AfterFunc(cfg.RebalanceTimeout, jcancel)
		})
		joined := make(chan joinResult, 1)
		joinOwned := mb.claimed(mb.a.owned())
		go func() {
			var r joinResult
			r.gen, r.protocol, r.assigned, r.err = mb.joinAndSync(jctx, joinOwned, &r.metadata)
			joined <- r
		}()
		var jr joinResult
	join:
		for {
			select {
			case jr = <-joined:
				break join
			case <-leaseEnd.C:
				// Still within the join's step (liveness): the join goes on.
				mb.watch.busy()
				mb.lose("no membership confirmed while joining")
				keeps.Store(false)
			}
		}
		leaseEnd.Stop()
		stopJoin()
		jcancel()
		mb.watch.busy()
		for _, md := range jr.metadata {
			mb.book.noteTopics(md) // read by the join, noted here: noteTopics tells the assignee
		}
		gen, protocol, assigned, err := jr.gen, jr.protocol, jr.assigned, jr.err
		if err == nil && ctx.Err() != nil {
			mb.log.Info("joined a generation while stopping; committing the kept partitions with it", zap.Int32("generation", gen))
			return nil
		}
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, kafka.FencedInstanceID):
				fatal = fmt.Errorf("%w (InstanceID %q, group %s): %v", ErrFencedInstance, cfg.InstanceID, cfg.GroupID, err)
				mb.a.lose(mb.a.owned(), "fenced")
				return fatal
			case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration):
				mb.lose("membership lost")
			case time.Since(confirmed) > cfg.SessionTimeout:
				// Kept partitions were confirmed by the last generation's
				// heartbeats; with no join for a session timeout the
				// coordinator may have given them to others.
				mb.lose("no membership for a session timeout")
			}
			mb.book.joinFailed(err)
			d := bo.next()
			if logWorthy(bo.n) {
				mb.log.Warn("joining the group failed; retrying", zap.Duration("backoff", d), zap.Error(err))
			}
			sleep(ctx, d)
			continue
		}
		bo.reset()
		mb.book.joinFailed(nil)
		claimed := mb.takeClaims()
		confirmed = time.Now()
		eager = protocol != protocolCooperativeSticky

		// The heartbeats of this generation run from here until the next
		// join, through every drain and reconciliation below.
		hctx, stopHeartbeats := context.WithCancel(context.WithoutCancel(ctx))
		ended := make(chan generationEnd, 1)
		hbDone := make(chan struct{})
		go func() {
			defer close(hbDone)
			mb.heartbeat(hctx, gen, ended)
		}()

		owned := mb.a.owned()
		var revoked, added []topicPartition
		for _, tp := range owned {
			if !slices.Contains(assigned, tp) {
				revoked = append(revoked, tp)
			}
		}
		// A claim the leader did not assign back is one it expects revoked
		// before the next assignment gives it on: there is nothing to stop,
		// but the member must rejoin, like one that revoked.
		unclaimed := 0
		for _, tp := range claimed {
			if !slices.Contains(assigned, tp) && !slices.Contains(owned, tp) {
				unclaimed++
			}
		}
		for _, tp := range assigned {
			if !slices.Contains(owned, tp) {
				added = append(added, tp)
			}
		}
		if len(added) == 0 {
			// Nothing to reconcile: readiness need not wait for the
			// revoked partitions' drain.
			mb.book.settled()
		}
		mb.log.Info("generation joined", zap.Int32("generation", gen), zap.String("protocol", protocol),
			zap.Int("owned", len(owned)), zap.Int("assigned", len(assigned)), zap.Int("revoked", len(revoked)), zap.Int("added", len(added)))
		mb.watch.busy()
		mb.a.revoke(revoked, true, "rebalance")
		mb.watch.busy()
		mb.a.start(ctx, added)
		mb.book.rebalanced(true)

		end := endRevoked
		if len(revoked)+unclaimed == 0 || eager {
			mb.watch.idle()
			end = mb.await(ctx, ended)
			mb.watch.busy()
		}
		switch {
		case end == endStop:
			// A graceful stop: drain and commit while still heartbeating.
			mb.a.revoke(mb.a.owned(), true, reasonShutdown)
		case eager && (end == endRebalance || end == endPartitions):
			// Eager protocol: everything is revoked before the next join,
			// while the heartbeats of this generation still run.
			mb.a.revoke(mb.a.owned(), true, "eager rebalance")
		}
		stopHeartbeats()
		<-hbDone
		confirmed = mb.lastHeartbeat(confirmed)
		switch end {
		case endStop:
			return nil
		case endFenced:
			fatal = fmt.Errorf("%w (InstanceID %q, group %s)", ErrFencedInstance, cfg.InstanceID, cfg.GroupID)
			mb.a.lose(mb.a.owned(), "fenced")
			return fatal
		case endLost:
			mb.lose("membership lost")
		}
	}
	return nil
}

// lose gives every owned partition up without a commit (the membership
// lapsed or ended) and keeps them as claims for the next join. Were they
// handed on meanwhile, their new owner claims them too, and the assignor
// gives a partition claimed twice to neither: its owner revokes it,
// committed, and the next assignment hands it on. Given back, a partition
// resumes at its own file's watermark: nothing handled since the last
// commit is handled again.
func (mb *classicMember) lose(reason string) {
	tps := mb.a.owned()
	mb.a.lose(tps, reason)
	mb.mu.Lock()
	mb.claims = append(mb.claims, tps...)
	mb.mu.Unlock()
}

// claimed returns owned with the claims not among them added.
func (mb *classicMember) claimed(owned []topicPartition) []topicPartition {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	for _, tp := range mb.claims {
		if !slices.Contains(owned, tp) {
			owned = append(owned, tp)
		}
	}
	return owned
}

// takeClaims returns the claims and clears them: a joined generation's
// assignment replaces them.
func (mb *classicMember) takeClaims() []topicPartition {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	c := mb.claims
	mb.claims = nil
	return c
}

// lastHeartbeat returns the later of t and the last answered heartbeat.
func (mb *classicMember) lastHeartbeat(t time.Time) time.Time {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if mb.heartbeatAt.After(t) {
		return mb.heartbeatAt
	}
	return t
}

// await waits for the generation to end: its heartbeats say so, a
// subscribed topic's partition count differs from what the assignment was
// computed from (partitions added, a topic created), or ctx ends.
func (mb *classicMember) await(ctx context.Context, ended <-chan generationEnd) generationEnd {
	counts := mb.watched
	if counts == nil {
		counts = mb.partitionCounts(ctx) // the best baseline left
	}
	t := time.NewTicker(partitionWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return endStop
		case e := <-ended:
			return e
		case <-t.C:
			now := mb.partitionCounts(ctx)
			if counts != nil && now != nil && !maps.Equal(counts, now) {
				mb.log.Info("partitions added to a subscribed topic (or a topic created); rejoining so that they are assigned",
					zap.Any("assigned_from", counts), zap.Any("now", now))
				return endPartitions
			}
			if counts == nil {
				counts = now
			}
		}
	}
}

// partitionCounts reads the subscribed topics' partition counts; nil if the
// metadata cannot be read now. It notes the topics that do not exist
// (noteTopics).
func (mb *classicMember) partitionCounts(ctx context.Context) map[string]int {
	var mds []*kmsg.MetadataResponse
	counts := mb.readCounts(ctx, &mds)
	for _, md := range mds {
		mb.book.noteTopics(md)
	}
	return counts
}

// readCounts is partitionCounts for the join's goroutine: the metadata
// read is appended to *mds instead of noted.
func (mb *classicMember) readCounts(ctx context.Context, mds *[]*kmsg.MetadataResponse) map[string]int {
	md, err := mb.cl.metadata(ctx, mb.cfg.Topics)
	if err != nil {
		return nil
	}
	*mds = append(*mds, md)
	return subscribedCounts(partitionCountsOf(md), mb.cfg.Topics)
}

// joinResult is what a join (joinAndSync, on its own goroutine) hands the
// membership loop: the generation, the chosen protocol, this member's
// assignment, and the metadata it read, which the loop notes (noteTopics
// tells the assignee, which only the loop calls).
type joinResult struct {
	gen      int32
	protocol string
	assigned []topicPartition
	metadata []*kmsg.MetadataResponse
	err      error
}

// joinAndSync joins the group claiming owned (the owned partitions and the
// claims), assigns the partitions if this member leads, and returns the
// generation, the chosen protocol and this member's assignment; the
// metadata it reads is appended to *mds. It runs on a goroutine of its own
// while the membership loop waits for it: it calls nothing of the
// assignee, and uses coord and watched, which the loop leaves alone
// meanwhile.
func (mb *classicMember) joinAndSync(ctx context.Context, owned []topicPartition, mds *[]*kmsg.MetadataResponse) (int32, string, []topicPartition, error) {
	cfg := mb.cfg
	// cooperative-sticky needs the owned partitions (version 1); range gets
	// version 0, which eager-only clients read (kafka-go's ConsumerGroup
	// refuses metadata longer than it knows).
	subs := [][]byte{encodeSubscription(cfg.Topics, owned, 1), encodeSubscription(cfg.Topics, nil, 0)}
	// counted is set once the counts were read for a JoinGroup the
	// coordinator answered only with a member id (KIP-394): the join
	// again follows at once, and at 10,000 partitions a read costs 5-8 ms.
	counted := false
	for {
		mb.watch.busy()
		if mb.coord == nil {
			conn, err := mb.coordinator.dial(ctx)
			if err != nil {
				return 0, "", nil, err
			}
			mb.coord = conn
		}
		id := mb.ident.member()
		// Before the JoinGroup, so never above the leader's counts: see
		// watched. The leader replaces it with its own.
		if !counted {
			mb.watched = mb.readCounts(ctx, mds)
		}
		counted = false
		res, err := joinGroup(ctx, mb.coord, joinRequest{
			group: cfg.GroupID, sessionTimeout: cfg.SessionTimeout, rebalanceTimeout: cfg.RebalanceTimeout,
			member: id, instance: cfg.InstanceID,
			protocols: []string{protocolCooperativeSticky, protocolRange}, metadata: subs,
		}, cfg.RebalanceTimeout+cfg.Timeout)
		if err != nil {
			mb.closeCoordinator()
			return 0, "", nil, fmt.Errorf("JoinGroup: %w", err)
		}
		err = res.err
		mb.log.Debug("JoinGroup answered", zap.String("member", res.self), zap.Int32("generation", res.generation),
			zap.String("leader", res.leader), zap.Int("members", len(res.members)), zap.Error(err))
		if errors.Is(err, kafka.MemberIDRequired) && res.self != "" {
			mb.ident.setID(res.self)
			counted = true
			continue // KIP-394: join again with the id the coordinator gave
		}
		if errors.Is(err, kafka.UnknownMemberId) {
			mb.ident.setID("")
		}
		if isCoordinatorErr(err) {
			mb.closeCoordinator()
		}
		if err != nil {
			return 0, "", nil, fmt.Errorf("JoinGroup: %w", err)
		}
		mb.ident.setID(res.self)

		var assignments map[string][]byte
		if res.leader == res.self {
			if assignments, err = mb.lead(ctx, res, mds); err != nil {
				return 0, "", nil, err
			}
		}
		raw, kerr, err := syncGroup(ctx, mb.coord, cfg.GroupID, res.generation, res.self, cfg.InstanceID, assignments, cfg.RebalanceTimeout+cfg.Timeout)
		if err != nil {
			mb.closeCoordinator()
			return 0, "", nil, fmt.Errorf("SyncGroup: %w", err)
		}
		if errors.Is(kerr, kafka.RebalanceInProgress) {
			continue
		}
		if isCoordinatorErr(kerr) {
			mb.closeCoordinator()
		}
		if kerr != nil {
			return 0, "", nil, fmt.Errorf("SyncGroup: %w", kerr)
		}
		all, err := decodeAssignment(raw)
		if err != nil {
			return 0, "", nil, fmt.Errorf("SyncGroup: %w", err)
		}
		var assigned []topicPartition
		for _, tp := range all {
			if slices.Contains(cfg.Topics, tp.topic) {
				assigned = append(assigned, tp)
			}
		}
		slices.SortFunc(assigned, compareTP)
		mb.ident.setGen(res.generation)
		mb.mu.Lock()
		mb.protocol = res.protocol
		mb.mu.Unlock()
		mb.book.joined() // settling until its assignment is reconciled: see rebalanced
		return res.generation, res.protocol, assigned, nil
	}
}

func (mb *classicMember) closeCoordinator() {
	if mb.coord != nil {
		mb.coord.Close()
		mb.coord = nil
	}
}

// lead computes the assignment of every member, as the group's leader.
// The metadata it reads is appended to *mds, for the loop to note.
func (mb *classicMember) lead(ctx context.Context, res *joinResponse, mds *[]*kmsg.MetadataResponse) (map[string][]byte, error) {
	var members []groupMember
	topics := map[string]bool{}
	for _, m := range res.members {
		subscribed, owned, err := decodeSubscription(m.metadata)
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", m.id, err)
		}
		members = append(members, groupMember{id: m.id, topics: subscribed, owned: owned})
		for _, t := range subscribed {
			topics[t] = true
		}
	}
	md, err := mb.cl.metadata(ctx, sortedKeys(topics))
	if err != nil {
		return nil, fmt.Errorf("metadata for the assignment: %w", err)
	}
	counts := partitionCountsOf(md)
	*mds = append(*mds, md)
	mb.watched = subscribedCounts(counts, mb.cfg.Topics)
	out, err := assign(res.protocol, members, counts)
	if err != nil {
		return nil, err
	}
	assignments := make(map[string][]byte, len(members))
	for _, m := range members {
		assignments[m.id] = encodeAssignment(out[m.id])
	}
	mb.log.Info("assigned the group's partitions as its leader", zap.String("protocol", res.protocol),
		zap.Int("members", len(members)), zap.Any("partitions", counts))
	return assignments, nil
}

// heartbeat sends a heartbeat every HeartbeatInterval, on a connection of
// its own to the coordinator, until the generation ends or ctx does, and
// says on ended (once) why it ended. A rebalance does not end it: it says
// so and goes on until ctx ends at the next join, as the coordinator drops
// a member whose heartbeats stop for SessionTimeout, even while it
// prepares a rebalance; the group loop may still be revoking (up to
// RebalanceTimeout), and its other partitions would be handed on while it
// handles them.
func (mb *classicMember) heartbeat(ctx context.Context, gen int32, ended chan<- generationEnd) {
	told := false
	tell := func(e generationEnd) {
		if !told {
			told = true
			ended <- e // capacity 1, sent once
		}
	}
	cfg := mb.cfg
	t := time.NewTicker(cfg.HeartbeatInterval)
	defer t.Stop()
	id := mb.ident.member()
	var conn *wire.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	failures := 0
	// The coordinator drops a member whose heartbeats it has not seen for
	// SessionTimeout, and hands its partitions to others: with no answer
	// for that long (less one interval, to stop before it does), the
	// partitions are lost here too, even if the coordinator is unreachable
	// and cannot say so.
	answered := time.Now()
	expiry := cfg.SessionTimeout - cfg.HeartbeatInterval
	// Failing calls end at once (a refused dial): the lease's end is then
	// noticed when it comes, not at the next tick, up to an interval late.
	leaseEnd := time.NewTimer(expiry)
	defer leaseEnd.Stop()
	for {
		select {
		case <-ctx.Done():
			tell(endStop)
			return
		case <-t.C:
		case <-leaseEnd.C:
		}
		// No call outlasts the lease: a coordinator lookup or a heartbeat
		// held by an unreachable broker (up to Timeout) would otherwise
		// keep the partitions past the point the coordinator drops them.
		lease, endLease := context.WithDeadline(ctx, answered.Add(expiry))
		var answer, err error
		if conn == nil {
			conn, err = mb.coordinator.dial(lease)
		}
		if err == nil {
			answer, err = heartbeat(lease, conn, cfg.GroupID, gen, id, cfg.InstanceID, min(cfg.Timeout, cfg.SessionTimeout))
			if err != nil || isCoordinatorErr(answer) {
				conn.Close()
				conn = nil
			}
		}
		endLease()
		if err == nil {
			err = answer
		}
		if err == nil || answer != nil && !isCoordinatorErr(answer) {
			answered = time.Now()
			leaseEnd.Reset(expiry)
			if err == nil || errors.Is(answer, kafka.RebalanceInProgress) {
				// The coordinator still counts this member: a lease for
				// the join that follows.
				mb.mu.Lock()
				mb.heartbeatAt = answered
				mb.mu.Unlock()
			}
		}
		switch {
		case err == nil:
			failures = 0
			continue
		case ctx.Err() != nil:
			tell(endStop)
			return
		case errors.Is(err, kafka.RebalanceInProgress):
			failures = 0
			tell(endRebalance)
			continue
		case errors.Is(err, kafka.FencedInstanceID):
			tell(endFenced)
			return
		case errors.Is(err, kafka.UnknownMemberId):
			mb.ident.setID("")
			mb.log.Warn("membership lost: the coordinator no longer knows this member", zap.Int32("generation", gen), zap.Error(err))
			tell(endLost)
			return
		case errors.Is(err, kafka.IllegalGeneration):
			mb.log.Warn("membership lost: the group moved to another generation", zap.Int32("generation", gen), zap.Error(err))
			tell(endLost)
			return
		}
		failures++
		if time.Since(answered) >= expiry {
			mb.log.Warn("membership lost: no heartbeat answered for a session timeout; the coordinator has dropped this member by now",
				zap.Int32("generation", gen), zap.Duration("since_last_answer", time.Since(answered)), zap.Error(err))
			tell(endLost)
			return
		}
		if logWorthy(failures) {
			mb.log.Warn("heartbeat failed; retrying at the next interval", zap.Int32("generation", gen), zap.Int("failures", failures), zap.Error(err))
		}
	}
}

// leave tells the coordinator this member is gone, so that the group
// rebalances at once rather than after SessionTimeout.
func (mb *classicMember) leave() {
	id := mb.ident.member()
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), mb.cfg.Timeout)
	defer cancel()
	var err error
	if mb.coord == nil {
		mb.coord, err = mb.coordinator.dial(ctx)
	}
	if err == nil {
		err = leaveGroup(ctx, mb.coord, mb.cfg.GroupID, id, mb.cfg.InstanceID, mb.cfg.Timeout)
	}
	mb.closeCoordinator()
	if err != nil {
		mb.log.Warn("leaving the group failed; the coordinator drops this member after SessionTimeout", zap.Error(err))
		return
	}
	mb.log.Info("left the group")
}

// partitionWatchInterval is how often a member checks the subscribed
// topics' partition counts.
const partitionWatchInterval = 5 * time.Second

// partitionCountsOf is the partition count of each topic in md that has no
// error.
func partitionCountsOf(md *kmsg.MetadataResponse) map[string]int {
	out := map[string]int{}
	for _, t := range md.Topics {
		if t.ErrorCode == 0 && t.Topic != nil {
			out[*t.Topic] = len(t.Partitions)
		}
	}
	return out
}

// subscribedCounts is counts restricted to topics: the leader reads the
// topics of every member's subscription.
func subscribedCounts(counts map[string]int, topics []string) map[string]int {
	out := make(map[string]int, len(topics))
	for t, n := range counts {
		if slices.Contains(topics, t) {
			out[t] = n
		}
	}
	return out
}

// errUnknownTopicOrPartition is Kafka's UNKNOWN_TOPIC_OR_PARTITION: in a
// Metadata answer, a topic that does not exist.
const errUnknownTopicOrPartition = 3

// The classic group protocol's requests, in the versions package wire pins
// (they carry the group instance id of static membership), each on the
// connection of its sender (the group loop's, the heartbeats').

// joinRequest is a JoinGroup request's fields.
type joinRequest struct {
	group            string
	sessionTimeout   time.Duration
	rebalanceTimeout time.Duration
	member, instance string
	protocols        []string // names, in order of preference
	metadata         [][]byte // each protocol's subscription
}

type joinMember struct {
	id, instance string
	metadata     []byte
}

type joinResponse struct {
	err                    error
	generation             int32
	protocol, leader, self string
	members                []joinMember
}

func joinGroup(ctx context.Context, conn *wire.Conn, r joinRequest, timeout time.Duration) (*joinResponse, error) {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = r.group
	req.SessionTimeoutMillis = int32(r.sessionTimeout / time.Millisecond)
	req.RebalanceTimeoutMillis = int32(r.rebalanceTimeout / time.Millisecond)
	req.MemberID = r.member
	req.InstanceID = nullable(r.instance)
	req.ProtocolType = "consumer"
	for i, p := range r.protocols {
		jp := kmsg.NewJoinGroupRequestProtocol()
		jp.Name, jp.Metadata = p, r.metadata[i]
		req.Protocols = append(req.Protocols, jp)
	}
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return nil, err
	}
	res := msg.(*kmsg.JoinGroupResponse)
	out := &joinResponse{err: wire.Error(res.ErrorCode), generation: res.Generation, protocol: deref(res.Protocol),
		leader: res.LeaderID, self: res.MemberID}
	for _, m := range res.Members {
		out.members = append(out.members, joinMember{id: m.MemberID, instance: deref(m.InstanceID), metadata: m.ProtocolMetadata})
	}
	return out, nil
}

// syncGroup returns the member's assignment and the coordinator's answer
// (kerr), or err when there was none.
func syncGroup(ctx context.Context, conn *wire.Conn, group string, gen int32, member, instance string, assignments map[string][]byte, timeout time.Duration) (assignment []byte, kerr, err error) {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.Generation, req.MemberID, req.InstanceID = group, gen, member, nullable(instance)
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range assignments {
			if !yield(id) {
				return
			}
		}
	}) {
		a := kmsg.NewSyncGroupRequestGroupAssignment()
		a.MemberID, a.MemberAssignment = id, assignments[id]
		req.GroupAssignment = append(req.GroupAssignment, a)
	}
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return nil, nil, err
	}
	res := msg.(*kmsg.SyncGroupResponse)
	return res.MemberAssignment, wire.Error(res.ErrorCode), nil
}

// heartbeat returns the coordinator's answer (nil: the generation goes on),
// or err when there was none.
func heartbeat(ctx context.Context, conn *wire.Conn, group string, gen int32, member, instance string, timeout time.Duration) (answer, err error) {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.Generation, req.MemberID, req.InstanceID = group, gen, member, nullable(instance)
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return nil, err
	}
	return wire.Error(msg.(*kmsg.HeartbeatResponse).ErrorCode), nil
}

func leaveGroup(ctx context.Context, conn *wire.Conn, group, member, instance string, timeout time.Duration) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID, m.InstanceID = member, nullable(instance)
	req.Members = append(req.Members, m)
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return err
	}
	res := msg.(*kmsg.LeaveGroupResponse)
	if err := wire.Error(res.ErrorCode); err != nil {
		return err
	}
	for _, m := range res.Members {
		if err := wire.Error(m.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}
