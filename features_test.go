package tidemark_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/testsupport"
)

// Transaction markers occupy offsets that carry no message. They are never
// handed to the Handler and never hold the watermark back: after the last
// commit marker, the watermark and Kafka's committed offset reach the log
// end.
func TestTransactionMarkersDoNotStall(t *testing.T) {
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)

	kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream), kgo.TransactionalID(testsupport.Name(t, "txn")),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seq := 0
	for txn := 0; txn < 3; txn++ {
		if err := kc.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			r := &kgo.Record{Value: testsupport.Value(0, seq)}
			seq++
			if err := kc.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := kc.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	// Apache Kafka writes the commit markers after EndTransaction returns:
	// wait until all three are in the log, or the expected log end would be
	// one that the consumer passes.
	var end map[int]int64
	waitFor(t, 30*time.Second, "the three commit markers in the log", func() bool {
		_, end = cl.Bounds(t, topic, 1)
		return end[0] == int64(seq)+3
	})

	got := map[int64]string{}
	rec := newRecorder()
	rec.before = func(_ context.Context, m kafka.Message) error {
		got[m.Offset] = string(m.Value) // one partition: calls are sequential
		return nil
	}
	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "the watermark at the log end", func() bool {
		ps := r.c.Stats().Partitions
		if len(ps) == 1 && ps[0].Durable > end[0] {
			t.Fatalf("watermark %d beyond the log end %d", ps[0].Durable, end[0])
		}
		return len(ps) == 1 && ps[0].Durable == end[0]
	})
	r.stop(t)
	if len(got) != seq {
		t.Fatalf("handled %d messages, want %d: %v", len(got), seq, got)
	}
	if c := cl.Committed(t, group, topic, 1)[0]; c != end[0] {
		t.Fatalf("committed %d, want the log end %d", c, end[0])
	}
	t.Logf("%d transactional messages and %d markers: all handled, watermark and commit at the log end %d", seq, end[0]-int64(seq), end[0])
}

// TLS and SASL reach both of kafka-go's connection paths: the group's
// Dialer (join, heartbeats, commits) and the Transport (fetches, offsets).
func TestSASL(t *testing.T) {
	if testsupport.Real() {
		t.Skip("the real broker from scripts/kafka-local has no SASL listener")
	}
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "s3cret"),
		kfake.SeedTopics(2, "secured"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	addr := fake.ListenAddrs()[0]
	mech := plain.Mechanism{Username: "admin", Password: "s3cret"}
	tr := &kafka.Transport{SASL: mech}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "secured", Transport: tr, Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond}
	var msgs []kafka.Message
	for i := 0; i < 20; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte("x")})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()

	rec := newRecorder()
	cfg := baseConfig(t, &testsupport.Cluster{Brokers: []string{addr}}, "g", "secured", filepath.Join(t.TempDir(), "o.db"), countOnly{rec})
	cfg.SASL = mech
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "messages over SASL", func() bool { return rec.count() == 20 })
	r.stop(t)
	for _, p := range r.c.Stats().Partitions {
		if p.Committed != 10 {
			t.Fatalf("%s/%d committed %d over SASL, want 10", p.Topic, p.Partition, p.Committed)
		}
	}
}

// countOnly records offsets without checking payloads.
type countOnly struct{ r *recorder }

func (c countOnly) Handle(_ context.Context, m kafka.Message) error {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if c.r.seen[m.Partition] == nil {
		c.r.seen[m.Partition] = map[int64]int{}
	}
	c.r.seen[m.Partition][m.Offset]++
	return nil
}
