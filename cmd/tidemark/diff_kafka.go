package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// What diff asks of Kafka, through the engine's protocol package: Metadata
// (partitions and leaders), ListOffsets at each leader (log start, log
// end, last stable offset), FindCoordinator and OffsetFetch (the group's
// committed offsets).

// tp is a topic partition.
type tp struct {
	topic string
	part  int32
}

// gtp is a group's topic partition.
type gtp struct {
	group string
	tp
}

// bounds are a partition's log start, log end (high watermark) and last
// stable offset (the log end at read_committed).
type bounds struct{ first, last, stable int64 }

// kafkaView is what diff learned from the brokers.
type kafkaView struct {
	bounds    map[tp]bounds
	missing   map[tp]string // why a partition has no bounds
	committed map[gtp]int64 // the groups' committed offsets, where they have one
}

// asker sends diff's requests, each within timeout.
type asker struct {
	cl      *wire.Client
	timeout time.Duration
}

// any sends req to any seed broker; ctx bounds the retries of an answer
// with a retriable error code, which code returns.
func (a *asker) any(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	return a.cl.Any(ctx, req, a.timeout)
}

// view asks the brokers about the partitions of topics and the groups'
// committed offsets of groups (group -> topic -> partitions).
func (a *asker) view(ctx context.Context, topics map[string][]int32, groups map[string]map[string][]int32) (*kafkaView, error) {
	v := &kafkaView{bounds: map[tp]bounds{}, missing: map[tp]string{}, committed: map[gtp]int64{}}
	if len(topics) == 0 {
		return v, nil
	}
	md, err := a.metadata(ctx, topics)
	if err != nil {
		return nil, err
	}
	brokers := map[int32]string{}
	for _, b := range md.Brokers {
		brokers[b.NodeID] = wire.Addr(b)
	}
	byLeader := map[string][]tp{}
	for topic, parts := range topics {
		i := slices.IndexFunc(md.Topics, func(t kmsg.MetadataResponseTopic) bool { return t.Topic != nil && *t.Topic == topic })
		if i < 0 {
			for _, p := range parts {
				v.missing[tp{topic, p}] = "topic does not exist"
			}
			continue
		}
		t := md.Topics[i]
		if err := wire.Error(t.ErrorCode); err != nil {
			for _, p := range parts {
				v.missing[tp{topic, p}] = err.Error()
			}
			continue
		}
		for _, p := range parts {
			j := slices.IndexFunc(t.Partitions, func(mp kmsg.MetadataResponseTopicPartition) bool { return mp.Partition == p })
			switch {
			case j < 0:
				v.missing[tp{topic, p}] = fmt.Sprintf("the topic has no partition %d", p)
			case brokers[t.Partitions[j].Leader] == "":
				v.missing[tp{topic, p}] = fmt.Sprintf("partition %d has no leader (%v)", p, wire.Error(t.Partitions[j].ErrorCode))
			default:
				addr := brokers[t.Partitions[j].Leader]
				byLeader[addr] = append(byLeader[addr], tp{topic, p})
			}
		}
	}
	for addr, tps := range byLeader {
		// One question per request: a partition may appear once in each.
		for _, ask := range []struct {
			ts        int64
			committed bool
		}{{kafka.FirstOffset, false}, {kafka.LastOffset, false}, {kafka.LastOffset, true}} {
			got, err := a.listOffsets(ctx, addr, tps, ask.ts, ask.committed)
			if err != nil {
				return nil, err
			}
			for k, o := range got {
				if o.err != nil {
					v.missing[k] = o.err.Error()
					continue
				}
				b := v.bounds[k]
				switch {
				case ask.ts == kafka.FirstOffset:
					b.first = o.offset
				case ask.committed:
					b.stable = o.offset
				default:
					b.last = o.offset
				}
				v.bounds[k] = b
			}
		}
	}
	for k := range v.missing {
		delete(v.bounds, k)
	}
	for g, ts := range groups {
		if err := a.offsets(ctx, g, ts, v.committed); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// metadata asks for topics' metadata, creating none.
func (a *asker) metadata(ctx context.Context, topics map[string][]int32) (*kmsg.MetadataResponse, error) {
	req := kmsg.NewPtrMetadataRequest()
	for t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	req.AllowAutoTopicCreation = false
	msg, err := a.any(ctx, req)
	if err != nil {
		return nil, err
	}
	return msg.(*kmsg.MetadataResponse), nil
}

// offsetAnswer is one partition's answer.
type offsetAnswer struct {
	offset int64
	err    error
}

// listOffsets asks the leader at addr for the offset at ts (FirstOffset or
// LastOffset) of tps, at read_committed when committed.
func (a *asker) listOffsets(ctx context.Context, addr string, tps []tp, ts int64, committed bool) (map[tp]offsetAnswer, error) {
	req := wire.NewListOffsets(ts, committed, func(yield func(string, int32) bool) {
		for _, k := range tps {
			if !yield(k.topic, k.part) {
				return
			}
		}
	})
	msg, err := a.cl.At(ctx, addr, req, a.timeout)
	if err != nil {
		return nil, err
	}
	out := map[tp]offsetAnswer{}
	for _, t := range msg.(*kmsg.ListOffsetsResponse).Topics {
		for _, p := range t.Partitions {
			out[tp{t.Topic, p.Partition}] = offsetAnswer{offset: p.Offset, err: wire.Error(p.ErrorCode)}
		}
	}
	for _, k := range tps {
		if _, ok := out[k]; !ok {
			out[k] = offsetAnswer{err: fmt.Errorf("no offset in the ListOffsets answer of broker %s", addr)}
		}
	}
	return out, nil
}

// offsets puts the committed offsets of group g for ts into out: only
// those the group has (a group Kafka does not know has none). It finds
// the group's coordinator first, and retries while the coordinator is
// loading or moving, until ctx ends.
func (a *asker) offsets(ctx context.Context, g string, ts map[string][]int32, out map[gtp]int64) error {
	for {
		err := a.tryOffsets(ctx, g, ts, out)
		var ke kafka.Error
		if err == nil || !errors.As(err, &ke) || !ke.Temporary() {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (and then %v)", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *asker) tryOffsets(ctx context.Context, g string, ts map[string][]int32, out map[gtp]int64) error {
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKey, fc.CoordinatorType = g, 0
	msg, err := a.any(ctx, fc)
	if err != nil {
		return err
	}
	co := msg.(*kmsg.FindCoordinatorResponse)
	if err := wire.Error(co.ErrorCode); err != nil {
		return fmt.Errorf("the coordinator of group %s: %w", g, err)
	}
	addr := net.JoinHostPort(co.Host, strconv.Itoa(int(co.Port)))
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = g
	for t, ps := range ts {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = t, ps
		req.Topics = append(req.Topics, rt)
	}
	msg, err = a.cl.At(ctx, addr, req, a.timeout)
	if err != nil {
		return err
	}
	res := msg.(*kmsg.OffsetFetchResponse)
	if err := wire.Error(res.ErrorCode); err != nil {
		if errors.Is(err, kafka.GroupIdNotFound) {
			return nil
		}
		return fmt.Errorf("committed offsets of group %s: %w", g, err)
	}
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == 0 && p.Offset >= 0 {
				out[gtp{g, tp{t.Topic, p.Partition}}] = p.Offset
			}
		}
	}
	return nil
}
