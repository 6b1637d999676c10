package tidemark_test

// Transactional producers (Config.IsolationLevel): at ReadCommitted each
// committed record is handled exactly once, no aborted one, nothing of an
// open transaction before it commits, and Kafka's commits reach the log
// end past the markers; at ReadUncommitted every record is handled once,
// as before.

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

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// valueCounter is a Handler and a BatchHandler that counts the
// handlings of each value: offsets of a transactional topic do not map to
// values, for markers and aborted records take offsets too.
type valueCounter struct {
	// key names what is counted; nil is the value.
	key func(kafka.Message) string

	mu sync.Mutex
	n  map[string]int
}

func (v *valueCounter) Handle(_ context.Context, m kafka.Message) error {
	k := string(m.Value)
	if v.key != nil {
		k = v.key(m)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.n == nil {
		v.n = map[string]int{}
	}
	v.n[k]++
	return nil
}

// total is the number of handlings and of distinct keys.
func (v *valueCounter) total() (handlings, keys int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, n := range v.n {
		handlings += n
	}
	return handlings, len(v.n)
}

func (v *valueCounter) HandleBatch(ctx context.Context, ms []kafka.Message) error {
	for _, m := range ms {
		_ = v.Handle(ctx, m)
	}
	return nil
}

func (v *valueCounter) times(value string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n[value]
}

// check compares the handlings with what was produced: each of want
// exactly once, none of never, nothing else.
func (v *valueCounter) check(want, never []string) (missing, twice, aborted, unknown []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	known := map[string]bool{}
	for _, w := range want {
		known[w] = true
		switch v.n[w] {
		case 0:
			missing = append(missing, w)
		case 1:
		default:
			twice = append(twice, w)
		}
	}
	for _, a := range never {
		known[a] = true
		if v.n[a] > 0 {
			aborted = append(aborted, a)
		}
	}
	for k := range v.n {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	return
}

// exactlyOnce waits up to timeout for every value of want to be handled
// and for the group's commits to reach the log end, then fails t unless
// each of want was handled exactly once, none of never, and nothing else.
// It returns the log end.
func (v *valueCounter) exactlyOnce(t *testing.T, cl *testsupport.Cluster, group, topic string, parts int, want, never []string, timeout time.Duration) map[int]int64 {
	t.Helper()
	testsupport.WaitFor(t, timeout, fmt.Sprintf("%d records to be handled", len(want)), func() bool {
		missing, _, _, _ := v.check(want, nil)
		return len(missing) == 0
	})
	end := waitCommittedAtEnd(t, cl, group, topic, parts)
	missing, twice, banned, unknown := v.check(want, never)
	if len(missing)+len(twice)+len(banned)+len(unknown) > 0 {
		t.Fatalf("of %d records to handle and %d never to: %d lost %q, %d handled twice %q, %d of those never to handle handled %q, %d unknown %q",
			len(want), len(never), len(missing), head(missing), len(twice), head(twice), len(banned), head(banned), len(unknown), head(unknown))
	}
	return end
}

// txnLoad is what the producers of a test wrote.
type txnLoad struct {
	mu        sync.Mutex
	committed []string
	aborted   []string
}

func (l *txnLoad) add(commit bool, recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		if commit {
			l.committed = append(l.committed, string(r.Value))
		} else {
			l.aborted = append(l.aborted, string(r.Value))
		}
	}
}

// txnProducer is a franz-go transactional producer of id, straight to the
// broker, writing to the partitions its records name.
func txnProducer(t *testing.T, cl *testsupport.Cluster, id string) *kgo.Client {
	t.Helper()
	return testsupport.NewProducer(t, []string{cl.Upstream}, kgo.TransactionalID(id),
		kgo.TransactionTimeout(time.Minute))
}

// transaction writes recs in one transaction of kc and commits or aborts
// it.
func transaction(kc *kgo.Client, recs []*kgo.Record, commit bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kc.BeginTransaction(); err != nil {
		return err
	}
	if err := kc.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		_ = kc.EndTransaction(ctx, kgo.TryAbort)
		return err
	}
	end := kgo.TryAbort
	if commit {
		end = kgo.TryCommit
	}
	return kc.EndTransaction(ctx, end)
}

// records are n records per partition of topic with values "name/i/p".
func records(topic, name string, parts, n int) []*kgo.Record {
	var out []*kgo.Record
	for p := range parts {
		for i := range n {
			out = append(out, &kgo.Record{Topic: topic, Partition: int32(p), Value: fmt.Appendf(nil, "%s/%d/%d", name, i, p)})
		}
	}
	return out
}

// produceMixed runs two transactional producers (one transaction in three
// aborted) and a plain one at once, interleaved on every partition.
func produceMixed(t *testing.T, cl *testsupport.Cluster, topic string, parts, txns int, load *txnLoad) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, name := range []string{"A", "B"} {
		kc := txnProducer(t, cl, testsupport.Name(t, "txn-"+name))
		wg.Go(func() {
			for i := range txns {
				recs := records(topic, fmt.Sprintf("%s-%d", name, i), parts, 3)
				commit := i%3 != 1
				if err := transaction(kc, recs, commit); err != nil {
					errs <- fmt.Errorf("producer %s, transaction %d: %w", name, i, err)
					return
				}
				load.add(commit, recs)
			}
		})
	}
	plain := testsupport.NewProducer(t, []string{cl.Upstream})
	wg.Go(func() {
		for i := range txns {
			recs := records(topic, fmt.Sprintf("plain-%d", i), parts, 1)
			if err := testsupport.ProduceSync(plain, recs); err != nil {
				errs <- fmt.Errorf("plain producer, round %d: %w", i, err)
				return
			}
			load.add(true, recs)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// waitCommittedAtEnd waits until Kafka's commits of the group equal the
// log end of every partition: past the last marker.
func waitCommittedAtEnd(t *testing.T, cl *testsupport.Cluster, group, topic string, parts int) map[int]int64 {
	t.Helper()
	_, end := cl.Bounds(t, topic, parts)
	testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("the commits of %s to reach the log end %v", group, end), func() bool {
		got, err := cl.TryCommitted(group, topic, parts)
		return err == nil && testsupport.EqualOffsets(got, end)
	})
	return end
}

func TestReadCommitted(t *testing.T) {
	const parts, txns = 4, 30
	for _, mode := range []struct {
		name string
		set  func(*framework.Config, *valueCounter)
	}{
		{"OrderPartition", func(*framework.Config, *valueCounter) {}},
		{"OrderKey", func(c *framework.Config, _ *valueCounter) { c.Ordering = framework.OrderKey }},
		{"OrderNone", func(c *framework.Config, _ *valueCounter) { c.Ordering = framework.OrderNone }},
		{"BatchHandler", func(c *framework.Config, v *valueCounter) { c.Handler, c.BatchHandler = nil, v }},
	} {
		t.Run(mode.name, func(t *testing.T) {
			cl := testsupport.Start(t)
			topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
			cl.CreateTopic(t, topic, parts)
			v := &valueCounter{}
			cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), v)
			cfg.IsolationLevel = kafka.ReadCommitted
			mode.set(&cfg, v)
			r := frameworktest.Start(t, cfg)

			// A transaction opened first and held open: everything after
			// its records waits for it, on every partition.
			open := txnProducer(t, cl, testsupport.Name(t, "txn-open"))
			if err := open.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			held := records(topic, "open", parts, 1)
			if err := testsupport.ProduceSync(open, held); err != nil {
				t.Fatal(err)
			}
			load := &txnLoad{}
			produceMixed(t, cl, topic, parts, txns, load)

			// Every partition is held at the open transaction's first
			// offset, and says so.
			testsupport.WaitFor(t, 30*time.Second, "every partition to be held at the LSO by the open transaction", func() bool {
				s := r.C.Stats()
				n := 0
				for _, p := range s.Partitions {
					if p.TransactionWait > 0 && p.Processed == p.LastStable && p.LastStable < p.HighWatermark && p.Lag == 0 {
						n++
					}
				}
				return n == parts
			})
			time.Sleep(time.Second)
			for _, p := range r.C.Stats().Partitions {
				if p.TransactionWait < time.Second {
					t.Errorf("partition %d: TransactionWait %v after a second held, want >= 1s", p.Partition, p.TransactionWait)
				}
			}
			for _, rec := range held {
				if n := v.times(string(rec.Value)); n > 0 {
					t.Fatalf("%s, of the open transaction, handled %d times before its commit", rec.Value, n)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := open.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatalf("committing the open transaction: %v", err)
			}
			load.add(true, held)

			end := v.exactlyOnce(t, cl, group, topic, parts, load.committed, load.aborted, time.Minute)
			var dropped uint64
			for _, p := range r.C.Stats().Partitions {
				dropped += p.Aborted
				if p.TransactionWait != 0 || p.LastStable != end[p.Partition] || p.Lag != 0 {
					t.Errorf("partition %d after the end: TransactionWait %v, LastStable %d (log end %d), Lag %d; want 0, the log end, 0",
						p.Partition, p.TransactionWait, p.LastStable, end[p.Partition], p.Lag)
				}
			}
			if dropped < uint64(len(load.aborted)) {
				t.Errorf("Stats count %d aborted records dropped, want at least the %d written", dropped, len(load.aborted))
			}
			t.Logf("%d committed records handled once each, %d aborted dropped (Stats: %d), commits at the log end %v",
				len(load.committed), len(load.aborted), dropped, end)
		})
	}
}

// ReadUncommitted, the default, keeps what tidemark always did: every
// record is handled, those of aborted transactions too, and only the
// markers are left out.
func TestReadUncommittedHandsOutAbortedRecords(t *testing.T) {
	const parts, txns = 4, 15
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	load := &txnLoad{}
	produceMixed(t, cl, topic, parts, txns, load)
	v := &valueCounter{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), v))
	all := append(append([]string{}, load.committed...), load.aborted...)
	end := v.exactlyOnce(t, cl, group, topic, parts, all, nil, time.Minute)
	for _, p := range r.C.Stats().Partitions {
		if p.LastStable != -1 || p.Aborted != 0 {
			t.Errorf("partition %d at ReadUncommitted: LastStable %d, Aborted %d; want -1, 0", p.Partition, p.LastStable, p.Aborted)
		}
	}
	t.Logf("%d records (%d of aborted transactions) handled once each; commits at the log end %v", len(all), len(load.aborted), end)
}

// StartOffset kafka.LastOffset at ReadCommitted starts at the last stable
// offset, not the log end: the records of a transaction open at the start
// are handled once it commits, not skipped.
func TestReadCommittedStartsAtTheLastStableOffset(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)
	plain := testsupport.NewProducer(t, []string{cl.Upstream})
	before := records(topic, "before", 1, 5)
	if err := testsupport.ProduceSync(plain, before); err != nil {
		t.Fatal(err)
	}
	open := txnProducer(t, cl, testsupport.Name(t, "txn-open"))
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	held := records(topic, "open", 1, 3)
	if err := testsupport.ProduceSync(open, held); err != nil {
		t.Fatal(err)
	}
	v := &valueCounter{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), v)
	cfg.IsolationLevel, cfg.StartOffset = kafka.ReadCommitted, kafka.LastOffset
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the partition to start at the LSO, 5, held by the open transaction", func() bool {
		ps := r.C.Stats().Partitions
		return len(ps) == 1 && ps[0].Processed == 5 && ps[0].LastStable == 5 && ps[0].TransactionWait > 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := open.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	want := []string{}
	for _, rec := range held {
		want = append(want, string(rec.Value))
	}
	never := []string{}
	for _, rec := range before {
		never = append(never, string(rec.Value))
	}
	v.exactlyOnce(t, cl, group, topic, 1, want, never, 30*time.Second)
}

// javaTool runs one of Kafka's Java tools (scripts/kafka-local tool) to
// the end, or skips the test without a broker of kafka-local's.
func javaTool(t *testing.T, timeout time.Duration, class string, args ...string) string {
	t.Helper()
	script := os.Getenv("TIDEMARK_KAFKA_LOCAL")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, script, append([]string{"tool", "org.apache.kafka.tools." + class}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", class, strings.Join(args, " "), err, testsupport.Tail(string(out), 30))
	}
	return string(out)
}

// realKafkaTools returns the real broker's address, or skips the test.
func realKafkaTools(t *testing.T, cl *testsupport.Cluster) string {
	t.Helper()
	if !cl.Real || os.Getenv("TIDEMARK_KAFKA_LOCAL") == "" {
		t.Skip("needs Apache Kafka and its tools: scripts/kafka-local run -- go test -run " + t.Name() + " .")
	}
	return strings.Join(strings.Split(os.Getenv(testsupport.EnvBrokers), ","), ",")
}

// Kafka's own TransactionalMessageCopier, aborting transactions at random,
// copies four partitions into the consumed topic while tidemark reads it
// at ReadCommitted: each input value is handled exactly once, though the
// topic holds the aborted copies too.
func TestReadCommittedTransactionalMessageCopier(t *testing.T) {
	const parts, perPart = 4, 2500
	cl := testsupport.Start(t)
	brokers := realKafkaTools(t, cl)
	in, out, group := testsupport.Name(t, "in"), testsupport.Name(t, "out"), testsupport.Name(t, "g")
	cl.CreateTopic(t, in, parts)
	cl.CreateTopic(t, out, parts)
	cl.Produce(t, in, parts, 0, perPart)
	v := &valueCounter{}
	cfg := frameworktest.Config(t, cl.Brokers, group, out, filepath.Join(t.TempDir(), "offsets.db"), v)
	cfg.IsolationLevel = kafka.ReadCommitted
	r := frameworktest.Start(t, cfg)

	var wg sync.WaitGroup
	for p := range parts {
		wg.Go(func() {
			javaTool(t, 5*time.Minute, "TransactionalMessageCopier", "--broker-list", brokers,
				"--input-topic", in, "--input-partition", fmt.Sprint(p), "--output-topic", out,
				"--transactional-id", testsupport.Name(t, fmt.Sprintf("copier-%d", p)), "--consumer-group", testsupport.Name(t, "copier"),
				"--transaction-size", "50", "--enable-random-aborts", "--max-messages", fmt.Sprint(perPart))
		})
	}
	wg.Wait()
	var want []string
	for p := range parts {
		for i := range perPart {
			want = append(want, string(testsupport.Value(p, i)))
		}
	}
	end := v.exactlyOnce(t, cl, group, out, parts, want, nil, 2*time.Minute)
	var aborted uint64
	var logged int64
	for _, p := range r.C.Stats().Partitions {
		aborted += p.Aborted
		logged += end[p.Partition]
	}
	handlings, _ := v.total()
	t.Logf("%d values copied into %d offsets (markers and aborted copies included): %d handled once each (%d Handler calls), %d aborted records dropped; commits at the log end %v",
		len(want), logged, len(want), handlings, aborted, end)
}

// Kafka's ProducerPerformance in transactions (all committed) while
// tidemark reads at ReadCommitted: every record handled once, by offset.
func TestReadCommittedProducerPerformance(t *testing.T) {
	const parts, n = 4, 20000
	cl := testsupport.Start(t)
	brokers := realKafkaTools(t, cl)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	v := &valueCounter{key: func(m kafka.Message) string { return fmt.Sprintf("%d@%d", m.Partition, m.Offset) }}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), v)
	cfg.IsolationLevel = kafka.ReadCommitted
	frameworktest.Start(t, cfg)
	javaTool(t, 5*time.Minute, "ProducerPerformance", "--topic", topic, "--num-records", fmt.Sprint(n), "--record-size", "100",
		"--throughput", "-1", "--transactional-id", testsupport.Name(t, "perf"), "--transaction-duration-ms", "200",
		"--producer-props", "bootstrap.servers="+brokers)
	testsupport.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d records to be handled", n), func() bool {
		_, keys := v.total()
		return keys >= n
	})
	end := waitCommittedAtEnd(t, cl, group, topic, parts)
	handlings, keys := v.total()
	if handlings != n || keys != n {
		t.Fatalf("%d Handler calls for %d distinct offsets, want %d of each", handlings, keys, n)
	}
	t.Logf("%d transactional records handled once each; commits at the log end %v (markers included)", n, end)
}
