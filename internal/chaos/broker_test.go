package chaos

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/internal/testsupport"
)

// The harness restarts the in-process broker by closing it and starting a
// new one on the same port and data directory. This checks, in the pinned
// kfake version, that topics, records, committed offsets and the group's
// generation survive, and that a commit of the generation before the
// restart is still accepted after it.
func TestFakeBrokerRestartKeepsState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := StartFake(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := newAdmin(b.Addr())
	defer a.close()
	const topic, group, parts = "t", "g", 3
	if err := a.createTopic(ctx, topic, parts); err != nil {
		t.Fatal(err)
	}
	want := make([][]string, parts)
	for p := 0; p < parts; p++ {
		var recs []kafka.Record
		for i := 0; i < 10+p; i++ {
			recs = append(recs, kafka.Record{Value: kafka.NewBytes(Value(p, int64(i)))})
			want[p] = append(want[p], string(Value(p, int64(i))))
		}
		res, err := a.cl.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(recs...)})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			t.Fatalf("producing to %s/%d: %v", topic, p, err)
		}
	}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: group, Brokers: []string{b.Addr()}, Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	gen, err := cg.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{topic: {0: 5, 1: 7, 2: 9}}); err != nil {
		t.Fatal(err)
	}

	if err := b.Restart(ctx, false, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}

	// The first requests after the restart may meet the old connections.
	var committed []int64
	testsupport.WaitForNoError(t, 10*time.Second, "reading committed offsets", func() (err error) {
		committed, err = a.committed(ctx, group, topic, parts)
		return err
	})
	if !slices.Equal(committed, []int64{5, 7, 9}) {
		t.Fatalf("committed offsets after the restart %v, want [5 7 9]", committed)
	}
	var first, end []int64
	testsupport.WaitForNoError(t, 10*time.Second, "listing offsets", func() (err error) {
		first, end, err = a.bounds(ctx, topic, parts)
		return err
	})
	for p := 0; p < parts; p++ {
		if first[p] != 0 || end[p] != int64(len(want[p])) {
			t.Fatalf("%s/%d bounds [%d, %d) after the restart, want [0, %d)", topic, p, first[p], end[p], len(want[p]))
		}
		got, err := a.readLog(ctx, topic, p, end[p])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want[p]) {
			t.Fatalf("%s/%d after the restart holds %v, want %v", topic, p, got, want[p])
		}
	}
	// The generation from before the restart is still the group's.
	res, err := a.cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: int(gen.ID), MemberID: gen.MemberID,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 6}}}})
	if err == nil {
		for _, p := range res.Topics[topic] {
			err = p.Error
		}
	}
	if err != nil {
		t.Fatalf("commit of generation %d after the restart: %v", gen.ID, err)
	}
}
