package tidemark_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// A committed offset that is missing, or below the last commit Kafka
// confirmed (the offset file's ledger), is not a late commit: the topic was
// recreated or an operator reset the group's offsets. Reconciliation must
// not resume at the file's watermark and skip what lies below it.
func TestPositionDiscontinuity(t *testing.T) {
	// consumeFirst consumes 100 messages of a new one-partition topic and
	// stops, Kafka having confirmed the commit of 100.
	consumeFirst := func(t *testing.T) (*testsupport.Cluster, string, string, string) {
		cl, topic := newTopic(t, 1, 100)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		rec := newRecorder()
		r := startConsumer(t, baseConfig(t, cl, group, topic, file, rec))
		waitFor(t, time.Minute, "first batch", func() bool { return rec.count() == 100 })
		r.stop(t)
		if c := cl.Committed(t, group, topic, 1); c[0] != 100 {
			t.Fatalf("Kafka committed %d after the first run, want 100", c[0])
		}
		return cl, topic, group, file
	}
	t.Run("recreated topic grown past the watermark", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		cl.DeleteTopic(t, topic)
		waitFor(t, 30*time.Second, "topic deleted", func() bool {
			md, err := cl.Client().Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
			return err == nil && (len(md.Topics) == 0 || md.Topics[0].Error != nil)
		})
		cl.CreateTopic(t, topic, 1)
		cl.Produce(t, topic, 1, 0, 150) // past the file's watermark, 100

		rec := newRecorder()
		log, logs := observedLogger(t)
		cfg := baseConfig(t, cl, group, topic, file, rec)
		cfg.Logger = log
		r := startConsumer(t, cfg)
		waitFor(t, 20*time.Second, "the recreated topic consumed", func() bool { return rec.count() == 150 })
		r.stop(t)
		if lost, dups := rec.check(1, offsets(1, 0), offsets(1, 150)); len(lost) > 0 || dups > 0 {
			t.Fatalf("recreated topic: %d lost (%v), %d twice", len(lost), head(lost), dups)
		}
		checkReset(t, logs, file, group, topic, 100, 0)
	})
	// resetTo40 does what kafka-consumer-groups --reset-offsets
	// --to-offset 40 does on the empty group.
	resetTo40 := func(t *testing.T, cl *testsupport.Cluster, group, topic string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := cl.Client().OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 40}}}})
		if err == nil {
			for _, p := range res.Topics[topic] {
				if p.Error != nil {
					err = p.Error
				}
			}
		}
		if err != nil {
			t.Fatalf("resetting the group's offset: %v", err)
		}
		if c := cl.Committed(t, group, topic, 1); c[0] != 40 {
			t.Fatalf("Kafka committed %d after the reset, want 40", c[0])
		}
	}
	t.Run("operator reset below the watermark", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		resetTo40(t, cl, group, topic)

		rec := newRecorder()
		log, logs := observedLogger(t)
		cfg := baseConfig(t, cl, group, topic, file, rec)
		cfg.Logger = log
		r := startConsumer(t, cfg)
		waitFor(t, 20*time.Second, "the reset range handled again", func() bool { return rec.count() == 60 })
		time.Sleep(200 * time.Millisecond)
		r.stop(t)
		if lost, dups := rec.check(1, offsets(1, 40), offsets(1, 100)); len(lost) > 0 || dups > 0 {
			t.Fatalf("after the operator's reset: %d not handled again (%v), %d twice", len(lost), head(lost), dups)
		}
		checkReset(t, logs, file, group, topic, 100, 40)
		if c := cl.Committed(t, group, topic, 1); c[0] != 100 {
			t.Errorf("Kafka committed %d at the end, want 100", c[0])
		}
	})
	t.Run("operator reset, Stall", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		resetTo40(t, cl, group, topic)
		rec := newRecorder()
		log, logs := observedLogger(t)
		cfg := baseConfig(t, cl, group, topic, file, rec)
		cfg.Logger = log
		cfg.OutOfRange = framework.Stall
		r := startConsumer(t, cfg)
		waitFor(t, 20*time.Second, "the partition stalled", func() bool {
			ps := r.c.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateStalled
		})
		time.Sleep(200 * time.Millisecond)
		r.stop(t)
		if n := rec.count(); n != 0 {
			t.Errorf("a stalled partition handled %d messages", n)
		}
		if n := logs.FilterMessage("partition stalled: committed offset moved back").Len(); n != 1 {
			t.Errorf("%d stall logs, want 1", n)
		}
		if c := cl.Committed(t, group, topic, 1); c[0] != 40 {
			t.Errorf("Kafka committed %d for a stalled partition, want the operator's 40", c[0])
		}
	})
}
