package framework

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// deadLetters writes the messages the DeadLetter policy gives up on to their
// dead-letter topics, and knows whether each topic takes them: Run checks
// every topic before it joins the group, and each write confirms or refutes
// it. A missing topic ends Run at once with an error naming it, rather than
// at the first failed message, when its partition would hold in
// StateDeadLettering with both probes green. Any partition's goroutine
// writes through it; mu guards its state, read by Stats.
type deadLetters struct {
	c *Consumer

	mu         sync.Mutex
	partitions map[string]int // partition counts, from Metadata
	// unchecked are the topics Run could not check yet (Kafka
	// unreachable); trouble says, per topic, what fails and since when.
	unchecked map[string]bool
	trouble   map[string]deadLetterTrouble
}

type deadLetterTrouble struct {
	err   string
	since time.Time
}

func newDeadLetters(c *Consumer) *deadLetters {
	d := &deadLetters{c: c, partitions: map[string]int{}, unchecked: map[string]bool{}, trouble: map[string]deadLetterTrouble{}}
	for _, t := range c.cfg.deadLetterTopics() {
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
		_, err := d.partitionCount(ctx, t)
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
// acknowledges the write or the generation ends (ok false). The
// dead-letter partition is the source partition modulo the dead-letter
// topic's partition count, so each source partition's failures stay in
// order.
func (d *deadLetters) write(ctx context.Context, p *partition, log *zap.Logger, m *kafka.Message, attempts int, cause error) (string, bool) {
	cfg := &d.c.cfg
	topic := p.policy.DeadLetterTopic
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
		where, err := d.produce(ctx, topic, m.Partition, kafka.Record{Time: now, Key: kafka.NewBytes(m.Key), Value: kafka.NewBytes(m.Value), Headers: headers})
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
			log.Warn("dead-letter write failed; the partition waits and retries (nothing is skipped)",
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
func (d *deadLetters) produce(ctx context.Context, topic string, source int, rec kafka.Record) (string, error) {
	n, err := d.partitionCount(ctx, topic)
	if err != nil {
		return "", err
	}
	part := source % n
	rctx, cancel := context.WithTimeout(ctx, d.c.cfg.Timeout)
	defer cancel()
	res, err := d.c.client.Produce(rctx, &kafka.ProduceRequest{
		Topic:        topic,
		Partition:    part,
		RequiredAcks: kafka.RequireAll,
		Records:      kafka.NewRecordReader(rec),
	})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err == nil {
		for _, e := range res.RecordErrors {
			err = e
		}
	}
	if err != nil {
		d.mu.Lock()
		delete(d.partitions, topic) // it may have changed: ask again
		d.mu.Unlock()
		return "", err
	}
	return fmt.Sprintf("%s/%d@%d", topic, part, res.BaseOffset), nil
}

// partitionCount returns topic's number of partitions, from a cache filled
// by a Metadata request.
func (d *deadLetters) partitionCount(ctx context.Context, topic string) (int, error) {
	d.mu.Lock()
	n, ok := d.partitions[topic]
	d.mu.Unlock()
	if ok {
		return n, nil
	}
	mctx, cancel := context.WithTimeout(ctx, d.c.cfg.Timeout)
	defer cancel()
	res, err := d.c.client.Metadata(mctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata of %q from %v: %w", topic, d.c.cfg.Brokers, err)
	}
	for _, t := range res.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return 0, fmt.Errorf("metadata of %q: %w", topic, t.Error)
		}
		if len(t.Partitions) == 0 {
			return 0, fmt.Errorf("metadata of %q: no partitions", topic)
		}
		d.mu.Lock()
		d.partitions[topic] = len(t.Partitions)
		d.mu.Unlock()
		return len(t.Partitions), nil
	}
	return 0, fmt.Errorf("metadata of %q: %w", topic, errors.New("topic not in the response"))
}
