package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// Log bounds (the first offset and the high watermark of partitions) are
// asked of each partition's leader in two ListOffsets requests per broker,
// on one connection per broker kept by the fetcher for that purpose.
// kafka-go's Client would send one request per partition and offset, each
// on a connection of its own: a thousand partitions meant hundreds of
// sockets at every assignment.

// listOffsets returns the log bounds of tps, in order.
func (f *fetcher) listOffsets(ctx context.Context, tps []topicPartition) ([]logBounds, error) {
	leaders, addrs, err := f.leadersOf(ctx, tps)
	if err != nil {
		return nil, err
	}
	byBroker := map[int32][]int{}
	for i := range tps {
		byBroker[leaders[i]] = append(byBroker[leaders[i]], i)
	}
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	out := make([]logBounds, len(tps))
	for id, idx := range byBroker {
		conn := f.admin[id]
		if conn == nil {
			if conn, err = f.c.dial(ctx, addrs[id]); err != nil {
				f.forgetLeaders(tps, idx)
				return nil, err
			}
			f.admin[id] = conn
		}
		for _, ts := range []int64{kafka.FirstOffset, kafka.LastOffset} {
			if err := listOffsets(ctx, conn, tps, idx, ts, out, f.c.cfg.Timeout); err != nil {
				if _, partial := err.(partitionErr); !partial {
					conn.Close()
					delete(f.admin, id)
				}
				f.forgetLeaders(tps, idx)
				return nil, fmt.Errorf("listing offsets on broker %d: %w", id, err)
			}
		}
	}
	for i, b := range out {
		if b.first < 0 || b.last < b.first {
			return nil, fmt.Errorf("%s/%d: invalid log bounds [%d, %d]", tps[i].topic, tps[i].partition, b.first, b.last)
		}
	}
	return out, nil
}

// partitionErr is an error a broker answered for a partition: the
// connection is fine.
type partitionErr struct{ error }

// listOffsets asks conn for the offsets at ts (kafka.FirstOffset or
// LastOffset) of tps[idx...] and stores them in out.
func listOffsets(ctx context.Context, conn *wire.Conn, tps []topicPartition, idx []int, ts int64, out []logBounds, timeout time.Duration) error {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	byTopic := map[string]int{}
	for _, i := range idx {
		tp := tps[i]
		ti, ok := byTopic[tp.topic]
		if !ok {
			ti = len(req.Topics)
			byTopic[tp.topic] = ti
			t := kmsg.NewListOffsetsRequestTopic()
			t.Topic = tp.topic
			req.Topics = append(req.Topics, t)
		}
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Partition, p.CurrentLeaderEpoch, p.Timestamp = int32(tp.partition), -1, ts
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, p)
	}
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return err
	}
	got := map[topicPartition]kmsg.ListOffsetsResponseTopicPartition{}
	for _, t := range msg.(*kmsg.ListOffsetsResponse).Topics {
		for _, p := range t.Partitions {
			got[topicPartition{t.Topic, int(p.Partition)}] = p
		}
	}
	for _, i := range idx {
		p, ok := got[tps[i]]
		switch {
		case !ok:
			return partitionErr{fmt.Errorf("%s/%d: no offset in the ListOffsets response", tps[i].topic, tps[i].partition)}
		case p.ErrorCode != 0:
			return partitionErr{fmt.Errorf("%s/%d: %w", tps[i].topic, tps[i].partition, kafka.Error(p.ErrorCode))}
		case ts == kafka.FirstOffset:
			out[i].first = p.Offset
		default:
			out[i].last = p.Offset
		}
	}
	return nil
}

// leadersOf returns the leader of each of tps and the brokers' addresses,
// looking the metadata up again when one is not known.
func (f *fetcher) leadersOf(ctx context.Context, tps []topicPartition) ([]int32, map[int32]string, error) {
	for try := 0; ; try++ {
		f.mu.Lock()
		leaders := make([]int32, len(tps))
		addrs := map[int32]string{}
		missing := -1
		for i, tp := range tps {
			id, ok := f.leaders[tp]
			b := f.brokers[id]
			if !ok || b == nil {
				missing = i
				break
			}
			leaders[i], addrs[id] = id, b.addr
		}
		f.mu.Unlock()
		if missing < 0 {
			return leaders, addrs, nil
		}
		if try > 0 {
			return nil, nil, fmt.Errorf("%s/%d: no leader in the metadata", tps[missing].topic, tps[missing].partition)
		}
		if err := f.refreshLeaders(ctx); err != nil {
			return nil, nil, fmt.Errorf("metadata: %w", err)
		}
	}
}

// forgetLeaders drops what is known of the leaders of tps[idx...], so that
// the next lookup asks the metadata again.
func (f *fetcher) forgetLeaders(tps []topicPartition, idx []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, i := range idx {
		delete(f.leaders, tps[i])
	}
}
