package kafkaproxy_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/tidemark/tidemark/internal/kafkaproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// broker is the upstream a test runs against: a fresh single-broker kfake
// cluster, or the real broker named first in KAFKA_BROKERS.
type broker struct {
	addr string
	obs  *observer // requests the broker received; nil on a real broker
}

// startBroker starts the upstream broker with the topics, each with one
// partition.
func startBroker(t testing.TB, topics ...string) broker {
	t.Helper()
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		addr := strings.Split(env, ",")[0]
		cl := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second, Transport: newTransport(t)}
		var cfgs []kafka.TopicConfig
		for _, tp := range topics {
			cfgs = append(cfgs, kafka.TopicConfig{Topic: tp, NumPartitions: 1, ReplicationFactor: 1})
		}
		if len(cfgs) > 0 {
			res, err := cl.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: cfgs})
			if err != nil {
				t.Fatalf("creating topics on %s: %v", addr, err)
			}
			for tp, err := range res.Errors {
				if err != nil {
					t.Fatalf("creating topic %s on %s: %v", tp, addr, err)
				}
			}
			t.Cleanup(func() {
				_, _ = cl.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: topics})
			})
		}
		return broker{addr: addr}
	}
	obs := &observer{byKey: map[kmsg.Key][]int16{}}
	opts := []kfake.Opt{kfake.NumBrokers(1)}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(1, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		obs.record(req)
		return nil, nil, false // observe only
	})
	return broker{addr: c.ListenAddrs()[0], obs: obs}
}

// observer records the requests the kfake broker received.
type observer struct {
	mu    sync.Mutex
	byKey map[kmsg.Key][]int16 // versions, in arrival order
}

func (o *observer) record(req kmsg.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byKey[kmsg.Key(req.Key())] = append(o.byKey[kmsg.Key(req.Key())], req.GetVersion())
}

func (o *observer) versions(key kmsg.Key) []int16 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int16(nil), o.byKey[key]...)
}

func (o *observer) counts() map[kmsg.Key]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[kmsg.Key]int64, len(o.byKey))
	for k, v := range o.byKey {
		m[k] = int64(len(v))
	}
	return m
}

// newProxy starts a proxy in front of b and closes it when the test ends.
func newProxy(t testing.TB, b broker, opts ...kafkaproxy.Option) *kafkaproxy.Proxy {
	t.Helper()
	opts = append([]kafkaproxy.Option{kafkaproxy.WithLogger(zaptest.NewLogger(t))}, opts...)
	px, err := kafkaproxy.New(b.addr, opts...)
	if err != nil {
		t.Fatalf("kafkaproxy.New: %v", err)
	}
	t.Cleanup(func() {
		if err := px.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return px
}

// newTransport returns a kafka-go Transport whose idle connections are
// closed when the test ends.
func newTransport(t testing.TB) *kafka.Transport {
	tr := &kafka.Transport{ClientID: "kafkaproxy-test", DialTimeout: 5 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// mustRule returns a function that fails the test on a rule constructor's
// error: mustRule(t)(px.Fail(...)).
func mustRule(t testing.TB) func(*kafkaproxy.Rule, error) *kafkaproxy.Rule {
	return func(r *kafkaproxy.Rule, err error) *kafkaproxy.Rule {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// committed returns the group's committed offset of topic/0, asked of the
// broker directly, not through the proxy. It retries the errors a real
// broker returns while its group coordinator starts up.
func committed(t testing.TB, b broker, group, topic string) int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(b.addr), Transport: newTransport(t)}
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err := cl.OffsetFetch(ctxTimeout(t, 10*time.Second), &kafka.OffsetFetchRequest{
			GroupID: group, Topics: map[string][]int{topic: {0}},
		})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			if ps := res.Topics[topic]; len(ps) != 1 {
				t.Fatalf("OffsetFetch: partitions %+v", ps)
			} else {
				err = ps[0].Error
			}
		}
		switch {
		case err == nil:
			return res.Topics[topic][0].CommittedOffset
		case b.obs != nil && errors.Is(err, kafka.GroupIdNotFound):
			return -1 // kfake's answer for a group without commits
		case isTemporary(err) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("OffsetFetch %s %s: %v", group, topic, err)
		}
	}
}

// commit commits offset for topic/0 of group (as a simple consumer,
// generation -1) with cl, and returns the request or partition error.
func commit(t testing.TB, cl *kafka.Client, group, topic string, offset int64) error {
	t.Helper()
	res, err := cl.OffsetCommit(ctxTimeout(t, 10*time.Second), &kafka.OffsetCommitRequest{
		GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: offset}}},
	})
	if err != nil {
		return err
	}
	if ps := res.Topics[topic]; len(ps) != 1 || ps[0].Partition != 0 {
		t.Fatalf("OffsetCommit response topics %+v", res.Topics)
	}
	return res.Topics[topic][0].Error
}

// mustCommit is commit that must succeed; it retries the errors a real
// broker returns while its group coordinator starts up.
func mustCommit(t testing.TB, cl *kafka.Client, group, topic string, offset int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := commit(t, cl, group, topic, offset)
		if err == nil {
			return
		}
		if !isTemporary(err) || time.Now().After(deadline) {
			t.Fatalf("commit %s %s offset %d: %v", group, topic, offset, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func isTemporary(err error) bool {
	var ke kafka.Error
	return errors.As(err, &ke) && ke.Temporary()
}

// rawClient speaks the Kafka protocol directly over one connection, so that
// tests can pipeline requests and check what comes back byte by byte.
type rawClient struct {
	t    testing.TB
	conn net.Conn
	br   *bufio.Reader
	fmt  *kmsg.RequestFormatter
	sent map[int32]kmsg.Request
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{
		t: t, conn: c, br: bufio.NewReader(c),
		fmt:  kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw")),
		sent: map[int32]kmsg.Request{},
	}
}

func (r *rawClient) send(req kmsg.Request, corr int32) {
	r.t.Helper()
	r.sent[corr] = req
	if _, err := r.conn.Write(r.fmt.AppendRequest(nil, req, corr)); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

// recv reads and decodes one response; read errors are returned, anything
// else wrong fails the test.
func (r *rawClient) recv(timeout time.Duration) (int32, kmsg.Response, error) {
	r.t.Helper()
	_ = r.conn.SetReadDeadline(time.Now().Add(timeout))
	var size [4]byte
	if _, err := io.ReadFull(r.br, size[:]); err != nil {
		return 0, nil, err
	}
	buf := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(r.br, buf); err != nil {
		return 0, nil, err
	}
	corr := int32(binary.BigEndian.Uint32(buf))
	req, ok := r.sent[corr]
	if !ok {
		r.t.Fatalf("response with unknown correlation id %d", corr)
	}
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	body := buf[4:]
	if resp.IsFlexible() && req.Key() != int16(kmsg.ApiVersions) {
		body = body[1:] // empty header tags, as kfake and the proxy send them
	}
	if err := resp.ReadFrom(body); err != nil {
		r.t.Fatalf("decoding response %d: %v", corr, err)
	}
	return corr, resp, nil
}
