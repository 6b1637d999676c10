package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// responses stores one real response of every other request the engine
// sends, a classic group's life included, with some errors among them.
func (c *capture) responses(ctx context.Context) error {
	conn, err := dialRaw(ctx, c.seeds[0])
	if err != nil {
		return err
	}
	defer conn.close()
	if _, err := c.response(conn, "apiversions", kmsg.NewPtrApiVersionsRequest()); err != nil {
		return err
	}
	// The metadata response again, now of a topic unknown to the broker.
	md := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(c.name("no-such-topic"))
	md.Topics = append(md.Topics, mt)
	if _, err := c.response(conn, "metadata-unknown-topic", md); err != nil {
		return err
	}
	lead, err := leaders(ctx, conn, c, c.topic, "metadata-again")
	if err != nil {
		return err
	}
	lc, err := dialRaw(ctx, lead[0])
	if err != nil {
		return err
	}
	defer lc.close()

	lo := kmsg.NewPtrListOffsetsRequest()
	lo.ReplicaID, lo.IsolationLevel = -1, 1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = c.topic
	for _, ts := range []int64{-2, -1} {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = 0, ts, -1
		rt.Partitions = []kmsg.ListOffsetsRequestTopicPartition{rp}
		lo.Topics = []kmsg.ListOffsetsRequestTopic{rt}
		if _, err := c.response(lc, fmt.Sprintf("listoffsets%d", ts), lo); err != nil {
			return err
		}
	}

	pr := kmsg.NewPtrProduceRequest()
	pr.Acks, pr.TimeoutMillis = -1, 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = c.topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = wire.OneRecordBatch(time.Now(), []byte("k"), []byte("a dead letter"), nil)
	pt.Partitions = append(pt.Partitions, pp)
	pr.Topics = append(pr.Topics, pt)
	if _, err := c.response(lc, "produce", pr); err != nil {
		return err
	}
	pr.Topics[0].Topic = c.name("no-such-topic")
	if _, err := c.response(lc, "produce-unknown-topic", pr); err != nil {
		return err
	}
	return c.groupLife(ctx, conn)
}

// groupLife joins a group as its only member, syncs, heartbeats, commits,
// reads the commit back and leaves; and a commit from a member the group
// does not know.
func (c *capture) groupLife(ctx context.Context, conn *rawConn) error {
	group := c.name("group")
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKey = group
	var coord string
	for try := 0; ; try++ {
		res, err := c.response(conn, "findcoordinator", fc)
		if err != nil {
			return err
		}
		r := res.(*kmsg.FindCoordinatorResponse)
		if kerr.ErrorForCode(r.ErrorCode) == nil {
			coord = fmt.Sprintf("%s:%d", r.Host, r.Port)
			break
		}
		if try == 20 {
			return fmt.Errorf("finding the coordinator of %s: %w", group, kerr.ErrorForCode(r.ErrorCode))
		}
		time.Sleep(500 * time.Millisecond)
	}
	gc, err := dialRaw(ctx, coord)
	if err != nil {
		return err
	}
	defer gc.close()

	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version, meta.Topics = 1, []string{c.topic}
	jg := kmsg.NewPtrJoinGroupRequest()
	jg.Group, jg.SessionTimeoutMillis, jg.RebalanceTimeoutMillis, jg.ProtocolType = group, 10000, 10000, "consumer"
	for _, name := range []string{"cooperative-sticky", "range"} {
		jp := kmsg.NewJoinGroupRequestProtocol()
		jp.Name, jp.Metadata = name, meta.AppendTo(nil)
		jg.Protocols = append(jg.Protocols, jp)
	}
	var join *kmsg.JoinGroupResponse
	for i := 0; i < 3; i++ {
		// The first join of a member without an id is refused with the id
		// to use (MEMBER_ID_REQUIRED) on brokers that ask for it.
		res, err := c.response(gc, fmt.Sprintf("joingroup-%d", i), jg)
		if err != nil {
			return err
		}
		join = res.(*kmsg.JoinGroupResponse)
		if kerr.ErrorForCode(join.ErrorCode) != kerr.MemberIDRequired {
			break
		}
		jg.MemberID = join.MemberID
	}
	if err := kerr.ErrorForCode(join.ErrorCode); err != nil {
		return fmt.Errorf("joining %s: %w", group, err)
	}
	as := kmsg.NewConsumerMemberAssignment()
	as.Topics = []kmsg.ConsumerMemberAssignmentTopic{{Topic: c.topic, Partitions: []int32{0, 1, 2, 3, 4, 5}}}
	sg := kmsg.NewPtrSyncGroupRequest()
	sg.Group, sg.Generation, sg.MemberID = group, join.Generation, join.MemberID
	sg.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: join.MemberID, MemberAssignment: as.AppendTo(nil)}}
	if _, err := c.response(gc, "syncgroup", sg); err != nil {
		return err
	}
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.Generation, hb.MemberID = group, join.Generation, join.MemberID
	if _, err := c.response(gc, "heartbeat", hb); err != nil {
		return err
	}
	oc := kmsg.NewPtrOffsetCommitRequest()
	oc.Group, oc.Generation, oc.MemberID = group, join.Generation, join.MemberID
	ot := kmsg.NewOffsetCommitRequestTopic()
	ot.Topic = c.topic
	for p := int32(0); p < 3; p++ {
		op := kmsg.NewOffsetCommitRequestTopicPartition()
		op.Partition, op.Offset, op.LeaderEpoch, op.Metadata = p, int64(10+p), -1, kmsg.StringPtr("tidemark")
		ot.Partitions = append(ot.Partitions, op)
	}
	oc.Topics = append(oc.Topics, ot)
	if _, err := c.response(gc, "offsetcommit", oc); err != nil {
		return err
	}
	of := kmsg.NewPtrOffsetFetchRequest()
	of.Group = group
	oft := kmsg.NewOffsetFetchRequestTopic()
	oft.Topic, oft.Partitions = c.topic, []int32{0, 1, 2, 3}
	of.Topics = append(of.Topics, oft)
	if _, err := c.response(gc, "offsetfetch", of); err != nil {
		return err
	}
	lg := kmsg.NewPtrLeaveGroupRequest()
	lg.Group = group
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID = join.MemberID
	lg.Members = append(lg.Members, lm)
	if _, err := c.response(gc, "leavegroup", lg); err != nil {
		return err
	}
	// After the leave: the broker no longer knows the member.
	if _, err := c.response(gc, "heartbeat-unknown-member", hb); err != nil {
		return err
	}
	if _, err := c.response(gc, "offsetcommit-unknown-member", oc); err != nil {
		return err
	}
	// Last, on a connection of its own: a plaintext listener may close
	// the connection on a SASL handshake.
	sc, err := dialRaw(ctx, c.seeds[0])
	if err != nil {
		return err
	}
	defer sc.close()
	sh := kmsg.NewPtrSASLHandshakeRequest()
	sh.Mechanism = "PLAIN"
	if _, err := c.response(sc, "saslhandshake", sh); err != nil {
		fmt.Println("fuzzcorpus: no SASLHandshake response:", err)
	}
	return nil
}
