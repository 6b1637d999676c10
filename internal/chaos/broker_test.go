package chaos

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
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
	const topic, group, parts = "t", "g", 3
	b, a := fakeWithTopic(ctx, t, topic, parts)
	want := make([][]string, parts)
	for p := 0; p < parts; p++ {
		var values [][]byte
		for i := 0; i < 10+p; i++ {
			values = append(values, Value(p, int64(i)))
			want[p] = append(want[p], string(Value(p, int64(i))))
		}
		produce(ctx, t, a, topic, p, values...)
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

// The final read at read_committed delivers the committed transactions'
// values and the plain ones, never an aborted transaction's, and steps
// over the markers to the log end.
func TestReadCommittedDeliversWhatTheLogCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "t"
	b, a := fakeWithTopic(ctx, t, topic, 1)
	kc, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.TransactionalID("x"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	want := map[string]bool{}
	seq := int64(0)
	for i := 0; i < 6; i++ {
		if err := kc.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		commit := i%3 != 1
		for j := 0; j < 3; j++ {
			v := TxnValue(0, seq)
			seq++
			if err := kc.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: v}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if commit {
				want[string(v)] = true
			}
		}
		end := kgo.TryAbort
		if commit {
			end = kgo.TryCommit
		}
		if err := kc.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
		plain := Value(0, int64(i))
		produce(ctx, t, a, topic, 0, plain)
		want[string(plain)] = true
	}
	_, end, err := a.bounds(ctx, topic, 1)
	if err != nil {
		t.Fatal(err)
	}
	if end[0] != 6*(3+1+1) { // three records, a marker and a plain record per transaction
		t.Fatalf("log end %d, want %d", end[0], 6*5)
	}
	got, err := a.readCommitted(ctx, topic, 0, end[0])
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("read_committed delivered %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

// The harness reads a changelog's markers itself: each one's offset,
// timestamp, start and producer id, and nothing of the change records.
func TestChangelogMarkersRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "t" + StateChangelog
	b, a := fakeWithTopic(ctx, t, topic, 2)
	producer := func() *kgo.Client {
		kc, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(kc.Close)
		return kc
	}
	first, second := producer(), producer()
	base := time.UnixMilli(time.Now().UnixMilli())
	marker := func(p int32, start string, d time.Duration) *kgo.Record {
		return &kgo.Record{Topic: topic, Partition: p, Key: []byte{}, Value: []byte(start), Timestamp: base.Add(d),
			Headers: []kgo.RecordHeader{{Key: framework.HeaderChangelogMarker, Value: []byte(start)}, {Key: framework.HeaderChangelogGroup, Value: []byte("g")}}}
	}
	change := func(p int32, value []byte) *kgo.Record {
		return &kgo.Record{Topic: topic, Partition: p, Key: []byte("k"), Value: value, Timestamp: base,
			Headers: []kgo.RecordHeader{{Key: framework.HeaderChangelogOffset, Value: []byte("5")}, {Key: framework.HeaderChangelogEpoch, Value: []byte("0")}}}
	}
	for _, w := range []struct {
		kc *kgo.Client
		r  *kgo.Record
	}{
		{first, marker(0, "5", time.Second)},
		{first, change(0, []byte("v"))},
		{first, change(0, nil)}, // a tombstone
		{second, marker(0, "7", 2*time.Second)},
		{first, marker(1, "0", 3*time.Second)},
	} {
		if err := w.kc.ProduceSync(ctx, w.r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := a.changelogMarkers(ctx, topic, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("markers %+v, want 3", got)
	}
	want := []ChangelogMarker{
		{Partition: 0, Offset: 0, T: base.Add(time.Second).UnixNano(), Start: 5, Producer: got[0].Producer},
		{Partition: 0, Offset: 3, T: base.Add(2 * time.Second).UnixNano(), Start: 7, Producer: got[1].Producer},
		{Partition: 1, Offset: 0, T: base.Add(3 * time.Second).UnixNano(), Start: 0, Producer: got[0].Producer},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("markers %+v, want %+v", got, want)
	}
	if got[0].Producer == got[1].Producer {
		t.Fatalf("two producers' markers carry one producer id %d", got[0].Producer)
	}
}

// fakeWithTopic starts kfake with topic of parts partitions, and an admin
// on it; both close when the test ends.
func fakeWithTopic(ctx context.Context, t *testing.T, topic string, parts int) (*FakeBroker, *admin) {
	t.Helper()
	b, err := StartFake(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a := newAdmin(b.Addr())
	t.Cleanup(a.close)
	if err := a.createTopic(ctx, topic, parts); err != nil {
		t.Fatal(err)
	}
	return b, a
}

// produce writes values to topic/p, acknowledged by the broker.
func produce(ctx context.Context, t *testing.T, a *admin, topic string, p int, values ...[]byte) {
	t.Helper()
	recs := make([]kafka.Record, len(values))
	for i, v := range values {
		recs[i] = kafka.Record{Value: kafka.NewBytes(v)}
	}
	res, err := a.cl.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(recs...)})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		t.Fatalf("producing to %s/%d: %v", topic, p, err)
	}
}
