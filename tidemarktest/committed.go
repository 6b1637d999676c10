package tidemarktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
)

// Committed returns group's committed offsets of topic as Kafka holds
// them: for every partition of the topic, the offset the group will
// resume from, -1 where it committed none. It is what a service's test
// checks after a stop, since tidemark's own offset file is not what the
// next owner of a partition reads. A failure to ask fails the test.
func (b *Broker) Committed(t testing.TB, group, topic string) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()
	out, err := b.committed(ctx, t, group, topic)
	if err != nil {
		t.Fatalf("tidemarktest: %v", err)
	}
	return out
}

// CommittedAtEnd holds once Kafka holds, for the running Consumer's group
// (Config.GroupID), a committed offset at the log end of every partition
// of topics: everything produced so far was handled and committed where a
// restart, or another member, would resume. The log end is asked anew at
// each look, so messages produced meanwhile are waited for too. A
// partition that never held a message needs no commit.
//
// It asks the broker at most every 50 ms. An error in asking does not
// fail the test: it is logged, and the condition does not hold until an
// answer says it does (Run's timeout then reports the partitions).
func (b *Broker) CommittedAtEnd(t testing.TB, topics ...string) Condition {
	const every = 50 * time.Millisecond
	var (
		last    time.Time
		lastErr string
	)
	return func(c *framework.Consumer) bool {
		if time.Since(last) < every {
			return false
		}
		last = time.Now()
		ok, err := b.committedAtEnd(t, c.Stats().Group, topics)
		if err != nil {
			if err.Error() != lastErr {
				t.Logf("tidemarktest: CommittedAtEnd: %v", err)
			}
			lastErr = err.Error()
			return false
		}
		return ok
	}
}

// committedAtEnd reports whether group's commits of every partition of
// topics are at their log ends.
func (b *Broker) committedAtEnd(t testing.TB, group string, topics []string) (bool, error) {
	if len(topics) == 0 {
		return false, errors.New("no topic to check")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, topic := range topics {
		committed, err := b.committed(ctx, t, group, topic)
		if err != nil {
			return false, err
		}
		ends, err := b.logEnds(ctx, t, topic, len(committed))
		if err != nil {
			return false, err
		}
		for p, end := range ends {
			if committed[p] != end && (committed[p] != -1 || end != 0) {
				return false, nil
			}
		}
	}
	return true, nil
}

// partitions returns the number of partitions of topic.
func (b *Broker) partitions(ctx context.Context, t testing.TB, topic string) (int, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(ctx, b.kgo(t))
	if err == nil && len(res.Topics) != 1 {
		err = fmt.Errorf("%d topics in the metadata", len(res.Topics))
	}
	if err == nil {
		err = kerr.ErrorForCode(res.Topics[0].ErrorCode)
	}
	if err != nil {
		return 0, fmt.Errorf("the partitions of topic %s: %w", topic, err)
	}
	return len(res.Topics[0].Partitions), nil
}

// committed asks the group's coordinator (kgo finds it, and retries while
// it loads) for the offsets of every partition of topic.
func (b *Broker) committed(ctx context.Context, t testing.TB, group, topic string) (map[int]int64, error) {
	n, err := b.partitions(ctx, t, topic)
	if err != nil {
		return nil, fmt.Errorf("group %s's committed offsets: %w", group, err)
	}
	out := make(map[int]int64, n)
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	for p := range n {
		out[p] = -1
		rt.Partitions = append(rt.Partitions, int32(p))
	}
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(ctx, b.kgo(t))
	if err == nil {
		err = kerr.ErrorForCode(res.ErrorCode)
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return out, nil // a group that never committed
	}
	if err != nil {
		return nil, fmt.Errorf("group %s's committed offsets of %s: %w", group, topic, err)
	}
	for _, rt := range res.Topics {
		if rt.Topic != topic {
			continue
		}
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("group %s's committed offset of %s/%d: %w", group, topic, rp.Partition, err)
			}
			if _, ok := out[int(rp.Partition)]; ok && rp.Offset >= 0 {
				out[int(rp.Partition)] = rp.Offset
			}
		}
	}
	return out, nil
}

// logEnds returns the log end (high watermark) of partitions 0..n-1 of
// topic, asked of each partition's leader.
func (b *Broker) logEnds(ctx context.Context, t testing.TB, topic string, n int) (map[int]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range n {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = int32(p), -1, -1 // -1: the latest offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(ctx, b.kgo(t))
	if err != nil {
		return nil, fmt.Errorf("the log ends of %s: %w", topic, err)
	}
	out := make(map[int]int64, n)
	for _, rt := range res.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("the log end of %s/%d: %w", topic, rp.Partition, err)
			}
			out[int(rp.Partition)] = rp.Offset
		}
	}
	if len(out) != n {
		return nil, fmt.Errorf("the log ends of %s: %d of %d partitions answered", topic, len(out), n)
	}
	return out, nil
}
