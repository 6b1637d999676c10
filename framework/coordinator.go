package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// coordinator is the group's coordinator broker as this consumer knows it:
// found with FindCoordinator, kept until an answer says it moved. The
// membership dials it for its own connections; commits and offset reads go
// to it through the cluster's client. Safe for concurrent use.
type coordinator struct {
	cfg *Config
	cl  *cluster
	// versions are the commit and offset-read versions of the group
	// protocol (zero: wire.Versions'); ident, with OffsetFetch v9 or
	// later, is the member identity the offset reads carry.
	versions groupVersions
	ident    *identity

	mu   sync.Mutex
	addr string // "" until found, or after it moved
	node int32  // the coordinator's node id, with addr
}

// groupVersions pins, per membership, the versions of the APIs whose
// version depends on the group protocol: the consumer protocol's members
// commit and read offsets at the versions that carry the member epoch
// (consumerProtocolVersions); zero means wire.Versions'.
type groupVersions struct {
	offsetCommit, offsetFetch int16
}

// version is v, or -1 (wire.Versions') when v is zero.
func version(v int16) int16 {
	if v == 0 {
		return -1
	}
	return v
}

// find asks any broker for the group's coordinator and remembers it.
func (k *coordinator) find(ctx context.Context) (string, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = k.cfg.GroupID
	req.CoordinatorType = 0 // a consumer group
	fctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	msg, err := k.cl.client.Any(fctx, req, k.cfg.Timeout)
	if err == nil {
		res := msg.(*kmsg.FindCoordinatorResponse)
		if err = wire.Error(res.ErrorCode); err == nil && res.Host == "" {
			err = fmt.Errorf("no coordinator in the answer")
		}
		if err == nil {
			addr := net.JoinHostPort(res.Host, strconv.Itoa(int(res.Port)))
			k.mu.Lock()
			k.addr, k.node = addr, res.NodeID
			k.mu.Unlock()
			return addr, nil
		}
	}
	return "", fmt.Errorf("finding the coordinator of group %s (brokers %s): %w", k.cfg.GroupID, strings.Join(k.cfg.Brokers, ","), err)
}

// address is the coordinator's address, found if not known.
func (k *coordinator) address(ctx context.Context) (string, error) {
	if addr := k.addrNow(); addr != "" {
		return addr, nil
	}
	return k.find(ctx)
}

// nodeNow is the node id of the coordinator last found.
func (k *coordinator) nodeNow() int32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.node
}

// forget drops addr after an answer that says the coordinator moved, or
// no answer: the next request finds it again.
func (k *coordinator) forget(addr string) {
	k.mu.Lock()
	if k.addr == addr {
		k.addr = ""
	}
	k.mu.Unlock()
}

// do sends req to the coordinator through the cluster's client, in
// version v (-1: wire.Versions').
func (k *coordinator) do(ctx context.Context, req kmsg.Request, v int16) (kmsg.Response, error) {
	addr, err := k.address(ctx)
	if err != nil {
		return nil, err
	}
	res, err := k.cl.client.AtVersion(ctx, addr, req, v, k.cfg.Timeout)
	if err != nil {
		k.forget(addr)
		return nil, err
	}
	return res, nil
}

// dial finds the coordinator and opens a connection of the caller's own.
func (k *coordinator) dial(ctx context.Context) (*wire.Conn, error) {
	addr, err := k.find(ctx)
	if err != nil {
		return nil, err
	}
	return k.cl.dial(ctx, addr)
}

// commit commits offsets (topic, partition, offset) for the group with the
// member identity gen and id, each with its metadata in meta, if any (the
// completed ranges carried to the next owner, handoff.go).
func (k *coordinator) commit(ctx context.Context, offsets map[string]map[int32]int64, meta map[topicPartition]string, gen int32, id string) error {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID, req.InstanceID = k.cfg.GroupID, gen, id, nullable(k.cfg.InstanceID)
	for _, t := range sortedKeys(offsets) {
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = t
		for p, o := range offsets[t] {
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, o, -1
			if m, ok := meta[topicPartition{t, p}]; ok {
				rp.Metadata = &m
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	msg, err := k.do(ctx, req, version(k.versions.offsetCommit))
	if err != nil {
		return err
	}
	for _, t := range msg.(*kmsg.OffsetCommitResponse).Topics {
		for _, p := range t.Partitions {
			if err := wire.Error(p.ErrorCode); err != nil {
				if isCoordinatorErr(err) {
					k.forget(k.addrNow())
				}
				return fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}

// fetchedOffset is one partition's answer to an OffsetFetch.
type fetchedOffset struct {
	offset int64
	meta   string // the commit's metadata
	err    error
}

// offsets asks the coordinator for the group's committed offsets of
// tps. A group the coordinator does not know has none.
func (k *coordinator) offsets(ctx context.Context, tps []topicPartition) (map[topicPartition]fetchedOffset, error) {
	if k.versions.offsetFetch >= 8 {
		return k.groupOffsets(ctx, tps)
	}
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = k.cfg.GroupID
	for _, t := range groupByTopic(tps) {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = t.Topic, t.Partitions
		req.Topics = append(req.Topics, rt)
	}
	msg, err := k.do(ctx, req, -1)
	if err != nil {
		return nil, err
	}
	res := msg.(*kmsg.OffsetFetchResponse)
	return k.readOffsets(res.ErrorCode, res.Topics)
}

// groupOffsets is offsets at OffsetFetch v8 or later (one group of the
// request's groups), carrying the member id and epoch from v9: an epoch
// the coordinator finds stale is an error (STALE_MEMBER_EPOCH), which the
// assignment retries, never a missing offset.
func (k *coordinator) groupOffsets(ctx context.Context, tps []topicPartition) (map[topicPartition]fetchedOffset, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	g := kmsg.NewOffsetFetchRequestGroup()
	g.Group = k.cfg.GroupID
	if k.ident != nil && k.versions.offsetFetch >= 9 {
		epoch, id := k.ident.get()
		if epoch >= 0 && id != "" {
			g.MemberID, g.MemberEpoch = &id, epoch
		}
	}
	for _, t := range groupByTopic(tps) {
		rt := kmsg.NewOffsetFetchRequestGroupTopic()
		rt.Topic, rt.Partitions = t.Topic, t.Partitions
		g.Topics = append(g.Topics, rt)
	}
	req.Groups = append(req.Groups, g)
	msg, err := k.do(ctx, req, k.versions.offsetFetch)
	if err != nil {
		return nil, err
	}
	res := msg.(*kmsg.OffsetFetchResponse)
	for _, rg := range res.Groups {
		if rg.Group != k.cfg.GroupID {
			continue
		}
		topics := make([]kmsg.OffsetFetchResponseTopic, 0, len(rg.Topics))
		for _, t := range rg.Topics {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.Offset, rp.Metadata, rp.ErrorCode = p.Partition, p.Offset, p.Metadata, p.ErrorCode
				rt.Partitions = append(rt.Partitions, rp)
			}
			topics = append(topics, rt)
		}
		return k.readOffsets(rg.ErrorCode, topics)
	}
	return nil, fmt.Errorf("OffsetFetch: no answer for group %s", k.cfg.GroupID)
}

// readOffsets reads an OffsetFetch answer: the group's error code, then
// each partition's offset, metadata and error.
func (k *coordinator) readOffsets(code int16, topics []kmsg.OffsetFetchResponseTopic) (map[topicPartition]fetchedOffset, error) {
	out := map[topicPartition]fetchedOffset{}
	if err := wire.Error(code); err != nil {
		if isCoordinatorErr(err) {
			k.forget(k.addrNow())
		}
		if errors.Is(err, kafka.GroupIdNotFound) {
			return out, nil
		}
		return nil, err
	}
	for _, t := range topics {
		for _, p := range t.Partitions {
			fo := fetchedOffset{offset: p.Offset, err: wire.Error(p.ErrorCode)}
			if p.Metadata != nil {
				fo.meta = *p.Metadata
			}
			out[topicPartition{t.Topic, p.Partition}] = fo
		}
	}
	return out, nil
}

// addrNow is the coordinator's address as known now.
func (k *coordinator) addrNow() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.addr
}

// nullable is nil for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// isCoordinatorErr reports an answer that means the coordinator moved.
func isCoordinatorErr(err error) bool {
	return errors.Is(err, kafka.NotCoordinatorForGroup) || errors.Is(err, kafka.GroupCoordinatorNotAvailable)
}
