package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// HeaderReplayedFrom names the dead letter a replayed message was made
// from, "TOPIC/PARTITION/OFFSET", and HeaderOriginal the message that
// failed first: what a handler whose effect is not idempotent keys on to
// book a message replayed twice only once.
const (
	HeaderReplayedFrom = "replayed-from"
	HeaderOriginal     = "replay-original"
)

// Replayer is the replay's Handler, run by a tidemark Consumer of the
// dead-letter topic: it writes each dead letter back to the topic it came
// from (its framework.HeaderTopic), with its key, its value and its
// original headers, the failure's tidemark-* headers replaced by
// HeaderReplayedFrom and HeaderOriginal. It returns only once the broker
// acknowledged the write, so the dead letter is marked done only then;
// a failed write is retried (the replay's policy is the default Retry: a
// dead letter is never skipped).
//
// It produces with franz-go's idempotent producer: a retried request
// writes a record once.
type Replayer struct {
	Producer *kgo.Client

	mu       sync.Mutex
	produced []kafka.Message
}

var _ handler.Handler = (*Replayer)(nil)

// Handle writes one dead letter back to its source topic.
func (r *Replayer) Handle(ctx context.Context, m kafka.Message) error {
	var src, part, off string
	rec := &kgo.Record{Key: m.Key, Value: m.Value}
	for _, h := range m.Headers {
		switch h.Key {
		case framework.HeaderTopic:
			src = string(h.Value)
		case framework.HeaderPartition:
			part = string(h.Value)
		case framework.HeaderOffset:
			off = string(h.Value)
		}
		if !strings.HasPrefix(h.Key, "tidemark-") {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	if src == "" {
		// Not written by tidemark's DeadLetter: no source to go back to.
		return fmt.Errorf("dead letter %s/%d offset %d has no %s header", m.Topic, m.Partition, m.Offset, framework.HeaderTopic)
	}
	rec.Topic = src
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: HeaderReplayedFrom, Value: fmt.Appendf(nil, "%s/%d/%d", m.Topic, m.Partition, m.Offset)},
		kgo.RecordHeader{Key: HeaderOriginal, Value: fmt.Appendf(nil, "%s/%s/%s", src, part, off)})
	if err := r.Producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("replaying dead letter %s/%d offset %d to %s: %w", m.Topic, m.Partition, m.Offset, src, err)
	}
	out := kafka.Message{Topic: rec.Topic, Partition: int(rec.Partition), Offset: rec.Offset, Key: rec.Key, Value: rec.Value, Time: rec.Timestamp}
	for _, h := range rec.Headers {
		out.Headers = append(out.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	r.mu.Lock()
	r.produced = append(r.produced, out)
	r.mu.Unlock()
	return nil
}

// Produced returns the messages written back, with their topic, partition
// and offset.
func (r *Replayer) Produced() []kafka.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kafka.Message(nil), r.produced...)
}

// errNoProducer is returned by NewReplayer without a producer.
var errNoProducer = errors.New("deadletter-replay: Replayer needs a producer")

// NewReplayer returns a Replayer that writes with kc.
func NewReplayer(kc *kgo.Client) (*Replayer, error) {
	if kc == nil {
		return nil, errNoProducer
	}
	return &Replayer{Producer: kc}, nil
}

// sourceOf returns a replayed message's HeaderOriginal, "" if it has none.
func sourceOf(m kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == HeaderOriginal {
			return string(h.Value)
		}
	}
	return ""
}
