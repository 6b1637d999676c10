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
	"github.com/tidemark/tidemark/offsetstore"
)

// ErrFencedInstance is returned by Run when another consumer joined the
// group with the same Config.InstanceID: this one stops, committing nothing
// more (its commits would be refused), and loses nothing (the offset file
// keeps its watermarks).
var ErrFencedInstance = errors.New("tidemark: fenced: another consumer joined the group with the same InstanceID")

// group is this consumer's membership in its consumer group, on the classic
// group protocol with kafka-go's Client calls (JoinGroup, SyncGroup,
// Heartbeat, LeaveGroup), and the partitions it owns.
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
// Goroutines: Run runs the membership loop (run) on its own goroutine; run
// starts, per generation, one heartbeat goroutine (heartbeats on their own
// schedule and, through the Transport, their own connection, never behind a
// commit or a drain), and one goroutine per partition it is assigned
// (runPartition, handle.go); the committer goroutine (commit.go) commits the
// owned partitions every CommitInterval. Run returns after all of them
// exited. mu guards the identity and the owned partitions, read by the
// committer and Stats.
type group struct {
	c      *Consumer
	log    *zap.Logger

	mu       sync.Mutex
	id       string // member id; "" before the first join
	gen      int32  // generation id; -1 when not a member
	protocol string // the assignor the group chose
	owned    map[topicPartition]*partition
	// coord is the connection to the coordinator for JoinGroup, SyncGroup
	// and LeaveGroup, used by run only; heartbeats have their own.
	coord *wire.Conn
	// coordAddr is the coordinator's address, "" until found or after it
	// moved (coordinator.go).
	coordAddr string
	// stuck lists the Handler calls abandoned at a revoke (see revoke).
	stuck []string
	// heartbeatAt is when the last heartbeat was answered.
	heartbeatAt time.Time
	// For Stats: generations joined, the time spent joining them, and
	// when the join going on began (zero if none).
	rebalances     uint64
	rebalanceTime  time.Duration
	rebalanceSince time.Time
	// lost counts the partitions given up without a commit (lose).
	lost atomic.Uint64
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

	// commitMu lets one commit run at a time (the committer, a revoke);
	// the fields below it are the committer's.
	commitMu   sync.Mutex
	fencedGen  int32 // commits of this generation were refused: skipped
	failures   int
	failedFrom time.Time
}

func newGroup(c *Consumer) *group {
	return &group{
		c:         c,
		log:       c.log,
		gen:       -1,
		fencedGen: -1,
		owned:     map[topicPartition]*partition{},
	}
}

// identity returns the current generation and member id.
func (g *group) identity() (int32, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gen, g.id
}

// ownedList returns the owned partitions, sorted.
func (g *group) ownedList() []*partition {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*partition, 0, len(g.owned))
	for _, p := range g.owned {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *partition) int { return compareTP(a.tp, b.tp) })
	return out
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

// run is the membership loop: join, sync, start and revoke partitions,
// heartbeat until the generation ends, and again; at ctx's end every
// partition is revoked (drained, committed) and the member leaves the group
// (a static one stays, unless Config.LeaveOnClose). It returns
// ErrFencedInstance, or nil.
func (g *group) run(ctx context.Context) error {
	cfg := &g.c.cfg
	var fatal error
	defer func() {
		// Graceful end: drain and commit everything while the generation is
		// still valid, then leave so that the others rebalance at once.
		graceful := fatal == nil || errors.Is(fatal, errNoDeadLetterTopic)
		g.revoke(g.ownedList(), graceful, "shutdown")
		if graceful && (cfg.InstanceID == "" || cfg.LeaveOnClose) {
			g.leave()
		}
		g.closeCoordinator()
		g.mu.Lock()
		g.gen, g.protocol = -1, ""
		g.mu.Unlock()
		g.rebalanced(false)
	}()
	bo := newBackoff(cfg.JoinGroupBackoff/4, cfg.JoinGroupBackoff*4)
	eager := true // until a generation chooses cooperative-sticky
	// confirmed is when the coordinator last confirmed this membership (a
	// sync, a heartbeat): partitions kept through a failing rejoin are
	// dropped once it is a session timeout old.
	confirmed := time.Now()
	for ctx.Err() == nil {
		g.c.live.group.busy() // liveness (liveness.go): each step stamps it
		// Until every dead-letter topic is known to exist (Kafka may not be
		// reachable yet): one that does not ends Run.
		if fatal = g.c.deadLetters.check(ctx); fatal != nil {
			return fatal
		}
		g.rebalancing()
		if eager {
			g.revoke(g.ownedList(), true, "eager rebalance")
		}
		// While the join is pending no heartbeat confirms the membership:
		// if the coordinator cannot be reached, it completes the rebalance
		// without this member and hands its partitions on after
		// RebalanceTimeout (or drops it after SessionTimeout). Kept
		// partitions are given up as lost before either can happen.
		lease := min(cfg.SessionTimeout, cfg.RebalanceTimeout) - cfg.HeartbeatInterval
		leaseDone := make(chan struct{})
		leaseTimer := time.AfterFunc(time.Until(confirmed.Add(lease)), func() {
			defer close(leaseDone)
			g.lose(g.ownedList(), "no membership confirmed while joining")
		})
		// A graceful stop during a join lets the join complete when
		// partitions are kept (bounded by RebalanceTimeout): the coordinator
		// forms the next generation with this member in it, and the final
		// commit of the kept partitions needs that generation; one made with
		// the old one would be refused, and their next owners would handle
		// again what was handled since the last commit.
		jctx, jcancel := context.WithCancel(context.WithoutCancel(ctx))
		stopJoin := context.AfterFunc(ctx, func() {
			if len(g.ownedList()) == 0 {
				jcancel()
				return
			}
			time.AfterFunc(cfg.RebalanceTimeout, jcancel)
		})
		gen, protocol, assigned, err := g.joinAndSync(jctx)
		stopJoin()
		jcancel()
		if leaseTimer.Stop() {
			close(leaseDone)
		}
		<-leaseDone
		if err == nil && ctx.Err() != nil {
			g.log.Info("joined a generation while stopping; committing the kept partitions with it", zap.Int32("generation", gen))
			return nil
		}
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, kafka.FencedInstanceID):
				fatal = fmt.Errorf("%w (InstanceID %q, group %s): %v", ErrFencedInstance, cfg.InstanceID, cfg.GroupID, err)
				g.lose(g.ownedList(), "fenced")
				return fatal
			case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration):
				g.lose(g.ownedList(), "membership lost")
			case time.Since(confirmed) > cfg.SessionTimeout:
				// Kept partitions were confirmed by the last generation's
				// heartbeats; with no join for a session timeout the
				// coordinator may have given them to others.
				g.lose(g.ownedList(), "no membership for a session timeout")
			}
			g.joinFailed(err)
			d := bo.next()
			if logWorthy(bo.n) {
				g.log.Warn("joining the group failed; retrying", zap.Duration("backoff", d), zap.Error(err))
			}
			sleep(ctx, d)
			continue
		}
		bo.reset()
		g.joinFailed(nil)
		confirmed = time.Now()
		eager = protocol != protocolCooperativeSticky

		// The heartbeats of this generation run from here until the next
		// join, through every drain and reconciliation below.
		hctx, stopHeartbeats := context.WithCancel(context.WithoutCancel(ctx))
		ended := make(chan generationEnd, 1)
		hbDone := make(chan struct{})
		go func() {
			defer close(hbDone)
			ended <- g.heartbeat(hctx, gen)
		}()

		owned := g.ownedList()
		var revoked []*partition
		for _, p := range owned {
			if !slices.Contains(assigned, p.tp) {
				revoked = append(revoked, p)
			}
		}
		var added []topicPartition
		for _, tp := range assigned {
			if !slices.ContainsFunc(owned, func(p *partition) bool { return p.tp == tp }) {
				added = append(added, tp)
			}
		}
		if len(added) == 0 {
			// Nothing to reconcile: readiness need not wait for the
			// revoked partitions' drain.
			g.mu.Lock()
			g.settling = false
			g.mu.Unlock()
		}
		g.log.Info("generation joined", zap.Int32("generation", gen), zap.String("protocol", protocol),
			zap.Int("owned", len(owned)), zap.Int("assigned", len(assigned)), zap.Int("revoked", len(revoked)), zap.Int("added", len(added)))
		g.c.live.group.busy()
		g.revoke(revoked, true, "rebalance")
		g.c.live.group.busy()
		g.start(ctx, added)
		g.rebalanced(true)

		end := endRevoked
		if len(revoked) == 0 || eager {
			g.c.live.group.idle()
			end = g.await(ctx, ended)
			g.c.live.group.busy()
		}
		switch {
		case end == endStop:
			// A graceful stop: drain and commit while still heartbeating.
			g.revoke(g.ownedList(), true, "shutdown")
		case eager && (end == endRebalance || end == endPartitions):
			// Eager protocol: everything is revoked before the next join,
			// while the heartbeats of this generation still run.
			g.revoke(g.ownedList(), true, "eager rebalance")
		}
		stopHeartbeats()
		<-hbDone
		confirmed = g.lastHeartbeat(confirmed)
		switch end {
		case endStop:
			return nil
		case endFenced:
			fatal = fmt.Errorf("%w (InstanceID %q, group %s)", ErrFencedInstance, cfg.InstanceID, cfg.GroupID)
			g.lose(g.ownedList(), "fenced")
			return fatal
		case endLost:
			g.lose(g.ownedList(), "membership lost")
		}
	}
	return nil
}

// joinFailed notes a failed join (err), or a successful one (nil).
func (g *group) joinFailed(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		g.joinErr, g.joinFailingSince, g.joinFailures = "", time.Time{}, 0
		return
	}
	if g.joinFailures == 0 {
		g.joinFailingSince = time.Now()
	}
	g.joinFailures++
	g.joinErr = err.Error()
}

// joinTrouble returns what joinFailed noted.
func (g *group) joinTrouble() (err string, since time.Time, failures int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.joinErr, g.joinFailingSince, g.joinFailures
}

// rebalancing notes that a join begins, unless one is going on.
func (g *group) rebalancing() {
	g.mu.Lock()
	if g.rebalanceSince.IsZero() {
		g.rebalanceSince = time.Now()
	}
	g.mu.Unlock()
}

// rebalanced notes that the join going on ended, with a generation joined
// or not.
func (g *group) rebalanced(joined bool) {
	g.mu.Lock()
	if !g.rebalanceSince.IsZero() {
		g.rebalanceTime += time.Since(g.rebalanceSince)
		g.rebalanceSince = time.Time{}
	}
	if joined {
		g.rebalances++
	}
	g.settling = false
	g.mu.Unlock()
}

// rebalanceStats returns the generations joined, the time spent joining
// (the join going on included) and whether one is going on.
func (g *group) rebalanceStats() (uint64, time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.rebalanceTime
	if !g.rebalanceSince.IsZero() {
		d += time.Since(g.rebalanceSince)
	}
	return g.rebalances, d, !g.rebalanceSince.IsZero()
}

// isSettling reports a generation joined whose assignment is not
// reconciled yet.
func (g *group) isSettling() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.settling
}

// lastHeartbeat returns the later of t and the last answered heartbeat.
func (g *group) lastHeartbeat(t time.Time) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.heartbeatAt.After(t) {
		return g.heartbeatAt
	}
	return t
}

// await waits for the generation to end: its heartbeats say so, a topic
// grows, or ctx ends.
func (g *group) await(ctx context.Context, ended <-chan generationEnd) generationEnd {
	counts := g.partitionCounts(ctx)
	t := time.NewTicker(partitionWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return endStop
		case e := <-ended:
			return e
		case <-t.C:
			now := g.partitionCounts(ctx)
			if counts != nil && now != nil && !maps.Equal(counts, now) {
				g.log.Info("partitions added to a subscribed topic; rejoining so that they are assigned",
					zap.Any("before", counts), zap.Any("now", now))
				return endPartitions
			}
			if counts == nil {
				counts = now
			}
		}
	}
}

// drainGrace is how long a revoke waits, past DrainTimeout, for a Handler
// call that ignores its cancelled context.
const drainGrace = 2 * time.Second

// partitionWatchInterval is how often a member checks the subscribed
// topics' partition counts.
const partitionWatchInterval = 5 * time.Second

// partitionCounts reads the subscribed topics' partition counts; nil if the
// metadata cannot be read now.
func (g *group) partitionCounts(ctx context.Context) map[string]int {
	md, err := g.c.metadata(ctx, g.c.cfg.Topics)
	if err != nil {
		return nil
	}
	return partitionCountsOf(md)
}

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

// joinAndSync joins the group, assigns the partitions if this member leads,
// and returns the generation, the chosen protocol and this member's
// assignment.
func (g *group) joinAndSync(ctx context.Context) (int32, string, []topicPartition, error) {
	cfg := &g.c.cfg
	var owned []topicPartition
	for _, p := range g.ownedList() {
		owned = append(owned, p.tp)
	}
	// cooperative-sticky needs the owned partitions (version 1); range gets
	// version 0, which eager-only clients read (kafka-go's ConsumerGroup
	// refuses metadata longer than it knows).
	subs := [][]byte{encodeSubscription(cfg.Topics, owned, 1), encodeSubscription(cfg.Topics, nil, 0)}
	for {
		g.c.live.group.busy()
		if g.coord == nil {
			conn, err := g.dialCoordinator(ctx)
			if err != nil {
				return 0, "", nil, err
			}
			g.coord = conn
		}
		g.mu.Lock()
		id := g.id
		g.mu.Unlock()
		res, err := joinGroup(ctx, g.coord, joinRequest{
			group: cfg.GroupID, sessionTimeout: cfg.SessionTimeout, rebalanceTimeout: cfg.RebalanceTimeout,
			member: id, instance: cfg.InstanceID,
			protocols: []string{protocolCooperativeSticky, protocolRange}, metadata: subs,
		}, cfg.RebalanceTimeout+cfg.Timeout)
		if err != nil {
			g.closeCoordinator()
			return 0, "", nil, fmt.Errorf("JoinGroup: %w", err)
		}
		err = res.err
		g.log.Debug("JoinGroup answered", zap.String("member", res.self), zap.Int32("generation", res.generation),
			zap.String("leader", res.leader), zap.Int("members", len(res.members)), zap.Error(err))
		if errors.Is(err, kafka.MemberIDRequired) && res.self != "" {
			g.mu.Lock()
			g.id = res.self
			g.mu.Unlock()
			continue // KIP-394: join again with the id the coordinator gave
		}
		if errors.Is(err, kafka.UnknownMemberId) {
			g.mu.Lock()
			g.id = ""
			g.mu.Unlock()
		}
		if isCoordinatorErr(err) {
			g.closeCoordinator()
		}
		if err != nil {
			return 0, "", nil, fmt.Errorf("JoinGroup: %w", err)
		}
		g.mu.Lock()
		g.id = res.self
		g.mu.Unlock()

		var assignments map[string][]byte
		if res.leader == res.self {
			if assignments, err = g.lead(ctx, res); err != nil {
				return 0, "", nil, err
			}
		}
		raw, kerr, err := syncGroup(ctx, g.coord, cfg.GroupID, res.generation, res.self, cfg.InstanceID, assignments, cfg.RebalanceTimeout+cfg.Timeout)
		if err != nil {
			g.closeCoordinator()
			return 0, "", nil, fmt.Errorf("SyncGroup: %w", err)
		}
		if errors.Is(kerr, kafka.RebalanceInProgress) {
			continue
		}
		if isCoordinatorErr(kerr) {
			g.closeCoordinator()
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
		g.mu.Lock()
		g.gen, g.protocol = res.generation, res.protocol
		g.settling = true // until its assignment is reconciled: see rebalanced
		g.mu.Unlock()
		return res.generation, res.protocol, assigned, nil
	}
}

func (g *group) closeCoordinator() {
	if g.coord != nil {
		g.coord.Close()
		g.coord = nil
	}
}

// lead computes the assignment of every member, as the group's leader.
func (g *group) lead(ctx context.Context, res *joinResponse) (map[string][]byte, error) {
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
	md, err := g.c.metadata(ctx, sortedKeys(topics))
	if err != nil {
		return nil, fmt.Errorf("metadata for the assignment: %w", err)
	}
	counts := partitionCountsOf(md)
	out, err := assign(res.protocol, members, counts)
	if err != nil {
		return nil, err
	}
	assignments := make(map[string][]byte, len(members))
	for _, m := range members {
		assignments[m.id] = encodeAssignment(out[m.id])
	}
	g.log.Info("assigned the group's partitions as its leader", zap.String("protocol", res.protocol),
		zap.Int("members", len(members)), zap.Any("partitions", counts))
	return assignments, nil
}

// heartbeat sends a heartbeat every HeartbeatInterval, on a connection of
// its own to the coordinator, until the generation ends or ctx does, and
// says why it ended.
func (g *group) heartbeat(ctx context.Context, gen int32) generationEnd {
	cfg := &g.c.cfg
	t := time.NewTicker(cfg.HeartbeatInterval)
	defer t.Stop()
	_, id := g.identity()
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
	for {
		select {
		case <-ctx.Done():
			return endStop
		case <-t.C:
		}
		var answer, err error
		if conn == nil {
			conn, err = g.dialCoordinator(ctx)
		}
		if err == nil {
			answer, err = heartbeat(ctx, conn, cfg.GroupID, gen, id, cfg.InstanceID, min(cfg.Timeout, cfg.SessionTimeout))
			if err != nil || isCoordinatorErr(answer) {
				conn.Close()
				conn = nil
			}
		}
		if err == nil {
			err = answer
		}
		if err == nil || answer != nil && !isCoordinatorErr(answer) {
			answered = time.Now()
			if err == nil || errors.Is(answer, kafka.RebalanceInProgress) {
				// The coordinator still counts this member: a lease for
				// the join that follows.
				g.mu.Lock()
				g.heartbeatAt = answered
				g.mu.Unlock()
			}
		}
		switch {
		case err == nil:
			failures = 0
			continue
		case ctx.Err() != nil:
			return endStop
		case errors.Is(err, kafka.RebalanceInProgress):
			return endRebalance
		case errors.Is(err, kafka.FencedInstanceID):
			return endFenced
		case errors.Is(err, kafka.UnknownMemberId):
			g.mu.Lock()
			g.id = ""
			g.mu.Unlock()
			g.log.Warn("membership lost: the coordinator no longer knows this member", zap.Int32("generation", gen), zap.Error(err))
			return endLost
		case errors.Is(err, kafka.IllegalGeneration):
			g.log.Warn("membership lost: the group moved to another generation", zap.Int32("generation", gen), zap.Error(err))
			return endLost
		}
		failures++
		if time.Since(answered) >= expiry {
			g.log.Warn("membership lost: no heartbeat answered for a session timeout; the coordinator has dropped this member by now",
				zap.Int32("generation", gen), zap.Duration("since_last_answer", time.Since(answered)), zap.Error(err))
			return endLost
		}
		if logWorthy(failures) {
			g.log.Warn("heartbeat failed; retrying at the next interval", zap.Int32("generation", gen), zap.Int("failures", failures), zap.Error(err))
		}
	}
}

// leave tells the coordinator this member is gone, so that the group
// rebalances at once rather than after SessionTimeout.
func (g *group) leave() {
	_, id := g.identity()
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	defer cancel()
	var err error
	if g.coord == nil {
		g.coord, err = g.dialCoordinator(ctx)
	}
	if err == nil {
		err = leaveGroup(ctx, g.coord, g.c.cfg.GroupID, id, g.c.cfg.InstanceID, g.c.cfg.Timeout)
	}
	g.closeCoordinator()
	if err != nil {
		g.log.Warn("leaving the group failed; the coordinator drops this member after SessionTimeout", zap.Error(err))
		return
	}
	g.log.Info("left the group")
}

// start reconciles newly assigned partitions and starts their goroutines.
func (g *group) start(ctx context.Context, tps []topicPartition) {
	if len(tps) == 0 {
		return
	}
	gen, id := g.identity()
	committed, err := g.committedOffsets(ctx, tps)
	for err != nil {
		if ctx.Err() != nil {
			return
		}
		g.log.Warn("reading Kafka's committed offsets failed; retrying", zap.Error(err))
		if !sleep(ctx, time.Second) {
			return
		}
		g.c.live.group.busy()
		committed, err = g.committedOffsets(ctx, tps)
	}
	var parts []*partition
	for _, tp := range tps {
		p := &partition{
			tp:          tp,
			q:           newInbox[*chunk](),
			st:          g.c.partitionStats(tp.topic, tp.partition),
			key:         g.c.storeKey(tp.topic, tp.partition),
			kafkaOffset: committed[tp],
			committed:   committed[tp],
			policy:      g.c.cfg.policy(tp.topic),
			gen:         gen,
			member:      id,
			done:        make(chan struct{}),
		}
		p.st.setState(StateReconciling)
		parts = append(parts, p)
	}
	starts := g.reconcile(ctx, parts)
	g.openRuns(ctx, parts, starts)
	g.mu.Lock()
	for i, p := range parts {
		start, ok := starts[i]
		if !ok {
			close(p.done) // stalled by policy: not running, not committed
			continue
		}
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		p.cancel = cancel
		g.owned[p.tp] = p
		go func() {
			defer close(p.done) // revoke waits for it, bounded: see revoke
			g.runPartition(pctx, p, start)
		}()
	}
	g.mu.Unlock()
}

// committedOffsets reads Kafka's committed offsets of tps; -1 where none.
func (g *group) committedOffsets(ctx context.Context, tps []topicPartition) (map[topicPartition]int64, error) {
	fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
	defer cancel()
	got, err := g.fetchOffsets(fctx, tps)
	if err != nil {
		return nil, err
	}
	out := make(map[topicPartition]int64, len(tps))
	for _, tp := range tps {
		out[tp] = -1
	}
	for tp, o := range got {
		if o.err != nil {
			return nil, fmt.Errorf("%s/%d: %w", tp.topic, tp.partition, o.err)
		}
		if o.offset >= 0 {
			out[tp] = o.offset
		}
	}
	return out, nil
}

// fetchedOffset is one partition's answer to an OffsetFetch.
type fetchedOffset struct {
	offset int64
	err    error
}

// fetchOffsets asks the coordinator for the group's committed offsets of
// tps. A group the coordinator does not know has none.
func (g *group) fetchOffsets(ctx context.Context, tps []topicPartition) (map[topicPartition]fetchedOffset, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = g.c.cfg.GroupID
	for _, t := range groupByTopic(tps) {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = t.Topic, t.Partitions
		req.Topics = append(req.Topics, rt)
	}
	msg, err := g.toCoordinator(ctx, req)
	if err != nil {
		return nil, err
	}
	res := msg.(*kmsg.OffsetFetchResponse)
	out := map[topicPartition]fetchedOffset{}
	if err := wire.Error(res.ErrorCode); err != nil {
		if isCoordinatorErr(err) {
			g.forgetCoordinator(g.coordAddrNow())
		}
		if errors.Is(err, kafka.GroupIdNotFound) {
			return out, nil
		}
		return nil, err
	}
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			out[topicPartition{t.Topic, int(p.Partition)}] = fetchedOffset{offset: p.Offset, err: wire.Error(p.ErrorCode)}
		}
	}
	return out, nil
}

// coordAddrNow is the coordinator's address as known now.
func (g *group) coordAddrNow() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.coordAddr
}

// revoke stops parts: each drains (the Handler call in flight finishes,
// bounded by DrainTimeout), the offset file is flushed, and if commit is set
// their final watermarks are committed with the current generation, so the
// next owner starts exactly there. Lost partitions (the membership lapsed)
// are stopped without a commit: it would be refused.
func (g *group) revoke(parts []*partition, commit bool, reason string) {
	if len(parts) == 0 {
		return
	}
	for _, p := range parts {
		p.cancel()
	}
	// Each partition's goroutine returns once its Handler call returns; the
	// call's context is cancelled after DrainTimeout. A Handler that ignores
	// it is given drainGrace more, then abandoned: its message is not marked
	// done (it is handled again by the next owner), and Run reports it.
	timeout := time.NewTimer(g.c.cfg.DrainTimeout + drainGrace)
	defer timeout.Stop()
	expired := false
	for _, p := range parts {
		if !expired {
			select {
			case <-p.done:
				continue
			case <-timeout.C:
				expired = true
			}
		}
		select {
		case <-p.done:
		default:
			p.abandoned.Store(true)
			call := fmt.Sprintf("%s/%d offset %d", p.tp.topic, p.tp.partition, p.st.processed.Load())
			g.log.Error("a Handler call ignored its cancelled context past DrainTimeout; abandoning it: its message is not marked done",
				zap.String("topic", p.tp.topic), zap.Int("partition", p.tp.partition), zap.Int64("offset", p.st.processed.Load()),
				zap.Duration("waited", g.c.cfg.DrainTimeout+drainGrace))
			g.mu.Lock()
			g.stuck = append(g.stuck, call)
			g.mu.Unlock()
		}
	}
	fctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	err := g.c.store.Flush(fctx)
	cancel()
	if err != nil {
		g.log.Error("flushing the offset file on revoke failed; the watermarks recorded before it stay valid", zap.Error(err))
	}
	if commit {
		g.commit(parts, reason)
	}
	g.mu.Lock()
	for _, p := range parts {
		if g.owned[p.tp] == p {
			delete(g.owned, p.tp)
		}
		p.st.setState(StateRevoked)
	}
	g.mu.Unlock()
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = fmt.Sprintf("%s/%d", p.tp.topic, p.tp.partition)
	}
	g.log.Info("partitions revoked", zap.String("reason", reason), zap.Bool("committed", commit), zap.Strings("partitions", names))
}

// lose gives parts up without a commit: the membership lapsed or was
// fenced, so they may be someone else's already (Stats.PartitionsLost).
func (g *group) lose(parts []*partition, reason string) {
	g.lost.Add(uint64(len(parts)))
	g.revoke(parts, false, reason)
}

// openRuns reads each starting partition's run state for the crash-loop
// breaker (found open, the last run ended uncleanly) and records, durably
// and in one flush for all of them, that this run holds the partition.
func (g *group) openRuns(ctx context.Context, parts []*partition, starts map[int]int64) {
	if len(starts) == 0 {
		return
	}
	limit := max(g.c.cfg.CrashLoopRestarts, 0)
	for i, p := range parts {
		if _, ok := starts[i]; !ok {
			continue
		}
		rec, _ := g.c.store.Get(p.key)
		p.br = newBreaker(rec.Run, limit)
		p.st.careful.Store(p.br.careful)
		if p.br.careful {
			p.st.carefulEntries.Add(1)
			g.log.Warn("the last run ended uncleanly (crash, kill, power loss); handling the first messages carefully, one at a time, with their offsets durable",
				zap.String("topic", p.key.Topic), zap.Int("partition", int(p.key.Partition)),
				zap.Int64("in_flight_at_the_end", p.br.prev.Inflight), zap.Int32("unclean_restarts", p.br.prev.Crashes))
		}
		// The previous in-flight offset is kept in memory only: counted
		// again only if this run calls the Handler on it.
		if err := g.c.store.SetRun(p.key, offsetstore.RunState{Open: true, Inflight: -1}); err != nil {
			g.log.Error("recording the run state failed", zap.String("topic", p.key.Topic), zap.Int("partition", int(p.key.Partition)), zap.Error(err))
		}
	}
	fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
	defer cancel()
	if err := g.c.store.Flush(fctx); err != nil {
		g.log.Warn("flushing the run state failed; the crash-loop breaker may miss this run", zap.Error(err))
	}
}

// setWatermark records a watermark decided by reconciliation.
func (g *group) setWatermark(p *partition, wm int64) {
	if err := g.c.store.SetWatermark(p.key, wm, p.gen, p.member); err != nil {
		g.log.Error("recording the watermark failed", zap.String("topic", p.key.Topic),
			zap.Int("partition", int(p.key.Partition)), zap.Int64("offset", wm), zap.Error(err))
	}
}

// logWorthy says whether the nth failure in a row is logged: the first
// three, then every power of two, so that hours of failures are a few
// dozen lines.
func logWorthy(n int) bool { return n <= 3 || n&(n-1) == 0 }

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
