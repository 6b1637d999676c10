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

	mu   sync.Mutex
	addr string // "" until found, or after it moved
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
			k.addr = addr
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

// forget drops addr after an answer that says the coordinator moved, or
// no answer: the next request finds it again.
func (k *coordinator) forget(addr string) {
	k.mu.Lock()
	if k.addr == addr {
		k.addr = ""
	}
	k.mu.Unlock()
}

// do sends req to the coordinator through the cluster's client.
func (k *coordinator) do(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	addr, err := k.address(ctx)
	if err != nil {
		return nil, err
	}
	res, err := k.cl.client.At(ctx, addr, req, k.cfg.Timeout)
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
	msg, err := k.do(ctx, req)
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
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = k.cfg.GroupID
	for _, t := range groupByTopic(tps) {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = t.Topic, t.Partitions
		req.Topics = append(req.Topics, rt)
	}
	msg, err := k.do(ctx, req)
	if err != nil {
		return nil, err
	}
	res := msg.(*kmsg.OffsetFetchResponse)
	out := map[topicPartition]fetchedOffset{}
	if err := wire.Error(res.ErrorCode); err != nil {
		if isCoordinatorErr(err) {
			k.forget(k.addrNow())
		}
		if errors.Is(err, kafka.GroupIdNotFound) {
			return out, nil
		}
		return nil, err
	}
	for _, t := range res.Topics {
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
