package tidemarktest_test

import (
	"maps"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/tidemarktest"
)

// ends is the offset after the last of msgs in each of partitions
// partitions, -1 for a partition none of them is in: the committed
// offsets of a consumer that handled them all.
func ends(msgs []kafka.Message, partitions int) map[int]int64 {
	out := map[int]int64{}
	for p := range partitions {
		out[p] = -1
	}
	for _, m := range msgs {
		out[m.Partition] = max(out[m.Partition], m.Offset+1)
	}
	return out
}

// TestCommitted reads a group's commits before it has any (-1 in every
// partition) and after a Run that commits only at its stop.
func TestCommitted(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "ledger", 3)
	group := b.Name(t, "g")
	if got, want := b.Committed(t, group, topic), map[int]int64{0: -1, 1: -1, 2: -1}; !maps.Equal(got, want) {
		t.Fatalf("Committed of a group that never committed = %v, want %v", got, want)
	}
	msgs := b.Produce(t, topic, tidemarktest.Keyed(90, 9)...)
	want := ends(msgs, 3)
	for p, o := range want {
		if o < 0 {
			t.Fatalf("9 keys left partition %d of %s empty (%v): the test wants each one written", p, topic, want)
		}
	}
	tidemarktest.Run(t, framework.Config{
		Brokers:        b.Brokers(),
		GroupID:        group,
		Topics:         []string{topic},
		Handler:        &tidemarktest.Recorder{},
		CommitInterval: time.Hour, // only the stop commits
	}, tidemarktest.Processed(msgs))
	if got := b.Committed(t, group, topic); !maps.Equal(got, want) {
		t.Fatalf("Committed after the stop = %v, want the log ends %v", got, want)
	}
}

// TestCommittedAtEnd runs until Kafka holds the log ends of two topics,
// one of them with a partition that never held a message, then produces
// more: the condition no longer holds, and a second run, on a new offset
// file, resumes from Kafka's commits and holds it again, each message
// handled once.
func TestCommittedAtEnd(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	orders := b.CreateTopic(t, "orders", 2)
	refunds := b.CreateTopic(t, "refunds", 2)
	group := b.Name(t, "g")
	msgs := b.Produce(t, orders, tidemarktest.Keyed(60, 6)...)
	msgs = append(msgs, b.Produce(t, refunds, tidemarktest.Keyed(20, 1)...)...) // one key: one partition
	rec := &tidemarktest.Recorder{}
	cfg := framework.Config{
		Brokers:        b.Brokers(),
		GroupID:        group,
		Topics:         []string{orders, refunds},
		Handler:        rec,
		CommitInterval: 100 * time.Millisecond,
	}
	c := tidemarktest.Run(t, cfg, b.CommittedAtEnd(t, orders, refunds))
	for _, topic := range []string{orders, refunds} {
		var of []kafka.Message
		for _, m := range msgs {
			if m.Topic == topic {
				of = append(of, m)
			}
		}
		got, want := b.Committed(t, group, topic), ends(of, 2)
		for p, o := range want {
			if o == -1 && got[p] == 0 {
				want[p] = 0 // an empty partition: committed at its start, or not at all
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("Committed(%s) after CommittedAtEnd held = %v, want %v", topic, got, want)
		}
	}

	more := b.Produce(t, orders, tidemarktest.Keyed(10, 6)...)
	if b.CommittedAtEnd(t, orders)(c) {
		t.Fatalf("CommittedAtEnd(%s) holds with 10 messages produced after the commits", orders)
	}
	tidemarktest.Run(t, cfg, b.CommittedAtEnd(t, orders, refunds))
	if err := rec.Check(append(msgs, more...)); err != nil {
		t.Fatal(err)
	}
}

// TestCommittedAtEndDoesNotFail: a topic that does not exist, or none at
// all, is a condition that does not hold, not a failed test.
func TestCommittedAtEndDoesNotFail(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	c, err := framework.New(framework.Config{
		Brokers:    b.Brokers(),
		GroupID:    b.Name(t, "g"),
		Topics:     []string{"x"},
		Handler:    &tidemarktest.Recorder{},
		OffsetFile: t.TempDir() + "/offsets.db",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b.CommittedAtEnd(t, b.Name(t, "no-such-topic"))(c) {
		t.Error("CommittedAtEnd of a topic that does not exist holds")
	}
	if b.CommittedAtEnd(t)(c) {
		t.Error("CommittedAtEnd of no topic holds")
	}
}
