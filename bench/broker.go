package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// broker is the one broker of a run: the in-process kfake, or a real one.
type broker struct {
	addrs []string
	real  bool
	fake  *kfake.Cluster
	admin *kafka.Client
	tr    *kafka.Transport
	// created lists the topics to delete at the end on a real broker.
	created []string
}

func startBroker(addrs []string) (*broker, error) {
	b := &broker{addrs: addrs, real: len(addrs) > 0}
	if !b.real {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("starting kfake: %w", err)
		}
		b.fake = fake
		b.addrs = fake.ListenAddrs()
	}
	b.tr = &kafka.Transport{ClientID: "tidemark-bench-admin"}
	b.admin = &kafka.Client{Addr: kafka.TCP(b.addrs...), Transport: b.tr, Timeout: 30 * time.Second}
	return b, nil
}

// close deletes the topics this run created on a real broker and stops
// kfake.
func (b *broker) close(ctx context.Context) error {
	var err error
	if b.real && len(b.created) > 0 {
		res, derr := b.admin.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: b.created})
		if derr == nil {
			for t, e := range res.Errors {
				if e != nil {
					derr = errors.Join(derr, fmt.Errorf("%s: %w", t, e))
				}
			}
		}
		if derr != nil {
			err = fmt.Errorf("deleting the benchmark topics: %w", derr)
		}
	}
	b.tr.CloseIdleConnections()
	if b.fake != nil {
		b.fake.Close()
	}
	return err
}

// version names the broker: kfake, or the version the real one's
// ApiVersions answer looks like.
func (b *broker) version(ctx context.Context) string {
	if !b.real {
		return "kfake (in-process, github.com/twmb/franz-go/pkg/kfake)"
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...))
	if err != nil {
		return "unknown: " + err.Error()
	}
	defer cl.Close()
	resp, err := cl.Request(ctx, kmsg.NewPtrApiVersionsRequest())
	if err != nil {
		return "unknown: " + err.Error()
	}
	guess := kversion.FromApiVersionsResponse(resp.(*kmsg.ApiVersionsResponse)).VersionGuess()
	return "Apache Kafka, ApiVersions like " + guess
}

// createTopic creates a topic and waits until every partition has a leader.
func (b *broker) createTopic(ctx context.Context, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	res, err := b.admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	b.created = append(b.created, topic)
	for {
		md, err := b.admin.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
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
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: partitions without a leader: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// leaders counts the brokers that lead a partition of topic, from a
// metadata request: the brokers a consumer of the whole topic fetches from.
func (b *broker) leaders(ctx context.Context, topic string) (int, error) {
	md, err := b.admin.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return 0, fmt.Errorf("metadata of %s: %v", topic, md.Topics)
	}
	ids := map[int]bool{}
	for _, p := range md.Topics[0].Partitions {
		ids[p.Leader.ID] = true
	}
	return len(ids), nil
}

// producer writes the benchmark's messages with franz-go's client:
// uncompressed, in batches of at most batchBytes per partition.
type producer struct {
	cl *kgo.Client
}

func newProducer(addrs []string, batchBytes int, linger time.Duration, codec kgo.CompressionCodec) (*producer, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(addrs...),
		kgo.ClientID("tidemark-bench-producer"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerBatchMaxBytes(int32(batchBytes)),
		kgo.ProducerLinger(linger),
		kgo.MaxBufferedRecords(100000),
	)
	if err != nil {
		return nil, err
	}
	return &producer{cl: cl}, nil
}

func (p *producer) close() { p.cl.Close() }

// preload appends perPartition messages of size bytes to each partition,
// round-robin, and checks the log ends. key, if not nil, gives the key of
// the i-th message of a partition (from 0 in this call).
func (p *producer) preload(ctx context.Context, b *broker, topic string, partitions int, perPartition int64, size int, wantEnd int64, key func(partition int, i int64) []byte) error {
	value := make([]byte, size)
	for i := range value {
		value[i] = '.'
	}
	value[0] = valueThroughput
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}
		wg.Done()
	}
	for i := int64(0); i < perPartition; i++ {
		for part := 0; part < partitions; part++ {
			wg.Add(1)
			r := &kgo.Record{Topic: topic, Partition: int32(part), Value: value}
			if key != nil {
				r.Key = key(part, i)
			}
			p.cl.Produce(ctx, r, done)
		}
	}
	err := p.cl.Flush(ctx)
	wg.Wait()
	if err == nil {
		err = firstErr
	}
	if err != nil {
		return fmt.Errorf("preloading %s: %w", topic, err)
	}
	return b.checkEnds(ctx, topic, partitions, wantEnd)
}

// checkEnds verifies that every partition of topic ends at want. A log
// short of it is asked again for up to 10 s: Kafka writes a transaction's
// markers after EndTxn has answered, so the last one may land a moment
// after the producer is done.
func (b *broker) checkEnds(ctx context.Context, topic string, partitions int, want int64) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		short, err := b.endsShort(ctx, topic, partitions, want)
		if err != nil || short == nil {
			return err
		}
		if time.Now().After(deadline) {
			return short
		}
		select {
		case <-ctx.Done():
			return short
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// endsShort lists the ends of topic's partitions: a partition ending past
// want is an error, one short of it is returned as short.
func (b *broker) endsShort(ctx context.Context, topic string, partitions int, want int64) (short, err error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for i := 0; i < partitions; i++ {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(i))
	}
	res, err := b.admin.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("listing the ends of %s: %w", topic, err)
	}
	if len(res.Topics[topic]) != partitions {
		return nil, fmt.Errorf("%s: %d partitions listed, want %d", topic, len(res.Topics[topic]), partitions)
	}
	for _, po := range res.Topics[topic] {
		switch {
		case po.Error != nil:
			return nil, fmt.Errorf("%s/%d: %w", topic, po.Partition, po.Error)
		case po.LastOffset > want:
			return nil, fmt.Errorf("%s/%d ends at %d, want %d", topic, po.Partition, po.LastOffset, want)
		case po.LastOffset < want && short == nil:
			short = fmt.Errorf("%s/%d ends at %d, want %d (after 10s)", topic, po.Partition, po.LastOffset, want)
		}
	}
	return short, nil
}

// warmup writes one warm-up message to every partition: a latency child
// reports READY once it has seen all of them.
func (p *producer) warmup(ctx context.Context, topic string, partitions, size int) error {
	value := make([]byte, max(size, 9))
	value[0] = valueWarmup
	var rs []*kgo.Record
	for part := 0; part < partitions; part++ {
		rs = append(rs, &kgo.Record{Topic: topic, Partition: int32(part), Value: value})
	}
	return p.cl.ProduceSync(ctx, rs...).FirstErr()
}

// paced writes n messages at rate per second, round-robin over the
// partitions, each carrying its send time. It returns the rate achieved.
func (p *producer) paced(ctx context.Context, topic string, partitions, size int, n int64, rate float64) (float64, error) {
	var (
		failed   atomic.Pointer[error]
		inflight sync.WaitGroup
	)
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
		inflight.Done()
	}
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var sent int64
	for sent < n {
		due := min(n, int64(time.Since(start).Seconds()*rate)+1)
		for ; sent < due; sent++ {
			v := make([]byte, max(size, 9))
			v[0] = valueLatency
			binary.BigEndian.PutUint64(v[1:9], uint64(time.Now().UnixNano()))
			inflight.Add(1)
			p.cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(sent % int64(partitions)), Value: v}, done)
		}
		if sent >= n {
			break
		}
		select {
		case <-ctx.Done():
			inflight.Wait()
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	achieved := float64(n) / time.Since(start).Seconds()
	err := p.cl.Flush(ctx)
	inflight.Wait()
	if e := failed.Load(); e != nil && err == nil {
		err = *e
	}
	return achieved, err
}
