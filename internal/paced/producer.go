// Package paced is a producer for leader-move tests and benchmarks: it
// writes one record per tick to partition 0 of a topic, straight to the
// broker its caller says leads it, so that the records after a move are at
// the new leader at once. A client's own leader discovery would add its
// delay to the consumer's resume.
package paced

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/tidemark/tidemark/internal/wire"
)

// Producer is the writer. Its goroutine, started by Start, owns the
// client; Stop ends it and waits for it.
type Producer struct {
	kc    *kgo.Client
	topic string
	value func(offset int64) []byte

	mu     sync.Mutex // held for each request: Between runs between two
	leader int32
	next   int64 // the offset of the next record

	failed chan error
	cancel context.CancelFunc
	done   chan struct{}
}

// Start writes value(offset) to topic's partition 0 at leader every tick,
// until ctx ends or Stop.
func Start(ctx context.Context, addrs []string, topic string, leader int32, tick time.Duration, value func(offset int64) []byte) (*Producer, error) {
	// Produce v12 and older name the topic; v13 would want its id.
	kc, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.MaxVersions(kversion.V3_9_0()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Producer{kc: kc, topic: topic, value: value, leader: leader, failed: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer kc.Close()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			p.mu.Lock()
			err := p.produce(ctx)
			p.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				p.failed <- err
				return
			}
		}
	}()
	return p, nil
}

// Failed gets the error that ended the producer, if one did.
func (p *Producer) Failed() <-chan error { return p.failed }

// Stop ends the producer and returns the log end.
func (p *Producer) Stop() int64 {
	p.cancel()
	<-p.done
	return p.next
}

// Between runs fn with no request in flight: what it moves, and tells the
// producer through Locked, is in place for the next record.
func (p *Producer) Between(fn func(Locked)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(Locked{p})
}

// Locked is the producer inside Between.
type Locked struct{ p *Producer }

// Next is the offset the next record gets.
func (l Locked) Next() int64 { return l.p.next }

// Lead says the partition's leader is now id.
func (l Locked) Lead(id int32) { l.p.leader = id }

// Produce writes the next record now.
func (l Locked) Produce(ctx context.Context) error { return l.p.produce(ctx) }

// produce writes the next record; p.mu is held.
func (p *Producer) produce(ctx context.Context) error {
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = p.topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = wire.OneRecordBatch(time.Now(), nil, p.value(p.next), nil)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := p.kc.Broker(int(p.leader)).Request(rctx, req)
	if err != nil {
		return fmt.Errorf("producing %s/0 offset %d to broker %d: %w", p.topic, p.next, p.leader, err)
	}
	pr := res.(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(pr.ErrorCode); err != nil {
		return fmt.Errorf("producing %s/0 offset %d to broker %d: %w", p.topic, p.next, p.leader, err)
	}
	if pr.BaseOffset != p.next {
		return fmt.Errorf("producing %s/0: the record went to offset %d, want %d", p.topic, pr.BaseOffset, p.next)
	}
	p.next++
	return nil
}
