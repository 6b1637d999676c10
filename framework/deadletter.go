package framework

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/wire"
)

// deadLetters writes the messages the DeadLetter policy gives up on to their
// dead-letter topics, and knows whether each topic takes them: Run checks
// every topic before it joins the group, and each write confirms or refutes
// it. A missing topic ends Run at once with an error naming it, rather than
// at the first failed message, when its partition would hold in
// StateDeadLettering with both probes green. Any partition's goroutine
// writes through it; mu guards its state, read by Stats.
type deadLetters struct {
	cfg *Config
	cl  *cluster

	mu     sync.Mutex
	topics map[string]*deadLetterTopic // from Metadata; dropped after a failed write
	// unchecked are the topics Run could not check yet (Kafka
	// unreachable); trouble says, per topic, what fails and since when.
	unchecked map[string]bool
	trouble   map[string]deadLetterTrouble
}

// deadLetterTopic is what Metadata said of a dead-letter topic: its
// partitions' leaders' addresses, "" for one without a leader now.
type deadLetterTopic struct {
	leaders []string
}

type deadLetterTrouble struct {
	err   string
	since time.Time
}

func newDeadLetters(cfg *Config, cl *cluster) *deadLetters {
	d := &deadLetters{cfg: cfg, cl: cl, topics: map[string]*deadLetterTopic{}, unchecked: map[string]bool{}, trouble: map[string]deadLetterTrouble{}}
	for _, t := range cfg.deadLetterTopics() {
		d.unchecked[t] = true
	}
	return d
}

// errNoDeadLetterTopic marks a dead-letter topic that Kafka does not know.
var errNoDeadLetterTopic = errors.New("no such topic")

// check asks Kafka for every dead-letter topic not checked yet. It returns
// an error only when a topic does not exist; a topic that cannot be
// checked now (Kafka unreachable) stays unchecked, shown by Stats and
// Ready, and is checked again at the next call.
func (d *deadLetters) check(ctx context.Context) error {
	d.mu.Lock()
	var topics []string
	for t := range d.unchecked {
		topics = append(topics, t)
	}
	d.mu.Unlock()
	for _, t := range topics {
		_, err := d.lookup(ctx, t)
		switch {
		case err == nil:
			d.mu.Lock()
			delete(d.unchecked, t)
			d.mu.Unlock()
			d.ok(t)
		case errors.Is(err, kafka.UnknownTopicOrPartition):
			d.failed(t, err)
			return fmt.Errorf("tidemark: dead-letter topic %q of the failure policy does not exist: create it before Run, or choose another FailurePolicy.Action (%w: %v)",
				t, errNoDeadLetterTopic, err)
		default:
			if ctx.Err() != nil {
				return nil
			}
			d.failed(t, fmt.Errorf("not checked yet: %w", err))
		}
	}
	return nil
}

// failed notes that topic takes no messages now, and why.
func (d *deadLetters) failed(topic string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tr, ok := d.trouble[topic]
	if !ok {
		tr.since = time.Now()
	}
	tr.err = fmt.Sprintf("dead-letter topic %q: %v", topic, err)
	d.trouble[topic] = tr
}

// ok notes that topic takes messages.
func (d *deadLetters) ok(topic string) {
	d.mu.Lock()
	delete(d.trouble, topic)
	d.mu.Unlock()
}

// status returns the oldest trouble: what fails and since when; "" if none.
func (d *deadLetters) status() (string, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var first deadLetterTrouble
	for _, tr := range d.trouble {
		if first.err == "" || tr.since.Before(first.since) {
			first = tr
		}
	}
	return first.err, first.since
}

// write writes m to its topic's dead-letter topic and returns where
// ("topic/partition@offset"), retrying with backoff until the broker
// acknowledges the write or the partition stops (ok false). The
// dead-letter partition is the source partition modulo the dead-letter
// topic's partition count, so each source partition's failures stay in
// order.
func (d *deadLetters) write(ctx context.Context, iv *invoker, m *kafka.Message, attempts int, cause error) (string, bool) {
	cfg := d.cfg
	p := iv.p
	topic := iv.policy.DeadLetterTopic
	now := time.Now().UTC()
	headers := make([]kafka.Header, 0, len(m.Headers)+8)
	headers = append(headers, m.Headers...)
	headers = append(headers,
		kafka.Header{Key: HeaderError, Value: []byte(cause.Error())},
		kafka.Header{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
		kafka.Header{Key: HeaderTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(m.Partition), 10)},
		kafka.Header{Key: HeaderOffset, Value: strconv.AppendInt(nil, m.Offset, 10)},
		kafka.Header{Key: HeaderTimestamp, Value: []byte(m.Time.UTC().Format(time.RFC3339Nano))},
		kafka.Header{Key: HeaderTime, Value: []byte(now.Format(time.RFC3339Nano))},
		kafka.Header{Key: HeaderGroup, Value: []byte(cfg.GroupID)},
	)
	bo := newBackoff(cfg.RetryBackoff, cfg.MaxRetryBackoff)
	for n := 1; ; n++ {
		where, err := d.produce(ctx, topic, m.Partition, m, now, headers)
		if err == nil {
			d.ok(topic)
			return where, true
		}
		if ctx.Err() != nil {
			return "", false
		}
		d.failed(topic, fmt.Errorf("writes fail (%s/%d at offset %d waits): %w", m.Topic, m.Partition, m.Offset, err))
		p.st.setDeadLettering(fmt.Errorf("dead-letter write of offset %d to %q: %w", m.Offset, topic, err))
		backoff := bo.next()
		if logWorthy(n) {
			p.logger().Warn("dead-letter write failed; the partition waits and retries (nothing is skipped)",
				zap.Int64("offset", m.Offset), zap.String("dead_letter_topic", topic), zap.Int("tries", n),
				zap.Duration("backoff", backoff), zap.Error(err))
		}
		if !sleep(ctx, backoff) {
			return "", false
		}
	}
}

// produce writes one record to topic, on partition source modulo the
// topic's partition count, and waits for all in-sync replicas.
func (d *deadLetters) produce(ctx context.Context, topic string, source int, m *kafka.Message, ts time.Time, headers []kafka.Header) (string, error) {
	t, err := d.lookup(ctx, topic)
	if err != nil {
		return "", err
	}
	part := source % len(t.leaders)
	addr := t.leaders[part]
	if addr == "" {
		d.forget(topic)
		return "", fmt.Errorf("%s/%d: %w", topic, part, kafka.LeaderNotAvailable)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, int32(d.cfg.Timeout/time.Millisecond)
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = int32(part), wire.OneRecordBatch(ts, m.Key, m.Value, headers)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	rctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	msg, err := d.cl.client.At(rctx, addr, req, d.cfg.Timeout)
	if err == nil {
		err = fmt.Errorf("%s/%d: no answer for the partition", topic, part)
		for _, t := range msg.(*kmsg.ProduceResponse).Topics {
			for _, p := range t.Partitions {
				if p.Partition != int32(part) {
					continue
				}
				if err = wire.Error(p.ErrorCode); err == nil {
					return fmt.Sprintf("%s/%d@%d", topic, part, p.BaseOffset), nil
				}
			}
		}
	}
	d.forget(topic) // it may have moved: ask again
	return "", err
}

func (d *deadLetters) forget(topic string) {
	d.mu.Lock()
	delete(d.topics, topic)
	d.mu.Unlock()
}

// lookup returns what Metadata says of topic, from a cache.
func (d *deadLetters) lookup(ctx context.Context, topic string) (*deadLetterTopic, error) {
	d.mu.Lock()
	t, ok := d.topics[topic]
	d.mu.Unlock()
	if ok {
		return t, nil
	}
	md, err := d.cl.metadata(ctx, []string{topic})
	if err != nil {
		return nil, fmt.Errorf("metadata of %q: %w", topic, err)
	}
	brokers := map[int32]string{}
	for _, b := range md.Brokers {
		brokers[b.NodeID] = wire.Addr(b)
	}
	for _, mt := range md.Topics {
		if mt.Topic == nil || *mt.Topic != topic {
			continue
		}
		if err := wire.Error(mt.ErrorCode); err != nil {
			return nil, fmt.Errorf("metadata of %q: %w", topic, err)
		}
		if len(mt.Partitions) == 0 {
			return nil, fmt.Errorf("metadata of %q: no partitions", topic)
		}
		t := &deadLetterTopic{leaders: make([]string, len(mt.Partitions))}
		for _, p := range mt.Partitions {
			if p.Partition < 0 || int(p.Partition) >= len(t.leaders) {
				return nil, fmt.Errorf("metadata of %q: partition %d of %d", topic, p.Partition, len(mt.Partitions))
			}
			t.leaders[p.Partition] = brokers[p.Leader]
		}
		d.mu.Lock()
		d.topics[topic] = t
		d.mu.Unlock()
		return t, nil
	}
	return nil, fmt.Errorf("metadata of %q: %w", topic, errors.New("topic not in the response"))
}
