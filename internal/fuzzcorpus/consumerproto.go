package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// consumerProtocol stores the responses of a consumer group protocol
// (KIP-848) member's life at the versions its membership pins
// (wire.ConsumerProtocolVersions): the topics' ids, a join and the
// assignment's acknowledgement, a commit and an offset read with the member
// epoch and a commit with a stale one, a heartbeat with a fenced epoch, the
// leave, and a heartbeat of the member after it; the group's and the
// coordinator's session timeout (DescribeConfigs). A broker without the
// protocol (before Kafka 4.0) stores nothing and says so.
func (c *capture) consumerProtocol(ctx context.Context) error {
	conn, err := dialRaw(ctx, c.seeds[0])
	if err != nil {
		return err
	}
	defer conn.close()
	group := c.name("group848")
	gc, node, err := c.coordinatorOf(ctx, conn, group)
	if err != nil {
		return err
	}
	defer gc.close()
	at := func(name string, req kmsg.Request) (kmsg.Response, error) {
		v := wire.ConsumerProtocolVersions[kmsg.Key(req.Key())]
		body, res, err := gc.doAt(req, v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := c.write("internal/wire", "FuzzResponses", name, req.Key(), body); err != nil {
			return nil, err
		}
		return res, nil
	}

	md := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(c.topic)
	md.Topics = append(md.Topics, mt)
	res, err := at("metadata-topic-ids", md)
	if err != nil {
		return err
	}
	var topicID [16]byte
	for _, t := range res.(*kmsg.MetadataResponse).Topics {
		topicID = t.TopicID
	}

	member := "fuzzcorpus-member-0000000001"
	hb := func(epoch int32, owned []int32) *kmsg.ConsumerGroupHeartbeatRequest {
		r := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		r.Group, r.MemberID, r.MemberEpoch = group, member, epoch
		r.RebalanceTimeoutMillis = 10000
		r.SubscribedTopicNames = []string{c.topic}
		rt := kmsg.NewConsumerGroupHeartbeatRequestTopic()
		rt.TopicID, rt.Partitions = topicID, owned
		r.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		if len(owned) > 0 {
			r.Topics = append(r.Topics, rt)
		}
		return r
	}
	res, err = at("consumergroupheartbeat-join", hb(0, nil))
	if err != nil {
		return err
	}
	join := res.(*kmsg.ConsumerGroupHeartbeatResponse)
	if err := kerr.ErrorForCode(join.ErrorCode); err != nil {
		if err == kerr.UnsupportedVersion || err == kerr.InvalidRequest {
			fmt.Println("fuzzcorpus: the broker refuses the consumer group protocol:", err)
			return nil
		}
		return fmt.Errorf("joining %s with the consumer protocol: %w", group, err)
	}
	epoch := join.MemberEpoch
	var owned []int32
	for try := 0; join.Assignment == nil || len(owned) == 0; try++ {
		if join.Assignment != nil {
			for _, t := range join.Assignment.Topics {
				owned = append(owned, t.Partitions...)
			}
		}
		if len(owned) > 0 {
			break
		}
		if try == 20 {
			return fmt.Errorf("group %s: no assignment in 20 heartbeats", group)
		}
		time.Sleep(500 * time.Millisecond)
		r, err := at("consumergroupheartbeat-keepalive", hb(epoch, nil))
		if err != nil {
			return err
		}
		join = r.(*kmsg.ConsumerGroupHeartbeatResponse)
		epoch = max(epoch, join.MemberEpoch)
	}
	res, err = at("consumergroupheartbeat-ack", hb(epoch, owned))
	if err != nil {
		return err
	}
	dc := kmsg.NewPtrDescribeConfigsRequest()
	dg := kmsg.NewDescribeConfigsRequestResource()
	dg.ResourceType, dg.ResourceName, dg.ConfigNames = kmsg.ConfigResourceTypeGroupConfig, group, []string{"consumer.session.timeout.ms"}
	db := kmsg.NewDescribeConfigsRequestResource()
	db.ResourceType, db.ResourceName, db.ConfigNames = kmsg.ConfigResourceTypeBroker, fmt.Sprint(node), []string{"group.consumer.session.timeout.ms"}
	dc.Resources = append(dc.Resources, dg, db)
	if _, err := at("describeconfigs-session", dc); err != nil {
		return err
	}
	epoch = max(epoch, res.(*kmsg.ConsumerGroupHeartbeatResponse).MemberEpoch)

	oc := kmsg.NewPtrOffsetCommitRequest()
	oc.Group, oc.Generation, oc.MemberID = group, epoch, member
	ot := kmsg.NewOffsetCommitRequestTopic()
	ot.Topic = c.topic
	for _, p := range owned {
		op := kmsg.NewOffsetCommitRequestTopicPartition()
		op.Partition, op.Offset, op.LeaderEpoch, op.Metadata = p, int64(10+p), -1, kmsg.StringPtr("tidemark")
		ot.Partitions = append(ot.Partitions, op)
	}
	oc.Topics = append(oc.Topics, ot)
	if _, err := at("offsetcommit-member-epoch", oc); err != nil {
		return err
	}
	oc.Generation = epoch + 5 // an epoch the member does not have yet
	if _, err := at("offsetcommit-stale-epoch", oc); err != nil {
		return err
	}
	of := kmsg.NewPtrOffsetFetchRequest()
	og := kmsg.NewOffsetFetchRequestGroup()
	og.Group, og.MemberID, og.MemberEpoch = group, kmsg.StringPtr(member), epoch
	ogt := kmsg.NewOffsetFetchRequestGroupTopic()
	ogt.Topic, ogt.Partitions = c.topic, owned
	og.Topics = append(og.Topics, ogt)
	of.Groups = append(of.Groups, og)
	if _, err := at("offsetfetch-member-epoch", of); err != nil {
		return err
	}
	if _, err := at("consumergroupheartbeat-fenced-epoch", hb(epoch+5, owned)); err != nil {
		return err
	}
	if _, err := at("consumergroupheartbeat-leave", hb(-1, nil)); err != nil {
		return err
	}
	_, err = at("consumergroupheartbeat-unknown-member", hb(epoch, owned))
	return err
}

// coordinatorOf finds group's coordinator through conn and dials it; node
// is its node id.
func (c *capture) coordinatorOf(ctx context.Context, conn *rawConn, group string) (gc *rawConn, node int32, err error) {
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKey = group
	for try := 0; ; try++ {
		_, res, err := conn.do(fc)
		if err != nil {
			return nil, 0, err
		}
		r := res.(*kmsg.FindCoordinatorResponse)
		if kerr.ErrorForCode(r.ErrorCode) == nil {
			gc, err := dialRaw(ctx, fmt.Sprintf("%s:%d", r.Host, r.Port))
			return gc, r.NodeID, err
		}
		if try == 20 {
			return nil, 0, fmt.Errorf("finding the coordinator of %s: %w", group, kerr.ErrorForCode(r.ErrorCode))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
