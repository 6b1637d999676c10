package tidemark_test

// Partitions added to a consumed topic: added while the first generation is
// being synced, and added under StartOffset LastOffset. And where an
// assigned partition starts when Kafka's committed offset passes the log
// end its first listing saw.

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// addPartitions grows topic to count partitions, straight at the broker,
// and waits for their leaders.
func addPartitions(t *testing.T, cl *testsupport.Cluster, topic string, count int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Client().CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: int32(count)}},
	})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("adding partitions to %s: %v", topic, err)
	}
	cl.WaitLeaders(t, topic, count)
}

// produceFrom appends n Value messages to each partition of topic, from
// first[p] (0 where absent), straight at the broker.
func produceFrom(t *testing.T, cl *testsupport.Cluster, topic string, first map[int]int, parts, n int) {
	t.Helper()
	kc := testsupport.NewProducer(t, []string{cl.Upstream})
	defer kc.Close()
	var recs []*kgo.Record
	for p := range parts {
		recs = append(recs, testsupport.ValueRecords(topic, p, first[p], n)...)
	}
	if err := testsupport.ProduceSync(kc, recs); err != nil {
		t.Fatalf("producing to %s: %v", topic, err)
	}
}

// Partitions created while the first generation is being synced, after the
// leader read the metadata it assigned from (the proxy holds its SyncGroup
// 2 s meanwhile), are assigned within the partition watch's interval (5 s)
// and a rejoin. Before, the watch took its baseline from a metadata read
// after the sync, which already counted them: they were never assigned, and
// nothing logged "partitions added".
func TestPartitionsAddedDuringTheFirstJoin(t *testing.T) {
	const before, after, perPart = 2, 4, 50
	cl, topic := testsupport.NewTopic(t, before, perPart)
	group := testsupport.Name(t, "g")
	hold, err := cl.Proxy.Delay(kmsg.SyncGroup, 2*time.Second, kafkaproxy.Times(1))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Remove()
	rec := &testsupport.Recorder{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	testsupport.WaitFor(t, 30*time.Second, "the leader's SyncGroup held", func() bool { return hold.Applied() == 1 })
	addPartitions(t, cl, topic, after)
	added := time.Now()
	produceFrom(t, cl, topic, map[int]int{0: perPart, 1: perPart}, after, perPart)
	ends := map[int]int64{0: 2 * perPart, 1: 2 * perPart, 2: perPart, 3: perPart}
	testsupport.WaitFor(t, 30*time.Second, "every partition handled to its end, the added ones too", func() bool {
		return rec.Count() == 6*perPart
	})
	t.Logf("the added partitions handled to their ends %s after they were created", time.Since(added).Round(time.Millisecond))
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(after, 0), ends)
}

// With StartOffset LastOffset, the partitions that existed when the
// consumer started begin at their ends; one added later begins at its first
// offset: nothing produced to it before it was assigned is lost. Before, it
// began at its end, as Java's consumer and franz-go do, and the 50 messages
// produced to it before the partition watch noticed it were skipped.
func TestLastOffsetStartsAddedPartitionsAtTheirFirstOffset(t *testing.T) {
	const before, after, perPart = 2, 3, 50
	cl, topic := testsupport.NewTopic(t, before, perPart) // these are skipped
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.StartOffset = kafka.LastOffset
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "both partitions running, committed at their ends", func() bool {
		return frameworktest.CommittedAt(perPart, r) == before
	})
	addPartitions(t, cl, topic, after)
	produceFrom(t, cl, topic, map[int]int{0: perPart, 1: perPart}, after, perPart)
	testsupport.WaitFor(t, 30*time.Second, "the messages produced after the start handled, the added partition's too", func() bool {
		return rec.Count() == after*perPart
	})
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, map[int]int64{0: perPart, 1: perPart, 2: 0}, map[int]int64{0: 2 * perPart, 1: 2 * perPart, 2: perPart})
}

// The log's bounds are listed while Kafka's committed offsets are read
// (assignment.start). A committed offset above the log end that listing saw
// (messages produced and committed meanwhile) must not look out of range:
// the bounds are listed again. Without that, the partition was reset to its
// first offset and the messages below Kafka's committed offset were handled.
// kfake holds the OffsetFetch until the ListOffsets are answered, then
// appends offsets 10-19 above the committed 15.
func TestCommitAboveTheLogEndFirstListed(t *testing.T) {
	if testsupport.RealBroker() {
		t.Skip("orders the requests with kfake's controls")
	}
	cl, topic := testsupport.NewTopic(t, 1, 10) // offsets 0-9
	group := testsupport.Name(t, "g")
	cl.CommitOffsets(t, group, topic, map[int]int64{0: 15}) // above the log end, for now
	kc := testsupport.NewProducer(t, []string{cl.Upstream})
	var listed atomic.Int32
	cl.Fake.ControlKey(kmsg.ListOffsets.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		cl.Fake.KeepControl()
		listed.Add(1)
		return nil, nil, false
	})
	produced := make(chan error, 1)
	cl.Fake.ControlKey(kmsg.OffsetFetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		cl.Fake.SleepControl(func() {
			// The first and last offsets listed and answered (a consumer
			// that lists them after this read goes on after 2 s).
			for deadline := time.Now().Add(2 * time.Second); listed.Load() < 2 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			produced <- testsupport.ProduceSync(kc, testsupport.ValueRecords(topic, 0, 10, 10))
		})
		return nil, nil, false
	})
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := frameworktest.Start(t, cfg)
	select {
	case err := <-produced:
		if err != nil {
			t.Fatalf("producing offsets 10-19 while the committed offsets were read: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no OffsetFetch held in 30 s")
	}
	if n := listed.Load(); n < 2 {
		t.Fatalf("%d ListOffsets before the committed offsets were answered, want the bounds listed meanwhile", n)
	}
	testsupport.WaitFor(t, 30*time.Second, "offsets 15-19 handled", func() bool { return rec.Count() >= 5 })
	r.Stop(t)
	for o := int64(0); o < 15; o++ {
		if n := rec.Times(0, o); n > 0 {
			t.Errorf("offset %d handled %d times, below Kafka's committed 15", o, n)
		}
	}
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 15), testsupport.Offsets(1, 20))
}
