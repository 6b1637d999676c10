package kafkaproxy

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// echoFunc copies the items of a parsed request (topics and partitions,
// groups, coordinator keys, members) into its still-empty response, so that
// every item the client asked about gets an answer.
type echoFunc func(req kmsg.Request, resp kmsg.Response)

// echoes lists the api keys whose error responses the proxy can synthesize.
// Keys whose responses only carry a top-level error code need no echo.
var echoes = map[kmsg.Key]echoFunc{
	kmsg.Produce:         echoProduce,
	kmsg.Fetch:           echoFetch,
	kmsg.ListOffsets:     echoListOffsets,
	kmsg.OffsetCommit:    echoOffsetCommit,
	kmsg.OffsetFetch:     echoOffsetFetch,
	kmsg.FindCoordinator: echoFindCoordinator,
	kmsg.JoinGroup:       nil,
	kmsg.Heartbeat:       nil,
	kmsg.LeaveGroup:      echoLeaveGroup,
	kmsg.SyncGroup:       nil,
	kmsg.DescribeGroups:  echoDescribeGroups,
	kmsg.CreateTopics:    echoCreateTopics,
	kmsg.DeleteTopics:    echoDeleteTopics,
	kmsg.InitProducerID:  nil,
	// The consumer group protocol's heartbeat (KIP-848) carries one
	// top-level error code; an error answer names no member and no epoch.
	kmsg.ConsumerGroupHeartbeat: nil,
}

// FailableKeys returns the api keys that Fail accepts, in ascending order.
func FailableKeys() []kmsg.Key {
	keys := make([]kmsg.Key, 0, len(echoes))
	for k := range echoes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// synthesize parses the request in frame and returns a complete response
// frame of the same version in which every error code field, top-level and
// per item, is code.
func synthesize(h reqHeader, frame []byte, code int16) ([]byte, error) {
	echo, ok := echoes[kmsg.Key(h.key)]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnsupported, kmsg.NameForKey(h.key))
	}
	body, err := requestBody(h, frame)
	if err != nil {
		return nil, err
	}
	req := kmsg.RequestForKey(h.key)
	if h.version < 0 || h.version > req.MaxVersion() {
		return nil, fmt.Errorf("%s v%d is newer than kmsg knows (v%d)", kmsg.NameForKey(h.key), h.version, req.MaxVersion())
	}
	req.SetVersion(h.version)
	if err := req.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decoding %s v%d request: %w", kmsg.NameForKey(h.key), h.version, err)
	}
	resp := req.ResponseKind()
	resp.SetVersion(h.version)
	if echo != nil {
		echo(req, resp)
	}
	setErrorCodes(reflect.ValueOf(resp), code)
	return responseFrame(resp, h.corr), nil
}

// setErrorCodes sets every exported int16 field named ErrorCode reachable
// from v through pointers, structs and slices of structs.
func setErrorCodes(v reflect.Value, code int16) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			setErrorCodes(v.Elem(), code)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			if f.Name == "ErrorCode" && f.Type.Kind() == reflect.Int16 {
				v.Field(i).SetInt(int64(code))
				continue
			}
			setErrorCodes(v.Field(i), code)
		}
	case reflect.Slice:
		if k := v.Type().Elem().Kind(); k == reflect.Struct || k == reflect.Pointer {
			for i := range v.Len() {
				setErrorCodes(v.Index(i), code)
			}
		}
	}
}

func echoProduce(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.ProduceRequest), resp.(*kmsg.ProduceResponse)
	for _, t := range q.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.BaseOffset = -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = append(r.Topics, rt)
	}
}

func echoFetch(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.FetchRequest), resp.(*kmsg.FetchResponse)
	for _, t := range q.Topics {
		rt := kmsg.NewFetchResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewFetchResponseTopicPartition()
			rp.Partition = p.Partition
			rp.HighWatermark = -1
			rp.PreferredReadReplica = -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = append(r.Topics, rt)
	}
}

func echoListOffsets(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.ListOffsetsRequest), resp.(*kmsg.ListOffsetsResponse)
	for _, t := range q.Topics {
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewListOffsetsResponseTopicPartition()
			rp.Partition = p.Partition
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = append(r.Topics, rt)
	}
}

func echoOffsetCommit(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.OffsetCommitRequest), resp.(*kmsg.OffsetCommitResponse)
	for _, t := range q.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = append(r.Topics, rt)
	}
}

func echoOffsetFetch(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.OffsetFetchRequest), resp.(*kmsg.OffsetFetchResponse)
	for _, t := range q.Topics { // v0-v7
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetFetchResponseTopicPartition()
			rp.Partition = p
			rp.Offset = -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = append(r.Topics, rt)
	}
	for _, g := range q.Groups { // v8+
		rg := kmsg.NewOffsetFetchResponseGroup()
		rg.Group = g.Group
		for _, t := range g.Topics {
			rt := kmsg.NewOffsetFetchResponseGroupTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
				rp.Partition = p
				rp.Offset = -1
				rt.Partitions = append(rt.Partitions, rp)
			}
			rg.Topics = append(rg.Topics, rt)
		}
		r.Groups = append(r.Groups, rg)
	}
}

func echoFindCoordinator(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.FindCoordinatorRequest), resp.(*kmsg.FindCoordinatorResponse)
	r.NodeID, r.Port = -1, -1             // v0-v3
	for _, k := range q.CoordinatorKeys { // v4+
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key = k
		c.NodeID, c.Port = -1, -1
		r.Coordinators = append(r.Coordinators, c)
	}
}

func echoLeaveGroup(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.LeaveGroupRequest), resp.(*kmsg.LeaveGroupResponse)
	for _, m := range q.Members { // v3+
		rm := kmsg.NewLeaveGroupResponseMember()
		rm.MemberID, rm.InstanceID = m.MemberID, m.InstanceID
		r.Members = append(r.Members, rm)
	}
}

func echoDescribeGroups(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.DescribeGroupsRequest), resp.(*kmsg.DescribeGroupsResponse)
	for _, g := range q.Groups {
		rg := kmsg.NewDescribeGroupsResponseGroup()
		rg.Group = g
		r.Groups = append(r.Groups, rg)
	}
}

func echoCreateTopics(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.CreateTopicsRequest), resp.(*kmsg.CreateTopicsResponse)
	for _, t := range q.Topics {
		rt := kmsg.NewCreateTopicsResponseTopic()
		rt.Topic = t.Topic
		rt.NumPartitions, rt.ReplicationFactor = -1, -1
		r.Topics = append(r.Topics, rt)
	}
}

func echoDeleteTopics(req kmsg.Request, resp kmsg.Response) {
	q, r := req.(*kmsg.DeleteTopicsRequest), resp.(*kmsg.DeleteTopicsResponse)
	for _, name := range q.TopicNames { // v0-v5
		rt := kmsg.NewDeleteTopicsResponseTopic()
		rt.Topic = kmsg.StringPtr(name)
		r.Topics = append(r.Topics, rt)
	}
	for _, t := range q.Topics { // v6+
		rt := kmsg.NewDeleteTopicsResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		r.Topics = append(r.Topics, rt)
	}
}
