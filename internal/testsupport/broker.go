// Package testsupport gives tidemark's tests a broker: the in-process kfake
// broker by default, or the real Kafka named by KAFKA_BROKERS, always behind
// a Kafka-aware fault proxy so the same fault scenarios run on both.
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

// Real reports whether KAFKA_BROKERS selects a real broker.
func Real() bool { return os.Getenv(EnvBrokers) != "" }

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
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	if err := res.Errors[topic]; err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	for ctx.Err() == nil {
		md, err := c.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				if p.Error != nil || p.Leader.Port == 0 {
					ready = false
				}
			}
			if ready {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("topic %s has no leaders after 30s", topic)
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

// Value is the payload the suite produces: it names its partition and
// sequence number, so a handler can check what it got.
func Value(partition, seq int) []byte { return fmt.Appendf(nil, "p%d-m%07d", partition, seq) }

// Produce appends n messages to every partition of topic, numbered from
// first, with Value payloads, and returns the log end offsets.
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
