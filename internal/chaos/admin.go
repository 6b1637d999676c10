package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
)

// admin talks to the broker directly (never through a fault proxy): topic
// setup, log bounds, committed offsets and the final reads of the log and
// of the changelog.
type admin struct {
	addr string
	tr   *kafka.Transport
	cl   *kafka.Client
}

func newAdmin(addr string) *admin {
	tr := &kafka.Transport{ClientID: "tidemark-chaos-admin", DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	return &admin{addr: addr, tr: tr, cl: &kafka.Client{Addr: kafka.TCP(addr), Transport: tr, Timeout: 10 * time.Second}}
}

func (a *admin) close() { a.tr.CloseIdleConnections() }

// createTopic creates topic and waits until every partition has a leader.
func (a *admin) createTopic(ctx context.Context, topic string, partitions int) error {
	res, err := a.cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("chaos: creating topic %s: %w", topic, err)
	}
	for {
		md, err := a.cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				if p.Error != nil || p.Leader.Port == 0 {
					ready = false
				}
			}
			if ready {
				return nil
			}
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return fmt.Errorf("chaos: topic %s has no leaders: %w", topic, ctx.Err())
		}
	}
}

// bounds returns the log start and end (high watermark) of every partition.
func (a *admin) bounds(ctx context.Context, topic string, partitions int) (first, end []int64, err error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := 0; p < partitions; p++ {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	res, err := a.cl.ListOffsets(ctx, req)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos: listing offsets of %s: %w", topic, err)
	}
	first, end = make([]int64, partitions), make([]int64, partitions)
	seen := make([]bool, partitions)
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("chaos: listing offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		if po.Partition < 0 || po.Partition >= partitions {
			continue
		}
		first[po.Partition], end[po.Partition], seen[po.Partition] = po.FirstOffset, po.LastOffset, true
	}
	for p, ok := range seen {
		if !ok {
			return nil, nil, fmt.Errorf("chaos: listing offsets of %s/%d: no answer for the partition", topic, p)
		}
	}
	return first, end, nil
}

// committed returns the group's committed offset of every partition, -1
// where none. An unknown group (kfake answers GROUP_ID_NOT_FOUND, Kafka -1)
// is "none everywhere". A partition whose answer carries an error is
// reported as an error: the caller skips the sample.
func (a *admin) committed(ctx context.Context, group, topic string, partitions int) ([]int64, error) {
	ids := make([]int, partitions)
	out := make([]int64, partitions)
	for i := range ids {
		ids[i], out[i] = i, -1
	}
	res, err := a.cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, fmt.Errorf("chaos: fetching committed offsets of group %s on %s: %w", group, topic, err)
	}
	if res.Error != nil {
		if errors.Is(res.Error, kafka.GroupIdNotFound) {
			return out, nil
		}
		return nil, fmt.Errorf("chaos: fetching committed offsets of group %s on %s: %w", group, topic, res.Error)
	}
	got := 0
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("chaos: fetching the committed offset of group %s on %s/%d: %w", group, topic, p.Partition, p.Error)
		}
		if p.Partition >= 0 && p.Partition < partitions {
			out[p.Partition] = p.CommittedOffset
			got++
		}
	}
	if got != partitions {
		return nil, fmt.Errorf("chaos: fetching committed offsets of group %s on %s: %d of %d partitions answered", group, topic, got, partitions)
	}
	return out, nil
}

// readLog returns the values of partition p at offsets [0, end), ""
// where an offset holds no record: a transaction marker (kafka-go leaves
// control batches out), or none should on a topic without transactions
// or compaction.
func (a *admin) readLog(ctx context.Context, topic string, p int, end int64) ([]string, error) {
	values := make([]string, end)
	next := int64(0)
	for next < end {
		res, err := a.cl.Fetch(ctx, &kafka.FetchRequest{
			Topic: topic, Partition: p, Offset: next, MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond,
		})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			return nil, fmt.Errorf("chaos: reading %s/%d at offset %d: %w", topic, p, next, err)
		}
		advanced := false
		for {
			r, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("chaos: reading %s/%d at offset %d: %w", topic, p, next, err)
			}
			if r.Offset < next || r.Offset >= end {
				continue
			}
			v, err := io.ReadAll(r.Value)
			if err != nil {
				return nil, fmt.Errorf("chaos: reading %s/%d at offset %d: %w", topic, p, r.Offset, err)
			}
			values[r.Offset] = string(v)
			next = r.Offset + 1
			advanced = true
		}
		if !advanced {
			if res.HighWatermark >= end && res.HighWatermark > next {
				// Offsets without records (none expected): step over.
				next++
				continue
			}
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return nil, fmt.Errorf("chaos: reading %s/%d at offset %d: %w", topic, p, next, ctx.Err())
			}
		}
	}
	return values, nil
}

// readCommitted returns which transactional values of partition p at
// offsets [0, end) the broker commits: a read_committed fetch of the
// whole range, decoded by franz-go (not by tidemark), delivers the
// committed ones. The producer's outcome is what it was told; this is
// what the log says, and so what any read_committed consumer must handle.
func (a *admin) readCommitted(ctx context.Context, topic string, p int, end int64) (map[string]bool, error) {
	kc, err := kgo.NewClient(kgo.SeedBrokers(a.addr), kgo.ClientID("tidemark-chaos-admin"))
	if err != nil {
		return nil, fmt.Errorf("chaos: reading %s/%d at read_committed: %w", topic, p, err)
	}
	defer kc.Close()
	topicID, err := topicIDOf(ctx, kc, topic)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading %s/%d at read_committed: %w", topic, p, err)
	}
	delivered := map[string]bool{}
	next, failures := int64(0), 0
	for next < end {
		fp, after, err := fetchAt(ctx, kc, topic, topicID, p, next, true)
		if err == nil && after <= next && fp.LastStableOffset >= end {
			err = fmt.Errorf("the broker answered nothing (last stable offset %d, end %d)", fp.LastStableOffset, end)
		}
		if err != nil {
			// The broker may have restarted just before: retry a while.
			if failures++; failures > maxFetchFailures || !sleepCtx(ctx, 100*time.Millisecond) {
				return nil, fmt.Errorf("chaos: reading %s/%d at read_committed from offset %d (%d tries): %w", topic, p, next, failures, err)
			}
			continue
		}
		failures = 0
		for _, r := range fp.Records {
			if r.Offset < end {
				delivered[string(r.Value)] = true
			}
		}
		if after <= next {
			// A transaction still open (none should be once the
			// producers stopped): wait for the broker to end it.
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return nil, fmt.Errorf("chaos: reading %s/%d at read_committed: offset %d is held by an open transaction (last stable offset %d): %w", topic, p, next, fp.LastStableOffset, ctx.Err())
			}
			continue
		}
		next = after
	}
	return delivered, nil
}

// changelogMarkers returns the owners' markers of every partition of the
// changelog topic (Config.State), read from each partition's start to its
// end and decoded by franz-go, not by tidemark: the records with a
// framework.HeaderChangelogMarker header, whose value is the source offset
// the owner resumed from.
func (a *admin) changelogMarkers(ctx context.Context, topic string, partitions int) ([]ChangelogMarker, error) {
	first, end, err := a.bounds(ctx, topic, partitions)
	if err != nil {
		return nil, err
	}
	kc, err := kgo.NewClient(kgo.SeedBrokers(a.addr), kgo.ClientID("tidemark-chaos-admin"))
	if err != nil {
		return nil, fmt.Errorf("chaos: reading changelog %s: %w", topic, err)
	}
	defer kc.Close()
	topicID, err := topicIDOf(ctx, kc, topic)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading changelog %s: %w", topic, err)
	}
	var out []ChangelogMarker
	for p := 0; p < partitions; p++ {
		next, failures := first[p], 0
		for next < end[p] {
			fp, after, err := fetchAt(ctx, kc, topic, topicID, p, next, false)
			if err == nil && after <= next {
				err = fmt.Errorf("the broker answered nothing (high watermark %d, end %d)", fp.HighWatermark, end[p])
			}
			if err != nil {
				if failures++; failures > maxFetchFailures || !sleepCtx(ctx, 100*time.Millisecond) {
					return nil, fmt.Errorf("chaos: reading changelog %s/%d from offset %d (%d tries): %w", topic, p, next, failures, err)
				}
				continue
			}
			failures = 0
			for _, r := range fp.Records {
				if r.Offset >= end[p] {
					continue
				}
				for _, h := range r.Headers {
					if h.Key != framework.HeaderChangelogMarker {
						continue
					}
					start, err := strconv.ParseInt(string(h.Value), 10, 64)
					if err != nil {
						return nil, fmt.Errorf("chaos: changelog %s/%d: the marker at offset %d: %w", topic, p, r.Offset, err)
					}
					out = append(out, ChangelogMarker{Partition: p, Offset: r.Offset, T: r.Timestamp.UnixNano(), Start: start, Producer: r.ProducerID})
				}
			}
			next = after
		}
	}
	return out, nil
}

// maxFetchFailures bounds the failed fetches in a row of a final read.
const maxFetchFailures = 50

// topicIDOf returns topic's id, which fetches name it by.
func topicIDOf(ctx context.Context, kc *kgo.Client, topic string) ([16]byte, error) {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mres, err := meta.RequestWith(ctx, kc)
	if err == nil && (len(mres.Topics) != 1 || mres.Topics[0].ErrorCode != 0) {
		err = fmt.Errorf("no metadata for the topic")
	}
	if err != nil {
		return [16]byte{}, err
	}
	return mres.Topics[0].TopicID, nil
}

// fetchAt fetches partition p of topic from offset, at read_committed if
// committed, and returns what franz-go decoded and the offset to fetch
// next. The run has one broker, so every request goes to the partition's
// leader.
func fetchAt(ctx context.Context, kc *kgo.Client, topic string, topicID [16]byte, p int, offset int64, committed bool) (kgo.FetchPartition, int64, error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = -1, 100, 1, 4<<20
	isolation := kgo.ReadUncommitted()
	if committed {
		req.IsolationLevel, isolation = 1, kgo.ReadCommitted()
	}
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, topicID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = int32(p), offset, 4<<20
	rp.CurrentLeaderEpoch, rp.LastFetchedEpoch, rp.LogStartOffset = -1, -1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(ctx, kc)
	if err == nil {
		err = kerr.ErrorForCode(res.ErrorCode)
	}
	if err == nil && (len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1) {
		err = fmt.Errorf("the answer holds no partition")
	}
	if err != nil {
		return kgo.FetchPartition{}, offset, err
	}
	fp, after := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
		Offset: offset, IsolationLevel: isolation, Topic: topic, Partition: int32(p),
	}, &res.Topics[0].Partitions[0], kgo.DefaultDecompressor(), nil)
	return fp, after, fp.Err
}
