package tidemarktest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// EnvBrokers names the environment variable that points NewBroker at a
// real Kafka cluster: "host:port[,host:port...]".
const EnvBrokers = "KAFKA_BROKERS"

// setupTimeout bounds each call to the broker made to set up a test.
const setupTimeout = time.Minute

// A Broker is a Kafka cluster for one test: an in-process kfake broker of
// the test's own, or the real cluster named by KAFKA_BROKERS.
type Broker struct {
	brokers []string
	fake    *kfake.Cluster // nil on a real cluster

	mu     sync.Mutex
	client *kgo.Client // admin requests and produce, made on first use
}

// An Option configures NewBroker.
type Option func(*brokerConfig)

type brokerConfig struct {
	fakeOpts []kfake.Opt
	env      bool
}

// WithKfake passes options to the in-process broker (kfake.NumBrokers,
// kfake.SeedTopics, ...). They are ignored on a real cluster.
func WithKfake(opts ...kfake.Opt) Option {
	return func(c *brokerConfig) { c.fakeOpts = append(c.fakeOpts, opts...) }
}

// InProcess makes NewBroker start the in-process broker even when
// KAFKA_BROKERS is set, for a test that needs kfake's controls (Fake).
func InProcess() Option { return func(c *brokerConfig) { c.env = false } }

// NewBroker returns a broker for t, closed when t ends: the real cluster
// named by KAFKA_BROKERS if it is set, otherwise a new single-broker
// kfake cluster. A failure to start it fails the test.
func NewBroker(t testing.TB, opts ...Option) *Broker {
	t.Helper()
	cfg := brokerConfig{env: true}
	for _, o := range opts {
		o(&cfg)
	}
	b := &Broker{}
	if env := os.Getenv(EnvBrokers); env != "" && cfg.env {
		for _, a := range strings.Split(env, ",") {
			if a = strings.TrimSpace(a); a != "" {
				b.brokers = append(b.brokers, a)
			}
		}
	} else {
		// A 1 s minimum session timeout lets tests use short ones.
		base := []kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second)}
		fake, err := kfake.NewCluster(append(base, cfg.fakeOpts...)...)
		if err != nil {
			t.Fatalf("tidemarktest: starting the in-process broker: %v", err)
		}
		t.Cleanup(fake.Close)
		b.fake = fake
		b.brokers = fake.ListenAddrs()
	}
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.client != nil {
			b.client.Close()
		}
	})
	return b
}

// Brokers returns the addresses to give framework.Config.Brokers.
func (b *Broker) Brokers() []string { return append([]string(nil), b.brokers...) }

// Real reports whether b is a real cluster (KAFKA_BROKERS).
func (b *Broker) Real() bool { return b.fake == nil }

// Fake returns the in-process broker, for its controls (ControlKey, to
// make requests fail), or nil on a real cluster.
func (b *Broker) Fake() *kfake.Cluster { return b.fake }

func (b *Broker) kgo(t testing.TB) *kgo.Client {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client == nil {
		// The default producer is idempotent: each record is written once
		// and in order, even when a request is retried.
		kc, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ProducerLinger(0))
		if err != nil {
			t.Fatalf("tidemarktest: a client to %v: %v", b.brokers, err)
		}
		b.client = kc
	}
	return b.client
}

var seq atomic.Int64

// Name returns base on the in-process broker, which belongs to the test,
// and base with a suffix unique to this run on a real cluster, which tests
// share: for group IDs, say.
func (b *Broker) Name(t testing.TB, base string) string {
	if !b.Real() {
		return base
	}
	return uniqueName(t, base)
}

// uniqueName is base, the test's name and a number unique to the process.
func uniqueName(t testing.TB, base string) string {
	// Kafka accepts only ASCII letters, digits, '.', '_' and '-'.
	clean := strings.Map(func(r rune) rune {
		if r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '-'
	}, t.Name())
	if len(clean) > 40 {
		clean = clean[:40]
	}
	return fmt.Sprintf("%s-%s-%d-%d", base, clean, time.Now().UnixNano()%1e9, seq.Add(1))
}

// CreateTopic creates a topic of partitions partitions and waits until
// each has a leader. It returns the topic's name: name itself on the
// in-process broker; on a real cluster Name(t, name), and the topic is
// deleted when t ends.
func (b *Broker) CreateTopic(t testing.TB, name string, partitions int) string {
	t.Helper()
	topic := b.Name(t, name)
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, int32(partitions), -1 // the cluster's default
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = int32(setupTimeout / time.Millisecond)
	res, err := req.RequestWith(ctx, b.kgo(t))
	if err == nil && len(res.Topics) != 1 {
		err = fmt.Errorf("%d topics in the response", len(res.Topics))
	}
	if err == nil {
		err = kerr.ErrorForCode(res.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("tidemarktest: creating topic %s of %d partitions: %v", topic, partitions, err)
	}
	if b.Real() {
		t.Cleanup(func() { b.deleteTopic(t, topic) })
	}
	b.waitLeaders(t, ctx, topic, partitions)
	return topic
}

// waitLeaders polls the metadata until topic has partitions partitions,
// each with a leader.
func (b *Broker) waitLeaders(t testing.TB, ctx context.Context, topic string, partitions int) {
	t.Helper()
	var last string
	for {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		res, err := req.RequestWith(ctx, b.kgo(t))
		switch {
		case err != nil:
			last = err.Error()
		case len(res.Topics) != 1:
			last = fmt.Sprintf("%d topics in the metadata", len(res.Topics))
		case res.Topics[0].ErrorCode != 0:
			last = kerr.ErrorForCode(res.Topics[0].ErrorCode).Error()
		case len(res.Topics[0].Partitions) != partitions:
			last = fmt.Sprintf("%d partitions", len(res.Topics[0].Partitions))
		default:
			last = ""
			for _, p := range res.Topics[0].Partitions {
				if p.ErrorCode != 0 || p.Leader < 0 {
					last = fmt.Sprintf("partition %d has no leader", p.Partition)
				}
			}
			if last == "" {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("tidemarktest: topic %s: waiting for %d partitions with leaders: %v (last: %s)", topic, partitions, ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// deleteTopic runs in a cleanup, after t.Context is cancelled.
func (b *Broker) deleteTopic(t testing.TB, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	req := kmsg.NewPtrDeleteTopicsRequest()
	rt := kmsg.NewDeleteTopicsRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.TopicNames = append(req.TopicNames, topic)
	req.TimeoutMillis = int32(setupTimeout / time.Millisecond)
	res, err := req.RequestWith(ctx, b.kgo(t))
	if err == nil && len(res.Topics) == 1 {
		err = kerr.ErrorForCode(res.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Logf("tidemarktest: deleting topic %s: %v", topic, err)
	}
}

// Produce writes msgs to topic, in order, and returns them as written:
// with Topic, Partition, Offset and Time set. Each message's Key, Value
// and Headers are sent; its Partition is ignored: the key decides it, as
// with Kafka's Java client (murmur2 of the key; messages without a key
// are spread). Messages of one key thus land in one partition in the
// order given. A failure to write any of them fails the test.
func (b *Broker) Produce(t testing.TB, topic string, msgs ...kafka.Message) []kafka.Message {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: topic, Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()
	if err := b.kgo(t).ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("tidemarktest: producing %d messages to %s: %v", len(msgs), topic, err)
	}
	out := make([]kafka.Message, len(msgs))
	for i, r := range recs {
		out[i] = msgs[i]
		out[i].Topic, out[i].Partition, out[i].Offset, out[i].Time = topic, int(r.Partition), r.Offset, r.Timestamp
	}
	return out
}

// Keyed returns n messages spread over keys keys, for Produce: message i
// has key "key-<i%keys>" and value "message-<i>", so each key has a
// sequence of messages whose order a consumer must keep.
func Keyed(n, keys int) []kafka.Message {
	keys = max(keys, 1)
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "key-%d", i%keys), Value: fmt.Appendf(nil, "message-%d", i)}
	}
	return msgs
}
