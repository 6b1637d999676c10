package testsupport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkaproxy"
)

// EnvBrokers names the environment variable that points the suite at a real
// broker, "host:port[,host:port]".
const EnvBrokers = "KAFKA_BROKERS"

// Cluster is one broker for one test, with a fault proxy in front.
type Cluster struct {
	// Upstream is the broker's own address; Brokers is the proxy's, which
	// clients under test use.
	Upstream string
	Brokers  []string
	// Proxy injects faults between the clients under test and the broker.
	Proxy *kafkaproxy.Proxy
	// Real reports whether this is a real broker (KAFKA_BROKERS).
	Real bool
	// Fake is the in-process broker, nil on a real one.
	Fake *kfake.Cluster

	client *kafka.Client
}

// RealBroker reports whether KAFKA_BROKERS selects a real broker.
func RealBroker() bool { return os.Getenv(EnvBrokers) != "" }

// Start returns a broker for t, closed when t ends. Opts tune the
// in-process broker and are ignored on a real one.
func Start(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	c := &Cluster{}
	if env := os.Getenv(EnvBrokers); env != "" {
		c.Real = true
		c.Upstream = strings.Split(env, ",")[0]
	} else {
		base := []kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second)}
		fake, err := kfake.NewCluster(append(base, opts...)...)
		if err != nil {
			t.Fatalf("starting the in-process broker: %v", err)
		}
		t.Cleanup(fake.Close)
		c.Fake = fake
		c.Upstream = fake.ListenAddrs()[0]
	}
	p, err := kafkaproxy.New(c.Upstream)
	if err != nil {
		t.Fatalf("starting the fault proxy to %s: %v", c.Upstream, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c.Proxy = p
	c.Brokers = []string{p.Addr()}
	tr := &kafka.Transport{ClientID: "testsupport"}
	t.Cleanup(tr.CloseIdleConnections)
	c.client = &kafka.Client{Addr: kafka.TCP(c.Upstream), Transport: tr, Timeout: 20 * time.Second}
	return c
}

var seq atomic.Int64

// Name returns a topic or group name unique to this test run.
func Name(t testing.TB, prefix string) string {
	// Kafka accepts only ASCII letters, digits, '.', '_' and '-'.
	clean := strings.Map(func(r rune) rune {
		if r < 128 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '-'
	}, t.Name())
	if len(clean) > 40 {
		clean = clean[:40]
	}
	return fmt.Sprintf("%s-%s-%d-%d", prefix, clean, time.Now().UnixNano()%1e9, seq.Add(1))
}

// FixedName returns name on the in-process broker, which is the test's
// own, and a unique Name on a real broker, which tests share: readable
// names where they can be, in output compared with golden files.
func (c *Cluster) FixedName(t testing.TB, name string) string {
	if c.Real {
		return Name(t, name)
	}
	return name
}

// NewTopic starts a broker for t and creates a topic of parts partitions
// holding perPart messages each, with Value payloads.
func NewTopic(t testing.TB, parts, perPart int) (*Cluster, string) {
	t.Helper()
	c := Start(t)
	topic := Name(t, "t")
	c.CreateTopic(t, topic, parts)
	c.Produce(t, topic, parts, 0, perPart)
	return c, topic
}

// Client is a kafka-go client straight to the broker (not through the
// proxy), for setting up and checking a test.
func (c *Cluster) Client() *kafka.Client { return c.client }

// CreateTopic creates a topic and waits until its partitions have leaders.
func (c *Cluster) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	c.CreateTopicWith(t, topic, partitions, nil)
}

// CreateTopicWith is CreateTopic with topic configs (cleanup.policy,
// segment.ms, ...).
func (c *Cluster) CreateTopicWith(t testing.TB, topic string, partitions int, configs map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}
	for k, v := range configs {
		tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
	}
	res, err := c.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	c.WaitLeaders(t, topic, partitions)
}

// FetchLanes is how many fetch loops a consumer runs per broker
// (framework's fetchLanes, which its tests hold equal to this): bounds that
// allow one record batch per fetch loop multiply the leaders by it.
const FetchLanes = 2

// WaitLeaders waits up to 30s until topic has partitions partitions, each
// with a leader, and returns the number of brokers that lead them.
func (c *Cluster) WaitLeaders(t testing.TB, topic string, partitions int) int {
	t.Helper()
	var leaders map[int]bool
	WaitFor(t, 30*time.Second, fmt.Sprintf("%d partitions of %s with leaders", partitions, topic), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		md, err := c.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != partitions {
			return false
		}
		leaders = map[int]bool{}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.Port == 0 {
				return false
			}
			leaders[p.Leader.ID] = true
		}
		return true
	})
	return len(leaders)
}

// DeleteTopic deletes a topic.
func (c *Cluster) DeleteTopic(t testing.TB, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("deleting topic %s: %v", topic, err)
	}
}

// WaitDeleted waits up to 30s until the broker no longer lists topic.
func (c *Cluster) WaitDeleted(t testing.TB, topic string) {
	t.Helper()
	WaitFor(t, 30*time.Second, "topic "+topic+" deleted", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		md, err := c.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		return err == nil && (len(md.Topics) == 0 || md.Topics[0].Error != nil)
	})
}

// DeleteRecords moves a partition's log start to offset, as retention
// does.
func (c *Cluster) DeleteRecords(t testing.TB, topic string, partition int32, offset int64) {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(c.Upstream))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := req.RequestWith(ctx, kc)
	if err != nil {
		t.Fatalf("DeleteRecords: %v", err)
	}
	for _, rt := range res.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				t.Fatalf("DeleteRecords %s/%d: error code %d", rt.Topic, rp.Partition, rp.ErrorCode)
			}
		}
	}
}

// CommitOffsets commits offsets (partition -> offset) of topic for a group
// with no members, as an admin tool does (generation -1), straight to the
// broker. It retries what Kafka calls retriable: a real broker may still be
// loading the group's coordinator.
func (c *Cluster) CommitOffsets(t testing.TB, group, topic string, offsets map[int]int64) {
	t.Helper()
	req := &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{}}
	for p, o := range offsets {
		req.Topics[topic] = append(req.Topics[topic], kafka.OffsetCommit{Partition: p, Offset: o})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for attempt := 1; ; attempt++ {
		res, err := c.client.OffsetCommit(ctx, req)
		if err == nil {
			for _, ps := range res.Topics {
				for _, p := range ps {
					if p.Error != nil {
						err = fmt.Errorf("%s/%d: %w", topic, p.Partition, p.Error)
					}
				}
			}
		}
		if err == nil {
			return
		}
		var ke kafka.Error
		if !errors.As(err, &ke) || !ke.Temporary() || attempt == 100 || ctx.Err() != nil {
			t.Fatalf("committing %v for group %s on %s (attempt %d): %v", offsets, group, topic, attempt, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Value is the payload the suite produces: it names its partition and
// sequence number, so a handler can check what it got.
func Value(partition, seq int) []byte { return fmt.Appendf(nil, "p%d-m%07d", partition, seq) }

// Produce appends n messages to every partition of topic, numbered from
// first, with Value payloads and "k<number>" keys.
func (c *Cluster) Produce(t testing.TB, topic string, partitions, first, n int) {
	t.Helper()
	c.ProduceKeyed(t, topic, partitions, first, n, func(_, seq int) []byte { return fmt.Appendf(nil, "k%d", seq) })
}

// ProduceKeyed is Produce with the key of each message given by key (nil:
// no key).
func (c *Cluster) ProduceKeyed(t testing.TB, topic string, partitions, first, n int, key func(partition, seq int) []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const chunk = 2000
	for p := 0; p < partitions; p++ {
		for i := 0; i < n; i += chunk {
			// Records are readers, consumed by a send: build them anew for
			// each attempt.
			records := func() kafka.RecordReader {
				recs := make([]kafka.Record, 0, chunk)
				for j := i; j < n && j < i+chunk; j++ {
					rec := kafka.Record{Value: kafka.NewBytes(Value(p, first+j))}
					if k := key(p, first+j); k != nil {
						rec.Key = kafka.NewBytes(k)
					}
					recs = append(recs, rec)
				}
				return kafka.NewRecordReader(recs...)
			}
			// A real broker may still be electing the leader of a new
			// partition: retry what Kafka calls retriable.
			for attempt := 1; ; attempt++ {
				res, err := c.client.Produce(ctx, &kafka.ProduceRequest{
					Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
					Records: records(),
				})
				if err == nil {
					err = res.Error
				}
				if err == nil && len(res.RecordErrors) > 0 {
					err = fmt.Errorf("record errors: %v", res.RecordErrors)
				}
				if err == nil {
					break
				}
				var ke kafka.Error
				if !errors.As(err, &ke) || !ke.Temporary() || attempt == 50 || ctx.Err() != nil {
					t.Fatalf("producing to %s/%d (attempt %d): %v", topic, p, attempt, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// Commit commits offset for group's partition of topic as a client outside
// any generation would (generation -1), as an operator's tool does; it fails
// the test on any error, the partition's included.
func (c *Cluster) Commit(t testing.TB, group, topic string, partition int, offset int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: partition, Offset: offset}}}})
	if err != nil {
		t.Fatalf("committing %s/%d at %d for group %s: %v", topic, partition, offset, group, err)
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("committing %s/%d at %d for group %s: %v", topic, partition, offset, group, p.Error)
		}
	}
}

// Committed returns the group's committed offset per partition; -1 where
// none.
func (c *Cluster) Committed(t testing.TB, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	out, err := c.TryCommitted(group, topic, partitions)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

// TryCommitted is Committed returning its error, for polling.
func (c *Cluster) TryCommitted(group, topic string, partitions int) (map[int]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids := make([]int, partitions)
	out := make(map[int]int64, partitions)
	for i := range ids {
		ids[i] = i
		out[i] = -1
	}
	res, err := c.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err == nil && res.Error != nil && !strings.Contains(res.Error.Error(), "Group Id Not Found") &&
		!strings.Contains(res.Error.Error(), "[69]") {
		err = res.Error
	}
	if err != nil {
		return nil, fmt.Errorf("fetching committed offsets of %s on %s: %w", group, topic, err)
	}
	for _, p := range res.Topics[topic] {
		if p.Error == nil {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out, nil
}

// Bounds returns the first offset and the high watermark of each partition.
func (c *Cluster) Bounds(t testing.TB, topic string, partitions int) (first, end map[int]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := 0; p < partitions; p++ {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	res, err := c.client.ListOffsets(ctx, req)
	if err != nil {
		t.Fatalf("listing offsets of %s: %v", topic, err)
	}
	first, end = map[int]int64{}, map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			t.Fatalf("listing offsets of %s/%d: %v", topic, po.Partition, po.Error)
		}
		first[po.Partition], end[po.Partition] = po.FirstOffset, po.LastOffset
	}
	return first, end
}
