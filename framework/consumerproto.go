package framework

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/wire"
)

// ErrInstanceIDInUse is returned by Run with GroupProtocol "consumer" when
// another live member of the group holds Config.InstanceID: the
// coordinator answered UNRELEASED_INSTANCE_ID for a while. Another process
// uses the same InstanceID, or one stopped without leaving the group (a
// SIGKILL) less than the broker's session timeout ago. This consumer never
// joined, so it committed nothing and lost nothing.
var ErrInstanceIDInUse = errors.New("tidemark: InstanceID in use by another live member of the group")

// ErrGroupProtocolRefused is returned by Run with GroupProtocol "consumer"
// when the group's coordinator will not take this member into the group
// with that protocol: the group has members of the classic protocol and
// the broker does not convert it online (GROUP_ID_NOT_FOUND to the first
// heartbeat). This consumer never joined: it committed and lost nothing.
var ErrGroupProtocolRefused = errors.New("tidemark: the coordinator refuses this group protocol for the group")

// The consumer group protocol's versions, pinned for this membership in
// wire.ConsumerProtocolVersions, not in wire.Versions (the classic
// membership never sends them): ConsumerGroupHeartbeat v0 (topic names, no
// regex), Metadata v12 (topic ids: the assignment names topics by id), and
// the commits and offset reads that carry the member epoch (OffsetCommit
// v9, OffsetFetch v9), as the coordinator refuses older ones from a
// consumer-protocol member.
var (
	consumerHeartbeatVersion = wire.ConsumerProtocolVersions[kmsg.ConsumerGroupHeartbeat]
	consumerMetadataVersion  = wire.ConsumerProtocolVersions[kmsg.Metadata]
)

// consumerProtocolVersions are the coordinator's versions for this
// membership (coordinator.go).
var consumerProtocolVersions = groupVersions{
	offsetCommit: wire.ConsumerProtocolVersions[kmsg.OffsetCommit],
	offsetFetch:  wire.ConsumerProtocolVersions[kmsg.OffsetFetch],
}

// The consumer group protocol's error codes (KIP-848) that kafka-go's table
// lacks; wire.Error names them.
const (
	errFencedMemberEpoch    = kafka.Error(110)
	errUnreleasedInstanceID = kafka.Error(111)
	errUnsupportedAssignor  = kafka.Error(112)
	errStaleMemberEpoch     = kafka.Error(113)
)

// consumerSessionTimeout is the session timeout this membership assumes of
// the broker until the broker says otherwise (brokerSession): Kafka's
// default group.consumer.session.timeout.ms, 45 s. Partitions kept with no
// heartbeat answered for the session less a margin are given up as lost
// (leaseMargin).
const consumerSessionTimeout = 45 * time.Second

// leaseMargin is how long before the coordinator could drop this member
// its lease ends: an interval, but at most a tenth of the session, as the
// broker's interval may be close to its session (kfake's default interval
// is 5 s whatever the session; Kafka's are 5 s and 45 s).
func leaseMargin(session, interval time.Duration) time.Duration {
	return min(interval, session/10)
}

// settleBeat is the wait before the next heartbeat: the broker's interval,
// or a tenth of it (at least 100 ms) for an interval after this member
// joined or its assignment changed. A partition the coordinator moves to a
// member comes in its first heartbeat answer after the previous owner
// released it, and the owners release theirs within an interval of the
// change; at the broker's pace (5 s by default) every join would cost the
// joining member an interval more. The price: about ten more heartbeats
// from a member after each change of its assignment.
func settleBeat(interval time.Duration, changed time.Time) time.Duration {
	if time.Since(changed) >= interval {
		return interval
	}
	return min(interval, max(interval/10, 100*time.Millisecond))
}

// sameAssignment reports whether a and b assign the same partitions.
func sameAssignment(a, b map[[16]byte][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for id, ps := range a {
		qs, ok := b[id]
		if !ok || len(ps) != len(qs) {
			return false
		}
		ps, qs = slices.Clone(ps), slices.Clone(qs)
		slices.Sort(ps)
		slices.Sort(qs)
		if !slices.Equal(ps, qs) {
			return false
		}
	}
	return true
}

// unreleasedRetries is how many UNRELEASED_INSTANCE_ID answers in a row a
// join retries (the previous holder's leave may be in flight) before Run
// returns ErrInstanceIDInUse.
const unreleasedRetries = 5

// consumerMember is the membership of Kafka 4's consumer group protocol
// (KIP-848): the coordinator computes every member's assignment; the member
// heartbeats with ConsumerGroupHeartbeat, learns its target assignment and
// member epoch from the answers, and acknowledges what it owns in the next
// heartbeat. No member ever waits for another: a partition that stays keeps
// running, one that moves is revoked (drained, flushed, committed) by its
// owner, which then says so, and only then does the coordinator give it on.
//
// The member id is generated here (a UUID, kept across rejoins); the
// member epoch is ident's generation, so commits carry it. Owned partitions
// travel by topic id, resolved through Metadata v12.
//
// Goroutines: Run runs the membership loop (run), which alone drives the
// assignee; run starts one heartbeat goroutine (heartbeats) that owns the
// connection to the coordinator and the protocol's state (member id,
// epoch), and tells the loop what the coordinator said through posted
// (a target assignment, latest first) and lapse (a lost membership, which
// the heartbeats wait for the loop to handle before rejoining). mu guards
// what the two share.
type consumerMember struct {
	cfg         *Config
	log         *zap.Logger
	a           assignee
	ident       *identity
	coordinator *coordinator
	cl          *cluster
	deadLetters *deadLetters
	watch       *loopWatch
	book        memberBook

	// names and ids map topic ids to the subscribed topics' names and
	// back, as the last metadata read said: the loop's only.
	names map[[16]byte]string
	ids   map[string][16]byte

	// notify wakes the loop: a target or a lapse was posted; kick wakes
	// the heartbeats: the owned partitions changed (an acknowledgement to
	// send now).
	notify, kick chan struct{}

	mu sync.Mutex
	// target is the last assignment the coordinator sent, not taken by
	// the loop yet.
	target *consumerTarget
	// lapsed is the membership's end the heartbeats saw, not handled by
	// the loop yet; lapseDone is closed once the loop has.
	lapsed    *consumerLapse
	lapseDone chan struct{}
	// report is what the next full heartbeat says is owned, by topic id,
	// and reportN counts its changes (the heartbeats send a full request
	// for each).
	report  []kmsg.ConsumerGroupHeartbeatRequestTopic
	reportN uint64
	// cancelReconcile ends the reconciliation going on (its offset reads)
	// when the membership lapses: its epoch is over.
	cancelReconcile context.CancelFunc
	// noLeave: the loop ends without leaving the group (fenced, refused).
	noLeave bool
}

// consumerTarget is an assignment the coordinator sent, at the member
// epoch that came with it.
type consumerTarget struct {
	epoch  int32
	topics map[[16]byte][]int32
}

// consumerLapse is why the membership ended, as a heartbeat answered.
type consumerLapse struct {
	reason string
	err    error // ends Run: fenced instance, or a refusal naming the setting
}

// newConsumerMember makes the consumer-protocol membership that drives a
// (see newClassicMember for the collaborators).
func newConsumerMember(cfg *Config, log *zap.Logger, a assignee, ident *identity, coordinator *coordinator,
	cl *cluster, deadLetters *deadLetters, watch *loopWatch) *consumerMember {
	return &consumerMember{cfg: cfg, log: log, a: a, ident: ident, coordinator: coordinator, cl: cl,
		deadLetters: deadLetters, watch: watch, book: memberBook{cfg: cfg, log: log, a: a},
		notify: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
}

// status implements membership.
func (mb *consumerMember) status() memberStatus { return mb.book.status() }

// newMemberID is a member id as the Java client makes one: 16 random
// bytes, base64url without padding.
func newMemberID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// run implements membership: the loop that reconciles each assignment the
// heartbeats post, until ctx ends; then it revokes everything (committing,
// unless fenced) while the heartbeats still run, and leaves the group (a
// static member with epoch -2, so that its restart gets its partitions
// back, unless Config.LeaveOnClose).
func (mb *consumerMember) run(ctx context.Context) error {
	mb.ident.setID(newMemberID())
	mb.publish(nil)
	hctx, stopHeartbeats := context.WithCancel(context.WithoutCancel(ctx))
	hbDone := make(chan struct{})
	var fatal error
	defer func() {
		graceful := fatal == nil || errors.Is(fatal, errNoDeadLetterTopic)
		mb.a.revoke(mb.a.owned(), graceful, reasonShutdown)
		if !graceful {
			mb.mu.Lock()
			mb.noLeave = true
			mb.mu.Unlock()
		}
		stopHeartbeats() // they leave the group, unless noLeave
		<-hbDone
		mb.ident.setGen(-1)
		mb.book.rebalanced(false)
	}()
	mb.book.rebalancing()
	// The dead-letter topics are checked before the first join, as the
	// classic membership does; one that does not exist ends Run.
	if fatal = mb.deadLetters.check(ctx); fatal != nil {
		close(hbDone)
		return fatal
	}
	mb.refreshTopics(ctx) // the first counts (assignee.seen) come before any assignment
	go func() {
		defer close(hbDone)
		mb.heartbeats(hctx)
	}()

	var last *consumerTarget // the last target, again while some topic id is unresolved
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		mb.watch.idle()
		unresolvedTick := false
		select {
		case <-ctx.Done():
			return nil
		case <-mb.notify:
		case <-retry.C:
			if last == nil {
				continue
			}
			unresolvedTick = true
		}
		mb.watch.busy()
		mb.mu.Lock()
		t, lapse, done := mb.target, mb.lapsed, mb.lapseDone
		mb.target = nil
		mb.mu.Unlock()
		if lapse != nil {
			mb.a.lose(mb.a.owned(), lapse.reason)
			mb.ident.setGen(-1)
			mb.publish(nil)
			last = nil
			if lapse.err != nil {
				fatal = lapse.err
				mb.mu.Lock()
				mb.noLeave = true
				mb.mu.Unlock()
				close(done)
				return fatal
			}
			mb.mu.Lock()
			mb.lapsed = nil
			mb.mu.Unlock()
			if fatal = mb.deadLetters.check(ctx); fatal != nil {
				close(done)
				return fatal
			}
			mb.book.rebalancing()
			close(done) // the heartbeats rejoin now
			continue
		}
		if t == nil && unresolvedTick {
			t = last
		}
		if t == nil {
			continue
		}
		last = nil
		if !mb.reconcile(ctx, t) {
			last = t
		}
	}
}

// reconcile brings the owned partitions to t in the Java client's order:
// the partitions t no longer holds are revoked first (drained, flushed,
// their final watermarks committed with the current epoch) and the next
// heartbeat acknowledges it, so the coordinator can give them on; then the
// added ones are started, and the next heartbeat acknowledges them too.
// It reports false when a topic id of t is not known yet (a topic just
// created): those partitions wait for the next metadata read.
func (mb *consumerMember) reconcile(ctx context.Context, t *consumerTarget) bool {
	want, resolved := mb.resolve(ctx, t)
	owned := mb.a.owned()
	var revoked, added []topicPartition
	for _, tp := range owned {
		if !slices.Contains(want, tp) {
			revoked = append(revoked, tp)
		}
	}
	for _, tp := range want {
		if !slices.Contains(owned, tp) {
			added = append(added, tp)
		}
	}
	if len(revoked)+len(added) == 0 {
		mb.publish(owned) // acknowledges an epoch that changed nothing here
		if _, _, joining := mb.book.rebalanceStats(); joining {
			mb.book.rebalanced(true) // a join whose first epoch brought nothing (or nothing new)
		}
		return resolved
	}
	mb.book.rebalancing()
	if len(added) > 0 {
		mb.book.joined()
	}
	mb.log.Info("assignment received", zap.Int32("member_epoch", t.epoch), zap.Int("owned", len(owned)),
		zap.Int("assigned", len(want)), zap.Int("revoked", len(revoked)), zap.Int("added", len(added)))
	rctx, cancel := context.WithCancel(ctx)
	mb.mu.Lock()
	mb.cancelReconcile = cancel
	mb.mu.Unlock()
	defer func() {
		mb.mu.Lock()
		mb.cancelReconcile = nil
		mb.mu.Unlock()
		cancel()
	}()
	mb.a.revoke(revoked, true, "rebalance")
	mb.publish(mb.a.owned()) // the revocation's acknowledgement, at once
	mb.watch.busy()
	mb.a.start(rctx, added)
	mb.publish(mb.a.owned())
	mb.book.rebalanced(true)
	return resolved
}

// resolve names t's partitions, reading the metadata again when a topic id
// is not known; it reports whether every id was resolved. A topic not
// subscribed (Config.Topics) is left out.
func (mb *consumerMember) resolve(ctx context.Context, t *consumerTarget) ([]topicPartition, bool) {
	for id := range t.topics {
		if _, ok := mb.names[id]; !ok {
			mb.refreshTopics(ctx)
			break
		}
	}
	var out []topicPartition
	resolved := true
	for id, ps := range t.topics {
		name, ok := mb.names[id]
		if !ok {
			resolved = false
			continue
		}
		if !slices.Contains(mb.cfg.Topics, name) {
			continue
		}
		for _, p := range ps {
			out = append(out, topicPartition{name, p})
		}
	}
	slices.SortFunc(out, compareTP)
	out = slices.Compact(out)
	if !resolved {
		mb.log.Info("the assignment names a topic id the metadata does not know yet; its partitions wait for the next read")
	}
	return out, resolved
}

// refreshTopics reads the subscribed topics' metadata with their topic ids
// and notes what it says (memberBook.noteTopics). A failed read leaves the
// known ids as they were.
func (mb *consumerMember) refreshTopics(ctx context.Context) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range mb.cfg.Topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	req.AllowAutoTopicCreation = false
	mctx, cancel := context.WithTimeout(ctx, mb.cfg.Timeout)
	defer cancel()
	var res kmsg.Response
	addr, err := mb.coordinator.address(mctx)
	if err == nil {
		res, err = mb.cl.client.AtVersion(mctx, addr, req, consumerMetadataVersion, mb.cfg.Timeout)
		if err != nil {
			mb.coordinator.forget(addr)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			mb.log.Warn("reading the subscribed topics' ids failed; retrying when an assignment needs them", zap.Error(err))
		}
		return
	}
	md := res.(*kmsg.MetadataResponse)
	if mb.names == nil {
		mb.names, mb.ids = map[[16]byte]string{}, map[string][16]byte{}
	}
	for _, t := range md.Topics {
		if t.ErrorCode == 0 && t.Topic != nil && t.TopicID != ([16]byte{}) {
			mb.names[t.TopicID] = *t.Topic
			mb.ids[*t.Topic] = t.TopicID
		}
	}
	mb.book.noteTopics(md)
}

// publish sets what the next full heartbeat reports as owned, and wakes
// the heartbeats when it changed: the acknowledgement goes out at once.
func (mb *consumerMember) publish(owned []topicPartition) {
	byTopic := map[string][]int32{}
	for _, tp := range owned {
		byTopic[tp.topic] = append(byTopic[tp.topic], tp.partition)
	}
	report := []kmsg.ConsumerGroupHeartbeatRequestTopic{} // empty, not null: "owning nothing"
	for _, name := range sortedKeys(byTopic) {
		rt := kmsg.NewConsumerGroupHeartbeatRequestTopic()
		rt.TopicID = mb.ids[name]
		rt.Partitions = byTopic[name]
		slices.Sort(rt.Partitions)
		report = append(report, rt)
	}
	mb.mu.Lock()
	changed := !slices.EqualFunc(report, mb.report, func(x, y kmsg.ConsumerGroupHeartbeatRequestTopic) bool {
		return x.TopicID == y.TopicID && slices.Equal(x.Partitions, y.Partitions)
	}) || mb.report == nil
	if changed {
		mb.report = report
		mb.reportN++
	}
	mb.mu.Unlock()
	if changed {
		select {
		case mb.kick <- struct{}{}:
		default:
		}
	}
}

// post hands a target to the loop, replacing one it has not taken.
func (mb *consumerMember) post(t *consumerTarget) {
	mb.mu.Lock()
	mb.target = t
	mb.mu.Unlock()
	select {
	case mb.notify <- struct{}{}:
	default:
	}
}

// lapse tells the loop the membership ended and waits until it has given
// the partitions up (or ctx ends): a rejoin must not claim them meanwhile.
// It reports false if ctx ended first.
func (mb *consumerMember) lapse(ctx context.Context, l *consumerLapse) bool {
	done := make(chan struct{})
	mb.mu.Lock()
	mb.target = nil
	mb.lapsed, mb.lapseDone = l, done
	if mb.cancelReconcile != nil {
		mb.cancelReconcile()
	}
	mb.mu.Unlock()
	mb.ident.setGen(-1) // commits stop: the epoch is over
	select {
	case mb.notify <- struct{}{}:
	default:
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// heartbeats sends a ConsumerGroupHeartbeat at the interval the
// coordinator asks for, at once when the owned partitions change, until
// ctx ends; then it leaves the group (unless noLeave). A full request
// (subscription, owned partitions, instance id) goes out on joining, after
// any error, while owning nothing and to acknowledge a change; a keepalive
// (the fields null: unchanged) otherwise.
func (mb *consumerMember) heartbeats(ctx context.Context) {
	cfg := mb.cfg
	var conn *wire.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	epoch := int32(0)
	full := true
	var sentN uint64 // the report the last answered full request carried
	interval := cfg.HeartbeatInterval
	bo := newBackoff(cfg.JoinGroupBackoff/4, cfg.JoinGroupBackoff*4)
	// answered is when the last heartbeat answered was sent: the
	// coordinator's session for this member runs from no earlier.
	answered := time.Now()
	session := consumerSessionTimeout
	// assigned is the last assignment the coordinator sent; changed, when
	// it or the membership last changed (settleBeat).
	var assigned map[[16]byte][]int32
	var changed time.Time
	unreleased, failures := 0, 0
	next := time.NewTimer(0)
	defer next.Stop()
	wait := func(d time.Duration) {
		next.Stop()
		select {
		case <-next.C:
		default:
		}
		next.Reset(d)
	}
	for {
		select {
		case <-ctx.Done():
		case <-next.C:
		case <-mb.kick:
		}
		if ctx.Err() != nil { // checked first: a kick may be ready too
			mb.mu.Lock()
			noLeave := mb.noLeave
			mb.mu.Unlock()
			if !noLeave && epoch > 0 {
				mb.leave(conn, epoch)
			}
			return
		}
		mb.mu.Lock()
		owning := len(mb.report) > 0
		mb.mu.Unlock()
		leaseEnd := answered.Add(session - leaseMargin(session, interval))
		if epoch > 0 && owning && time.Now().After(leaseEnd) {
			mb.log.Warn("membership lost: no heartbeat answered for the broker's session timeout; the coordinator has dropped this member by now",
				zap.Int32("member_epoch", epoch), zap.Duration("since_last_answer", time.Since(answered)), zap.Duration("session_timeout", session))
			if !mb.lapse(ctx, &consumerLapse{reason: "no heartbeat answered for a session timeout"}) {
				continue
			}
			epoch, full = 0, true
		}
		id := mb.ident.member()
		mb.mu.Lock()
		report, reportN := mb.report, mb.reportN
		mb.mu.Unlock()
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.MemberEpoch = cfg.GroupID, id, epoch
		if epoch == 0 || full || len(report) == 0 || reportN != sentN {
			req.InstanceID = nullable(cfg.InstanceID)
			req.RebalanceTimeoutMillis = int32(cfg.RebalanceTimeout / time.Millisecond)
			req.SubscribedTopicNames = cfg.Topics
			req.ServerAssignor = nullable(cfg.GroupRemoteAssignor)
			req.Topics = report
			if epoch == 0 {
				req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{} // a (re)join owns nothing
			}
		}
		sent := time.Now()
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if epoch > 0 && owning {
			// No answer past the lease: the member must give its
			// partitions up then, not once the request times out.
			sctx, cancel = context.WithDeadline(ctx, leaseEnd)
		}
		res, err := mb.send(sctx, &conn, req)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			full = true
			failures++
			if epoch == 0 {
				mb.book.joinFailed(err)
			}
			if logWorthy(failures) {
				mb.log.Warn("consumer group heartbeat failed; retrying", zap.Int32("member_epoch", epoch), zap.Int("failures", failures), zap.Error(err))
			}
			wait(min(bo.next(), interval))
			continue
		}
		kerr := wire.Error(res.ErrorCode)
		if res.ErrorMessage != nil && kerr != nil {
			kerr = fmt.Errorf("%w (%s)", kerr, *res.ErrorMessage)
		}
		if kerr == nil && res.MemberEpoch < 0 {
			// Only a leave's answer has a negative epoch: storing it would
			// make the next heartbeat a leave.
			kerr = fmt.Errorf("heartbeat answered with member epoch %d", res.MemberEpoch)
		}
		if hb := time.Duration(res.HeartbeatIntervalMillis) * time.Millisecond; hb > 0 {
			interval = hb
		}
		if kerr == nil {
			answered = sent
			failures, unreleased = 0, 0
			bo.reset()
			if epoch == 0 {
				changed = time.Now()
				mb.book.joinFailed(nil)
				// At each join: a group's config can change between two.
				s, err := mb.brokerSession(ctx)
				if err != nil {
					mb.log.Warn("the broker did not say the group's session timeout; assuming Kafka's default", zap.Duration("session_timeout", session), zap.Error(err))
				} else {
					session = s
				}
				mb.log.Info("joined the group (consumer protocol)", zap.String("member", id), zap.Int32("member_epoch", res.MemberEpoch), zap.Duration("session_timeout", session))
			}
			if res.MemberID != nil && *res.MemberID != "" && *res.MemberID != id {
				mb.ident.setID(*res.MemberID) // a broker that still assigns ids
			}
			epoch = res.MemberEpoch
			mb.ident.setGen(epoch)
			if req.Topics != nil {
				sentN, full = reportN, false
			}
			if a := res.Assignment; a != nil {
				t := &consumerTarget{epoch: epoch, topics: map[[16]byte][]int32{}}
				for _, at := range a.Topics {
					t.topics[at.TopicID] = append(t.topics[at.TopicID], at.Partitions...)
				}
				if !sameAssignment(t.topics, assigned) {
					assigned, changed = t.topics, time.Now()
				}
				mb.post(t)
			}
			wait(settleBeat(interval, changed))
			continue
		}
		full = true
		if epoch == 0 {
			mb.book.joinFailed(fmt.Errorf("ConsumerGroupHeartbeat: %w", kerr))
		}
		switch {
		case errors.Is(kerr, errFencedMemberEpoch):
			mb.log.Warn("membership lost: the coordinator fenced this member's epoch; its partitions are given up uncommitted and it rejoins with the same id",
				zap.Int32("member_epoch", epoch), zap.Error(kerr))
			if mb.lapse(ctx, &consumerLapse{reason: "member epoch fenced"}) {
				epoch = 0
			}
			wait(0)
		case errors.Is(kerr, kafka.UnknownMemberId):
			mb.log.Warn("membership lost: the coordinator no longer knows this member; its partitions are given up uncommitted and it rejoins with a new id",
				zap.Int32("member_epoch", epoch), zap.Error(kerr))
			if mb.lapse(ctx, &consumerLapse{reason: "membership lost"}) {
				epoch = 0
				mb.ident.setID(newMemberID())
			}
			wait(0)
		case errors.Is(kerr, kafka.FencedInstanceID):
			mb.lapse(ctx, &consumerLapse{reason: "fenced", err: fmt.Errorf("%w (InstanceID %q, group %s): %v", ErrFencedInstance, cfg.InstanceID, cfg.GroupID, kerr)})
			<-ctx.Done()
		case errors.Is(kerr, errUnreleasedInstanceID) && unreleased < unreleasedRetries:
			unreleased++
			mb.log.Info("the InstanceID is still held by another member; retrying", zap.String("instance_id", cfg.InstanceID), zap.Int("tries", unreleased), zap.Error(kerr))
			wait(bo.next())
		case errors.Is(kerr, errUnreleasedInstanceID):
			mb.lapse(ctx, &consumerLapse{reason: "InstanceID in use", err: fmt.Errorf(
				"%w: group %s answered %v %d times: another process uses Config.InstanceID %q, or one stopped without leaving less than the broker's group.consumer.session.timeout.ms ago",
				ErrInstanceIDInUse, cfg.GroupID, kerr, unreleased+1, cfg.InstanceID)})
			<-ctx.Done()
		case errors.Is(kerr, errUnsupportedAssignor):
			mb.lapse(ctx, &consumerLapse{reason: "refused", err: fmt.Errorf(
				"tidemark: Config.GroupRemoteAssignor %q is not an assignor of the broker (its group.consumer.assignors), group %s: %w", cfg.GroupRemoteAssignor, cfg.GroupID, kerr)})
			<-ctx.Done()
		case errors.Is(kerr, kafka.GroupMaxSizeReached):
			mb.lapse(ctx, &consumerLapse{reason: "refused", err: fmt.Errorf(
				"tidemark: group %s is full: it has the broker's group.consumer.max.size members already (Config.GroupID): %w", cfg.GroupID, kerr)})
			<-ctx.Done()
		case errors.Is(kerr, kafka.GroupIdNotFound) && epoch == 0:
			// The group exists with members of the classic protocol and
			// the broker does not convert it (Kafka's message says why:
			// group.consumer.migration.policy, a group larger than
			// group.consumer.max.size, a custom assignor), or it is a
			// group of another type; kfake converts no group with members.
			mb.lapse(ctx, &consumerLapse{reason: "refused", err: fmt.Errorf(
				"%w: group %s has members of another protocol and its coordinator does not convert it for Config.GroupProtocol %q "+
					"(Kafka 4.x converts a classic group online unless group.consumer.migration.policy forbids it, the group is larger than group.consumer.max.size, or its members use a custom assignor): %v",
				ErrGroupProtocolRefused, cfg.GroupID, cfg.GroupProtocol, kerr)})
			<-ctx.Done()
		case errors.Is(kerr, kafka.UnsupportedVersion):
			mb.lapse(ctx, &consumerLapse{reason: "refused", err: fmt.Errorf(
				"tidemark: Config.GroupProtocol %q: the coordinator of group %s refused ConsumerGroupHeartbeat (Kafka 4.0 or later, with the consumer protocol enabled, is needed): %w", cfg.GroupProtocol, cfg.GroupID, kerr)})
			<-ctx.Done()
		default:
			if isCoordinatorErr(kerr) {
				if conn != nil {
					conn.Close()
					conn = nil
				}
			}
			failures++
			if logWorthy(failures) {
				mb.log.Warn("consumer group heartbeat refused; retrying", zap.Int32("member_epoch", epoch), zap.Int("failures", failures), zap.Error(kerr))
			}
			wait(min(bo.next(), interval))
		}
	}
}

// brokerSession is the group's session timeout as its coordinator has it:
// the group's config consumer.session.timeout.ms, else the broker's
// group.consumer.session.timeout.ms (a heartbeat's answer does not carry
// it). The lease (heartbeats) is that less leaseMargin, so that a member
// cut off from the coordinator gives its partitions up before the
// coordinator gives them on; a broker with a shorter session than Kafka's default would
// otherwise leave this member handling partitions others have.
func (mb *consumerMember) brokerSession(ctx context.Context) (time.Duration, error) {
	const groupKey, brokerKey = "consumer.session.timeout.ms", "group.consumer.session.timeout.ms"
	req := kmsg.NewPtrDescribeConfigsRequest()
	g := kmsg.NewDescribeConfigsRequestResource()
	g.ResourceType, g.ResourceName, g.ConfigNames = kmsg.ConfigResourceTypeGroupConfig, mb.cfg.GroupID, []string{groupKey}
	b := kmsg.NewDescribeConfigsRequestResource()
	b.ResourceType, b.ResourceName, b.ConfigNames = kmsg.ConfigResourceTypeBroker, strconv.Itoa(int(mb.coordinator.nodeNow())), []string{brokerKey}
	req.Resources = append(req.Resources, g, b)
	msg, err := mb.coordinator.do(ctx, req, wire.ConsumerProtocolVersions[kmsg.DescribeConfigs])
	if err != nil {
		return 0, fmt.Errorf("DescribeConfigs of group %s: %w", mb.cfg.GroupID, err)
	}
	found := map[kmsg.ConfigResourceType]time.Duration{}
	var errs []error
	for _, r := range msg.(*kmsg.DescribeConfigsResponse).Resources {
		if err := wire.Error(r.ErrorCode); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w (%s)", r.ResourceType, r.ResourceName, err, deref(r.ErrorMessage)))
			continue
		}
		for _, c := range r.Configs {
			if (c.Name != groupKey && c.Name != brokerKey) || c.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*c.Value, 10, 32)
			if err != nil || ms <= 0 {
				errs = append(errs, fmt.Errorf("%s %s: %s = %q", r.ResourceType, r.ResourceName, c.Name, *c.Value))
				continue
			}
			found[r.ResourceType] = time.Duration(ms) * time.Millisecond
		}
	}
	for _, t := range []kmsg.ConfigResourceType{kmsg.ConfigResourceTypeGroupConfig, kmsg.ConfigResourceTypeBroker} {
		if d, ok := found[t]; ok {
			return d, nil
		}
	}
	errs = append(errs, fmt.Errorf("no %s for group %s nor %s for its coordinator", groupKey, mb.cfg.GroupID, brokerKey))
	return 0, errors.Join(errs...)
}

// send sends req on *conn, dialing the coordinator first if needed; a
// failed connection is closed and set to nil.
func (mb *consumerMember) send(ctx context.Context, conn **wire.Conn, req *kmsg.ConsumerGroupHeartbeatRequest) (*kmsg.ConsumerGroupHeartbeatResponse, error) {
	if *conn == nil {
		c, err := mb.coordinator.dial(ctx)
		if err != nil {
			return nil, err
		}
		if !c.SupportsVersion(kmsg.ConsumerGroupHeartbeat, consumerHeartbeatVersion) {
			c.Close()
			return nil, fmt.Errorf("Config.GroupProtocol %q: the coordinator %s does not support ConsumerGroupHeartbeat v%d (Kafka 4.0 or later is needed)",
				mb.cfg.GroupProtocol, c.Addr(), consumerHeartbeatVersion)
		}
		*conn = c
	}
	msg, err := (*conn).DoVersion(ctx, req, consumerHeartbeatVersion, mb.cfg.Timeout)
	if err != nil {
		(*conn).Close()
		*conn = nil
		return nil, fmt.Errorf("ConsumerGroupHeartbeat: %w", err)
	}
	return msg.(*kmsg.ConsumerGroupHeartbeatResponse), nil
}

// leave sends the leaving heartbeat: epoch -1, or -2 for a static member
// that keeps its place (Config.InstanceID without LeaveOnClose): its
// restart within the session timeout gets its partitions back. A leave
// that gets no answer, or a coordinator error, is sent again: a lost leave would leave the partitions this member
// gave up unassigned until the broker's session timeout (45 s by
// default). UNKNOWN_MEMBER_ID on a second try means the first one landed.
// All tries end within twice Timeout: one answer lost, one more try.
func (mb *consumerMember) leave(conn *wire.Conn, epoch int32) {
	cfg := mb.cfg
	ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.Timeout)
	defer cancel()
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group, req.MemberID, req.MemberEpoch = cfg.GroupID, mb.ident.member(), -1
	req.InstanceID = nullable(cfg.InstanceID)
	if cfg.InstanceID != "" && !cfg.LeaveOnClose {
		req.MemberEpoch = -2
	}
	var err error
	for try := 1; ; try++ {
		var res *kmsg.ConsumerGroupHeartbeatResponse
		res, err = mb.send(ctx, &conn, req)
		if err == nil {
			err = wire.Error(res.ErrorCode)
			if try > 1 && errors.Is(err, kafka.UnknownMemberId) {
				err = nil // an earlier try landed, its answer did not
			}
			if isCoordinatorErr(err) && conn != nil {
				conn.Close()
				conn = nil
			}
		}
		retriable := err != nil && (res == nil || isCoordinatorErr(err))
		if !retriable || ctx.Err() != nil {
			break
		}
		mb.log.Info("leaving the group: no answer or the coordinator moved; sending the leave again", zap.Int("tries", try), zap.Error(err))
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			break
		}
	}
	if conn != nil {
		conn.Close()
	}
	if err != nil {
		mb.log.Warn("leaving the group failed; the coordinator drops this member after its session timeout",
			zap.Int32("member_epoch", epoch), zap.Error(err))
		return
	}
	mb.log.Info("left the group", zap.Int32("member_epoch", epoch), zap.Int32("leave_epoch", req.MemberEpoch))
}
