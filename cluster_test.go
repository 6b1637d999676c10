package tidemark_test

// End-to-end tests on a cluster of three Kafka nodes
// (scripts/kafka-local run --nodes 3 -- go test -run TestCluster .): they
// skip unless KAFKA_NODES is 3. Brokers fail under load and leaders move;
// every message is handled exactly once and the commits reach the log end.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// threeNodes returns the cluster's brokers, or skips the test.
func threeNodes(t *testing.T) []string {
	t.Helper()
	if os.Getenv("KAFKA_NODES") != "3" || os.Getenv("TIDEMARK_KAFKA_LOCAL") == "" {
		t.Skip("needs a three-node cluster: scripts/kafka-local run --nodes 3 -- go test -run TestCluster .")
	}
	return strings.Split(os.Getenv(testsupport.EnvBrokers), ",")
}

// node runs scripts/kafka-local CMD --node N on the test's cluster.
func node(t *testing.T, cmd string, n int32, extra ...string) {
	t.Helper()
	args := append([]string{cmd, "--node", fmt.Sprint(n), "--dir", os.Getenv("TIDEMARK_KAFKA_DIR")}, extra...)
	out, err := exec.Command(os.Getenv("TIDEMARK_KAFKA_LOCAL"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kafka-local %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// leaders returns each partition's leader, from any broker that answers,
// on the connections of tr.
func leaders(tr *kafka.Transport, brokers []string, topic string) (map[int]int32, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 2 * time.Second, Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	out := map[int]int32{}
	for _, tp := range md.Topics {
		for _, p := range tp.Partitions {
			if p.Error == nil && p.Leader.Host != "" {
				out[p.ID] = int32(p.Leader.ID)
			}
		}
	}
	return out, nil
}

// committedOn reads the group's committed offsets of topic through cl.
func committedOn(cl *kafka.Client, group, topic string, parts int) (map[int]int64, error) {
	ps := make([]int, parts)
	for i := range ps {
		ps[i] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// streamProducer writes testsupport.Value records to every partition in
// rounds until stopped, and says how many each partition got.
type streamProducer struct {
	stop     chan struct{}
	done     chan error
	produced map[int]int
}

func startStream(t *testing.T, brokers []string, topic string, parts int) *streamProducer {
	kc := testsupport.NewProducer(t, brokers, kgo.RequiredAcks(kgo.AllISRAcks()))
	s := &streamProducer{stop: make(chan struct{}), done: make(chan error, 1), produced: map[int]int{}}
	go func() {
		for round := 0; ; round++ {
			select {
			case <-s.stop:
				s.done <- nil
				return
			default:
			}
			var recs []*kgo.Record
			for p := 0; p < parts; p++ {
				recs = append(recs, testsupport.ValueRecords(topic, p, round*20, 20)...)
			}
			if err := testsupport.ProduceSync(kc, recs); err != nil {
				s.done <- fmt.Errorf("round %d: %w", round, err)
				return
			}
			for p := 0; p < parts; p++ {
				s.produced[p] = (round + 1) * 20
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return s
}

func (s *streamProducer) end(t *testing.T) map[int]int64 {
	t.Helper()
	close(s.stop)
	if err := <-s.done; err != nil {
		t.Fatalf("producing: %v", err)
	}
	out := map[int]int64{}
	for p, n := range s.produced {
		out[p] = int64(n)
	}
	return out
}

// The node leading the most partitions is SIGKILLed under load, and comes
// back. Each of its partitions resumes once its new leader is known (the
// time is logged per partition); nothing is lost or handled twice and the
// commits reach the log ends.
func TestClusterLeaderKilled(t *testing.T) {
	brokers := threeNodes(t)
	const parts = 6
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	tr := &kafka.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	admin := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 20 * time.Second, Transport: tr}
	res, err := admin.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: topic, NumPartitions: parts, ReplicationFactor: 3}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("creating %s: %v", topic, err)
	}
	testsupport.WaitForNoError(t, 30*time.Second, "every partition led", func() error {
		ls, err := leaders(tr, brokers, topic)
		if err == nil && len(ls) < parts {
			err = fmt.Errorf("%d of %d partitions led", len(ls), parts)
		}
		return err
	})
	prod := startStream(t, brokers, topic, parts)
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "1,000 messages handled", func() bool { return rec.Count() >= 1000 })

	ls, err := leaders(tr, brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[int32][]int{}
	for p, n := range ls {
		byNode[n] = append(byNode[n], p)
	}
	victim := int32(-1)
	for n, ps := range byNode {
		if victim < 0 || len(ps) > len(byNode[victim]) || len(ps) == len(byNode[victim]) && n < victim {
			victim = n
		}
	}
	affected := byNode[victim]
	sort.Ints(affected)
	processed := func(p int) int64 {
		for _, s := range r.C.Stats().Partitions {
			if s.Topic == topic && s.Partition == p {
				return s.Processed
			}
		}
		return -1
	}
	at := map[int]int64{}
	for _, p := range affected {
		at[p] = processed(p)
	}
	killed := time.Now()
	node(t, "kill", victim)
	// Watch each affected partition: when the cluster names its new
	// leader, and when the consumer handles past where it was.
	var mu sync.Mutex
	known, resumed := map[int]time.Duration{}, map[int]time.Duration{}
	testsupport.WaitFor(t, 2*time.Minute, "every affected partition resumed on its new leader", func() bool {
		now := time.Since(killed)
		alive := []string{}
		for i, b := range brokers {
			if int32(i) != victim {
				alive = append(alive, b)
			}
		}
		ls, _ := leaders(tr, alive, topic)
		mu.Lock()
		defer mu.Unlock()
		for _, p := range affected {
			if _, ok := known[p]; !ok && ls != nil && ls[p] != victim {
				if _, led := ls[p]; led {
					known[p] = now
				}
			}
			if _, ok := resumed[p]; !ok && processed(p) > at[p]+20 {
				resumed[p] = now
			}
		}
		return len(resumed) == len(affected) && len(known) == len(affected)
	})
	var slowest time.Duration
	var lines []string
	for _, p := range affected {
		d := max(resumed[p]-known[p], 0)
		slowest = max(slowest, d)
		lines = append(lines, fmt.Sprintf("%d: leader known %s after the kill, resumed %s after that", p,
			known[p].Round(time.Millisecond), d.Round(time.Millisecond)))
	}
	t.Logf("node %d (leading %d of %d partitions) SIGKILLed: %s", victim, len(affected), parts, strings.Join(lines, "; "))
	node(t, "restart", victim)
	ends := prod.end(t)
	testsupport.WaitFor(t, 2*time.Minute, "the commits at the log ends", func() bool {
		c, err := committedOn(admin, group, topic, parts)
		return err == nil && testsupport.EqualOffsets(c, ends)
	})
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), ends)
	t.Logf("longest resume after the new leader was known: %s (target 1 s)", slowest.Round(time.Millisecond))
}
