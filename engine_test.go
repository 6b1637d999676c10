package tidemark_test

// End-to-end tests of the fetch engine: partition leaders moving between
// brokers, compressed batches, a message larger than FetchMaxBytes,
// partitions added while consuming, memory and connections with 1,000
// partitions, and the fetch rate of idle partitions.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// Partition leaders move between the three brokers of a cluster several
// times while one consumer reads a topic that is still being written. Every
// offset is handled exactly once, and the committed offsets reach the log
// ends.
func TestLeadersMove(t *testing.T) {
	if testsupport.Real() {
		t.Skip("moves leaders with kfake's controls: the real-broker variant needs a 3-node cluster")
	}
	const brokers, moves = 3, 6
	// The log is written in moves+1 phases of 300 messages per partition,
	// in rounds of 100: phase i only after move i.
	const parts, phase, round = 6, 300, 100
	const perPart = (moves + 1) * phase
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	fake, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.GroupMinSessionTimeout(time.Second),
		kfake.SeedTopics(parts, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	addrs := fake.ListenAddrs()

	// kafka-go's Writer loses records when leaders move (notes §9); kgo's
	// idempotent producer writes each exactly once and in order, so the
	// message at offset o of partition p is testsupport.Value(p, o).
	kc := newProducer(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	phases := make(chan int, moves+1)
	endPhases := sync.OnceFunc(func() { close(phases) })
	defer endPhases() // the producer ends if the test fails first
	produced := make(chan error, 1)
	go func() {
		for ph := range phases {
			for first := ph * phase; first < (ph+1)*phase; first += round {
				var recs []*kgo.Record
				for p := 0; p < parts; p++ {
					recs = append(recs, valueRecords(topic, p, first, round)...)
				}
				if err := kc.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					produced <- fmt.Errorf("producing offsets %d..%d: %w", first, first+round, err)
					return
				}
			}
		}
		produced <- nil
	}()
	phases <- 0

	rec := newRecorder()
	rec.before = func(context.Context, kafka.Message) error {
		time.Sleep(time.Millisecond) // a phase lasts 300 ms: moves land in its middle
		return nil
	}
	cfg := baseConfig(t, &testsupport.Cluster{Brokers: addrs}, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := startConsumer(t, cfg)

	// Move every partition to the next broker halfway through each phase,
	// while the consumer works through it, then write the next phase:
	// every partition must find its new leader to get past the move.
	var past []time.Duration
	for i := 1; i <= moves; i++ {
		want := ((i-1)*phase + phase/2) * parts
		waitFor(t, 30*time.Second, fmt.Sprintf("%d messages handled before move %d", want, i),
			func() bool { return rec.count() >= want })
		for p := int32(0); p < parts; p++ {
			next := (fake.LeaderFor(topic, p) + 1) % brokers
			if err := fake.MoveTopicPartition(topic, p, next); err != nil {
				t.Fatalf("move %d of %s/%d to broker %d: %v", i, topic, p, next, err)
			}
		}
		moved, handled := time.Now(), rec.count()
		phases <- i
		waitFor(t, 30*time.Second, fmt.Sprintf("every partition past move %d (offset %d)", i, i*phase), func() bool {
			n := 0
			for _, p := range r.c.Stats().Partitions {
				if p.Processed > int64(i*phase) {
					n++
				}
			}
			return n == parts
		})
		past = append(past, time.Since(moved).Round(time.Millisecond))
		t.Logf("move %d: every leader moved with %d of %d messages handled; every partition past it after %s",
			i, handled, parts*perPart, past[i-1])
	}
	endPhases()
	select {
	case err := <-produced:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("producing did not finish within 2 minutes")
	}
	ends := logEnds(t, addrs, topic, parts)
	if want := offsets(parts, perPart); !equalOffsets(ends, want) {
		t.Fatalf("log ends %v after producing, want %v: the producer lost or repeated records", ends, want)
	}

	waitFor(t, 30*time.Second, "every message handled", func() bool { return rec.count() == parts*perPart })
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	committer := &kafka.Client{Addr: kafka.TCP(addrs...), Transport: tr, Timeout: 10 * time.Second}
	var committed map[int]int64
	waitFor(t, 15*time.Second, "committed offsets at the log ends", func() bool {
		committed, err = committedOffsets(committer, group, topic, parts)
		return err == nil && equalOffsets(committed, ends)
	})
	r.stop(t)
	lost, dups := rec.check(parts, offsets(parts, 0), ends)
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d messages lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if bad := rec.badValues(); len(bad) > 0 {
		t.Fatalf("%d messages with the wrong payload: %v", len(bad), head(bad))
	}
	t.Logf("%d messages over %d leader moves on %d brokers: none lost, none twice, committed %v; every partition past each move after %v",
		parts*perPart, moves, brokers, committed, past)
}

// Batches compressed with each codec Kafka knows, one codec per partition,
// several records per batch, reach the Handler byte for byte: keys, values
// and headers.
func TestCompressionCodecs(t *testing.T) {
	codecs := []struct {
		name  string
		codec kgo.CompressionCodec
		attr  int8 // the codec's number in a record batch's attributes
	}{
		{"gzip", kgo.GzipCompression(), 1},
		{"snappy", kgo.SnappyCompression(), 2},
		{"lz4", kgo.Lz4Compression(), 3},
		{"zstd", kgo.ZstdCompression(), 4},
	}
	const batches, perBatch = 3, 40
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, len(codecs))
	batchesSeen := watchBatches(cl)

	// want[p] lists partition p's records in the order produced: offset
	// order, since one idempotent producer writes each partition.
	want := make([][]*kgo.Record, len(codecs))
	rnd := rand.New(rand.NewSource(1))
	for p, c := range codecs {
		// The linger gathers each ProduceSync's records into one batch.
		kc := newProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(c.codec), kgo.ProducerLinger(50*time.Millisecond))
		for b := 0; b < batches; b++ {
			var recs []*kgo.Record
			for i := 0; i < perBatch; i++ {
				recs = append(recs, codecRecord(topic, p, c.name, b*perBatch+i, rnd))
			}
			if err := produceSync(kc, recs); err != nil {
				t.Fatalf("producing %s batch %d to %s/%d: %v", c.name, b, topic, p, err)
			}
			want[p] = append(want[p], recs...)
		}
		kc.Close()
	}

	if batchesSeen != nil {
		// On kfake, check that the producer did what the test relies on.
		for p, c := range codecs {
			bs := batchesSeen()[int32(p)]
			most := 0
			for _, b := range bs {
				if b.codec != c.attr {
					t.Fatalf("partition %d got a batch with codec %d, want %s (%d)", p, b.codec, c.name, c.attr)
				}
				most = max(most, b.records)
			}
			if most < 2 {
				t.Fatalf("%s (partition %d): %d batches of at most %d record(s), want several records per batch", c.name, p, len(bs), most)
			}
			t.Logf("%s (partition %d): %d batches produced, of up to %d records", c.name, p, len(bs), most)
		}
	}

	var mu sync.Mutex
	got := make([][]kafka.Message, len(codecs))
	h := handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got[m.Partition] = append(got[m.Partition], m)
		return nil
	})
	total := batches * perBatch * len(codecs)
	r := startConsumer(t, baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), h))
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ms := range got {
			n += len(ms)
		}
		return n
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("%d compressed messages handled", total), func() bool { return count() >= total })
	// Anything beyond total would be a duplicate: wait until the watermarks
	// reach the log ends, so that nothing more is on its way.
	waitFor(t, 15*time.Second, "watermarks at the log ends", func() bool {
		st := r.c.Stats()
		n := 0
		for _, p := range st.Partitions {
			if p.Processed == batches*perBatch {
				n++
			}
		}
		return n == len(codecs)
	})
	r.stop(t)

	mu.Lock()
	defer mu.Unlock()
	for p, c := range codecs {
		if len(got[p]) != len(want[p]) {
			t.Errorf("%s (partition %d): handled %d messages, want %d", c.name, p, len(got[p]), len(want[p]))
			continue
		}
		for i, m := range got[p] {
			if diff := recordDiff(want[p][i], m); diff != "" {
				t.Errorf("%s (partition %d) message %d at offset %d: %s", c.name, p, i, m.Offset, diff)
			}
			if m.Offset != int64(i) {
				t.Errorf("%s (partition %d): message %d has offset %d, want %d", c.name, p, i, m.Offset, i)
			}
		}
	}
}

// With FetchMaxBytes 64 KiB, a 900 KiB message (the real broker's default
// max.message.bytes is about 1 MiB) among small ones is still fetched:
// everything is handled in order, nothing lost.
func TestMessageLargerThanFetchSize(t *testing.T) {
	const big = 900 << 10
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	createTopic(t, cl, topic, 1, map[string]string{"max.message.bytes": strconv.Itoa(2 << 20)})

	// Small batches around two big messages, each big one in a batch of its
	// own; uncompressed, so the batch on the wire is as large as the value.
	kc := newProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(kgo.NoCompression()))
	rnd := rand.New(rand.NewSource(2))
	var want [][]byte
	produce := func(n, size int) {
		t.Helper()
		var recs []*kgo.Record
		for i := 0; i < n; i++ {
			v := make([]byte, size)
			rnd.Read(v)
			recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Key: fmt.Appendf(nil, "k%d", len(want)), Value: v})
			want = append(want, v)
		}
		if err := produceSync(kc, recs); err != nil {
			t.Fatalf("producing %d messages of %d bytes: %v", n, size, err)
		}
	}
	produce(50, 100)
	produce(1, big)
	produce(50, 100)
	produce(1, big)
	produce(20, 100)
	kc.Close()

	var mu sync.Mutex
	var got []kafka.Message
	h := handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, m)
		return nil
	})
	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), h)
	cfg.FetchMaxBytes = 64 << 10
	r := startConsumer(t, cfg)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("%d messages handled, two of them of %d bytes", len(want), big),
		func() bool { return count() >= len(want) })
	waitFor(t, 15*time.Second, "the watermark at the log end", func() bool {
		ps := r.c.Stats().Partitions
		return len(ps) == 1 && ps[0].Processed == int64(len(want))
	})
	r.stop(t)

	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("handled %d messages, want %d", len(got), len(want))
	}
	for i, m := range got {
		if m.Offset != int64(i) {
			t.Fatalf("message %d has offset %d, want %d: out of order or lost", i, m.Offset, i)
		}
		if !bytes.Equal(m.Value, want[i]) {
			t.Fatalf("message at offset %d: value of %d bytes differs from the %d bytes produced", i, len(m.Value), len(want[i]))
		}
	}
}

// Partitions added to a consumed topic are picked up without restarting the
// consumer, and the partitions it already had are not handled again. This
// needs kafka-go's WatchPartitionChanges (a metadata poll, 5 s by default)
// or an equivalent in the engine.
func TestPartitionsAddedAtRuntime(t *testing.T) {
	const before, after, perPart = 2, 4, 100
	cl, topic := newTopic(t, before, perPart)
	group := testsupport.Name(t, "g")
	rec := newRecorder()
	r := startConsumer(t, baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	waitFor(t, 30*time.Second, "the first partitions handled", func() bool { return rec.count() == before*perPart })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Client().CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: after}},
	})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("adding partitions to %s: %v", topic, err)
	}
	waitLeaders(t, cl, topic, after)
	added := time.Now()
	kc := newProducer(t, []string{cl.Upstream})
	var recs []*kgo.Record
	for p := 0; p < after; p++ {
		first := 0
		if p < before {
			first = perPart
		}
		recs = append(recs, valueRecords(topic, p, first, perPart)...)
	}
	if err := produceSync(kc, recs); err != nil {
		t.Fatalf("producing to %s after adding partitions: %v", topic, err)
	}
	kc.Close()

	ends := map[int]int64{0: 2 * perPart, 1: 2 * perPart, 2: perPart, 3: perPart}
	total := 0
	for _, e := range ends {
		total += int(e)
	}
	defer func() {
		if t.Failed() {
			t.Logf("%d of %d messages handled; stats:\n%s", rec.count(), total, statsString(r.c.Stats()))
		}
	}()
	waitFor(t, 60*time.Second, fmt.Sprintf("the %d added partitions handled without a restart", after-before),
		func() bool { return rec.count() == total })
	t.Logf("added partitions handled %s after they were created", time.Since(added).Round(time.Millisecond))
	waitFor(t, 15*time.Second, "committed offsets at the log ends", func() bool {
		c, err := cl.TryCommitted(group, topic, after)
		return err == nil && equalOffsets(c, ends)
	})
	r.stop(t)
	lost, dups := rec.check(after, offsets(after, 0), ends)
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d messages lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if bad := rec.badValues(); len(bad) > 0 {
		t.Fatalf("%d messages with the wrong payload: %v", len(bad), head(bad))
	}
}

// A backlog on 1,000 partitions is consumed with bounded memory and a
// bounded number of connections: the fetched but unhandled bytes stay
// within MaxBufferedBytes (plus one batch), and the consumer's own file
// descriptors stay at 50 or fewer.
func TestThousandPartitionsStayBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 partitions: not under -short")
	}
	const parts, perPart, size = 1000, 20, 1 << 10
	const budget = 4 << 20
	// The engine admits a fetch while the buffer is under the budget, and a
	// broker returns at least the first record batch of a partition even
	// when it is larger than what the fetch asked for (KIP-74). With one
	// broker (one fetch in flight), the buffer may so pass the budget by one
	// batch at most: the broker's default max.message.bytes, 1,048,588.
	const slack = 1048588
	// The consumer's own descriptors: sockets to the brokers, the offset
	// file, the inspect socket.
	const maxFDs = 50

	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	// Uncompressed: the budget counts fetched bytes as the broker sends
	// them, and a compressed backlog of padded values would fit in it whole.
	kc := newProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(kgo.NoCompression()))
	var recs []*kgo.Record
	for p := 0; p < parts; p++ {
		for o := 0; o < perPart; o++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(p), Value: paddedValue(p, o, size)})
		}
	}
	if err := produceSync(kc, recs); err != nil {
		t.Fatalf("producing the backlog: %v", err)
	}
	kc.Close()

	rec := newRecorder()
	// Handling waits at the gate at first, so that the buffer fills.
	gate := make(chan struct{})
	h := handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		if want := paddedValue(m.Partition, int(m.Offset), size); !bytes.Equal(m.Value, want) {
			rec.mu.Lock()
			rec.bad = append(rec.bad, fmt.Sprintf("%d@%d: value %.20q..., want %.20q...", m.Partition, m.Offset, m.Value, want))
			rec.mu.Unlock()
		}
		return countOnly{rec}.Handle(ctx, m)
	})
	// Straight to the broker, not through the fault proxy, so that each
	// connection of the consumer is one socket to the broker.
	cfg := baseConfig(t, &testsupport.Cluster{Brokers: []string{cl.Upstream}}, group, topic, filepath.Join(t.TempDir(), "o.db"), h)
	cfg.FetchMaxWait, cfg.FetchMaxBytes = 0, 0 // the defaults
	cfg.MaxBufferedBytes = budget

	fds := newFDCounter(t, cl)
	var base, baseAll int
	if fds != nil {
		var err error
		if base, baseAll, err = fds.count(); err != nil {
			t.Fatal(err)
		}
	}
	r := startConsumer(t, cfg)

	var (
		mu                 sync.Mutex
		maxBuf, maxPartBuf int64
		maxFD, maxAll      int
		samples, fdCount   int
		overBudget         string
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	stopSampling := sync.OnceFunc(func() { close(done); wg.Wait() })
	defer stopSampling()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			st := r.c.Stats()
			var part int64
			for _, p := range st.Partitions {
				part = max(part, p.BufferedBytes)
			}
			fd, all := -1, -1
			if fds != nil && i%5 == 0 {
				if own, n, err := fds.count(); err == nil {
					fd, all = own-base, n-baseAll
				}
			}
			mu.Lock()
			samples++
			maxPartBuf = max(maxPartBuf, part)
			if st.BufferedBytes > maxBuf {
				maxBuf = st.BufferedBytes
				if maxBuf > budget+slack && overBudget == "" {
					overBudget = fmt.Sprintf("%d buffered bytes with %d handled", maxBuf, rec.count())
				}
			}
			if fd >= 0 {
				fdCount++
				maxFD, maxAll = max(maxFD, fd), max(maxAll, all)
			}
			mu.Unlock()
		}
	}()

	// With handling held, a bounded engine fills at least half its budget
	// and stops there; an unbounded one goes on towards the 20 MiB backlog.
	// Hold it a little longer to give the latter the time to show.
	filled := time.Now().Add(10 * time.Second)
	for r.c.Stats().BufferedBytes < budget/2 && time.Now().Before(filled) {
		time.Sleep(20 * time.Millisecond)
	}
	if b := r.c.Stats().BufferedBytes; b < budget/2 {
		t.Errorf("Stats.BufferedBytes %d after 10s with handling held and a 20 MiB backlog, want at least half the budget (%d)", b, budget/2)
	} else {
		time.Sleep(500 * time.Millisecond) // a measurement window, not a wait for a condition
	}
	close(gate)
	waitFor(t, 90*time.Second, fmt.Sprintf("%d messages handled", parts*perPart), func() bool { return rec.count() == parts*perPart })
	stopSampling()
	r.stop(t)

	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Errorf("%d messages lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if bad := rec.badValues(); len(bad) > 0 {
		t.Errorf("%d messages with the wrong payload: %v", len(bad), head(bad))
	}
	t.Logf("%d samples: at most %d buffered bytes (budget %d + slack %d), %d in one partition; at most %d fds of the consumer's own (%d in all, an in-process broker's included) over %d samples",
		samples, maxBuf, budget, slack, maxPartBuf, maxFD, maxAll, fdCount)
	if overBudget != "" {
		t.Errorf("Stats.BufferedBytes above MaxBufferedBytes %d + one batch %d: %s", budget, slack, overBudget)
	}
	if maxPartBuf == 0 {
		t.Errorf("PartitionStats.BufferedBytes stayed 0 in every partition over %d samples of a 20 MiB backlog: not reported", samples)
	}
	if fds == nil {
		t.Log("no /proc/self/fd: file descriptors not checked")
	} else if maxFD > maxFDs {
		t.Errorf("the consumer held up to %d file descriptors of its own, want at most %d (sockets to the brokers: one per connection, not per partition)", maxFD, maxFDs)
	}
}

// Idle partitions cost few fetch requests: one consumer owning 200 empty
// partitions, with FetchMaxWait 200ms, sends at most 10 fetch requests a
// second to each broker (one fetch per partition would be 1,000 a second),
// and Stats.FetchRequests counts them.
func TestIdleFetchRate(t *testing.T) {
	const parts = 200
	const window = 3 * time.Second
	const perBrokerPerSecond = 10
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	leaders := waitLeaders(t, cl, topic, parts)

	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), newRecorder())
	cfg.FetchMaxWait = 200 * time.Millisecond
	r := startConsumer(t, cfg)
	waitFor(t, 30*time.Second, fmt.Sprintf("all %d partitions running", parts), func() bool {
		n := 0
		for _, p := range r.c.Stats().Partitions {
			if p.State == framework.StateRunning {
				n++
			}
		}
		return n == parts
	})
	// The proxy between the consumer and the broker counts the fetch
	// requests on the wire; Stats.FetchRequests must agree with it.
	from, wireFrom := r.c.Stats().FetchRequests, cl.Proxy.Counts(kmsg.Fetch).Seen
	start := time.Now()
	// A measurement window, not a wait for a condition.
	time.Sleep(window)
	to, wireTo := r.c.Stats().FetchRequests, cl.Proxy.Counts(kmsg.Fetch).Seen
	elapsed := time.Since(start)
	r.stop(t)

	sent, wire := int64(to-from), wireTo-wireFrom
	rate := float64(wire) / elapsed.Seconds()
	t.Logf("%d fetch requests on the wire (%d counted in Stats) in %s to %d broker(s) for %d idle partitions: %.1f/s (limit %d/s per broker)",
		wire, sent, elapsed.Round(time.Millisecond), leaders, parts, rate, perBrokerPerSecond)
	if rate > float64(perBrokerPerSecond*leaders) {
		t.Errorf("%d fetch requests in %s for %d idle partitions on %d broker(s): %.1f/s, want at most %d/s per broker",
			wire, elapsed.Round(time.Millisecond), parts, leaders, rate, perBrokerPerSecond)
	}
	// The two counts differ by the fetches in flight at either end of the
	// window: a couple per broker.
	if slack := 2*int64(leaders) + wire/10; sent < wire-slack || sent > wire+slack {
		t.Errorf("Stats.FetchRequests grew by %d in %s while %d fetch requests reached the broker (tolerance %d)",
			sent, elapsed.Round(time.Millisecond), wire, slack)
	}
}

// newProducer returns a kgo producer to seeds (closed when the test ends)
// that writes each record to the partition it names.
func newProducer(t testing.TB, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	kc, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	if err != nil {
		t.Fatalf("starting a kgo producer: %v", err)
	}
	t.Cleanup(kc.Close)
	return kc
}

// produceSync writes recs within a minute.
func produceSync(kc *kgo.Client, recs []*kgo.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return kc.ProduceSync(ctx, recs...).FirstErr()
}

// valueRecords are n records for partition p numbered from first, with
// testsupport.Value payloads as the recorder expects.
func valueRecords(topic string, p, first, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(p), Key: fmt.Appendf(nil, "k%d", first+i), Value: testsupport.Value(p, first+i)}
	}
	return recs
}

// paddedValue is testsupport.Value(p, o) padded to size bytes.
func paddedValue(p, o, size int) []byte {
	v := testsupport.Value(p, o)
	return append(v, bytes.Repeat([]byte{'.'}, size-len(v))...)
}

// codecRecord is the ith record of a codec's partition: its value is
// compressible text or random bytes, its key is missing now and then, and
// its headers vary in number, repeat keys and hold empty values.
func codecRecord(topic string, p int, codec string, i int, rnd *rand.Rand) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: int32(p)}
	if i%7 != 3 {
		r.Key = fmt.Appendf(nil, "%s-key-%d", codec, i)
	}
	switch i % 3 {
	case 0:
		r.Value = bytes.Repeat(fmt.Appendf(nil, "%s message %d; ", codec, i), 1+i%50)
	case 1:
		r.Value = make([]byte, 1+rnd.Intn(4096))
		rnd.Read(r.Value)
	case 2:
		r.Value = fmt.Appendf(nil, "%d", i)
	}
	for h := 0; h < i%4; h++ {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: fmt.Sprintf("h%d", h%2), Value: fmt.Appendf(nil, "%s-%d-%d", codec, i, h)})
	}
	if i%5 == 0 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "empty"})
	}
	return r
}

// recordDiff describes how m differs from the produced record w; "" if
// key, value and headers are byte-identical.
func recordDiff(w *kgo.Record, m kafka.Message) string {
	var d []string
	if !bytes.Equal(w.Key, m.Key) {
		d = append(d, fmt.Sprintf("key %q, want %q", m.Key, w.Key))
	}
	if !bytes.Equal(w.Value, m.Value) {
		d = append(d, fmt.Sprintf("value of %d bytes differs from the %d produced", len(m.Value), len(w.Value)))
	}
	same := len(w.Headers) == len(m.Headers)
	for i := 0; same && i < len(w.Headers); i++ {
		same = w.Headers[i].Key == m.Headers[i].Key && bytes.Equal(w.Headers[i].Value, m.Headers[i].Value)
	}
	if !same {
		d = append(d, fmt.Sprintf("headers %v, want %v", m.Headers, w.Headers))
	}
	return strings.Join(d, "; ")
}

type batchInfo struct {
	codec   int8
	records int
}

// watchBatches records the codec and record count of every batch produced
// on kfake, where the cluster is the test's own and topic its only topic
// (Produce v13 names topics by id); the returned func reads them per
// partition. It returns nil on a real broker.
func watchBatches(cl *testsupport.Cluster) func() map[int32][]batchInfo {
	if cl.Fake == nil {
		return nil
	}
	var mu sync.Mutex
	seen := map[int32][]batchInfo{}
	cl.Fake.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(rp.Records); err != nil {
					continue // kfake answers it as corrupt
				}
				mu.Lock()
				seen[rp.Partition] = append(seen[rp.Partition], batchInfo{codec: int8(b.Attributes & 0x07), records: int(b.NumRecords)})
				mu.Unlock()
			}
		}
		return nil, nil, false // observed only: kfake handles the request
	})
	return func() map[int32][]batchInfo {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[int32][]batchInfo, len(seen))
		for p, bs := range seen {
			out[p] = append([]batchInfo(nil), bs...)
		}
		return out
	}
}

// createTopic creates a topic with configs and waits for its leaders.
func createTopic(t testing.TB, cl *testsupport.Cluster, topic string, parts int, configs map[string]string) {
	t.Helper()
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: parts, ReplicationFactor: 1}
	for k, v := range configs {
		tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Client().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	waitLeaders(t, cl, topic, parts)
}

// waitLeaders waits until topic has parts partitions, each with a leader,
// and returns the number of brokers that lead them.
func waitLeaders(t testing.TB, cl *testsupport.Cluster, topic string, parts int) int {
	t.Helper()
	var leaders map[int]bool
	waitFor(t, 30*time.Second, fmt.Sprintf("%d partitions of %s with leaders", parts, topic), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		md, err := cl.Client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != parts {
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

// logEnds lists the log end offsets of topic with a new kgo client, which
// finds the current leaders and retries a partition whose leader moved.
func logEnds(t testing.TB, seeds []string, topic string, parts int) map[int]int64 {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ends, err := tryLogEnds(kc, topic, parts)
		if err == nil {
			return ends
		}
		if time.Now().After(deadline) {
			t.Fatalf("listing the log ends of %s for 30s: %v", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tryLogEnds(kc *kgo.Client, topic string, parts int) (map[int]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := 0; p < parts; p++ {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = int32(p)
		rp.Timestamp = -1 // the log end
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	ends := map[int]int64{}
	for _, shard := range kc.RequestSharded(ctx, req) {
		if shard.Err != nil {
			return nil, shard.Err
		}
		for _, rt := range shard.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return nil, fmt.Errorf("%s/%d: %w", rt.Topic, rp.Partition, err)
				}
				ends[int(rp.Partition)] = rp.Offset
			}
		}
	}
	if len(ends) != parts {
		return nil, fmt.Errorf("%d partitions in the answer, want %d", len(ends), parts)
	}
	return ends, nil
}

// committedOffsets is the group's committed offset of each partition of
// topic; -1 where none.
func committedOffsets(c *kafka.Client, group, topic string, parts int) (map[int]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids := make([]int, parts)
	out := make(map[int]int64, parts)
	for p := range ids {
		ids[p] = p
		out[p] = -1
	}
	res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, err
	}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, po.Error
		}
		out[po.Partition] = po.CommittedOffset
	}
	return out, nil
}

// fdCounter counts this process's open file descriptors, less the
// server-side sockets of an in-process broker.
//
// On kfake the broker runs in the test process: each connection the
// consumer opens costs two descriptors here, its own socket and the one
// kfake accepted. The counter tells them apart with /proc/net/tcp{,6}: a
// socket whose local port is a broker's listening port is the broker's.
// Where that table cannot be read, it halves the sockets instead. On a
// real broker every socket of the process is a client's.
type fdCounter struct {
	ports map[string]bool // the brokers' ports, as /proc/net/tcp writes them
	fake  bool
}

// newFDCounter returns nil where /proc/self/fd is missing.
func newFDCounter(t testing.TB, cl *testsupport.Cluster) *fdCounter {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		return nil
	}
	c := &fdCounter{ports: map[string]bool{}, fake: cl.Fake != nil}
	if c.fake {
		for _, a := range cl.Fake.ListenAddrs() {
			_, port, err := net.SplitHostPort(a)
			if err != nil {
				t.Fatalf("broker address %q: %v", a, err)
			}
			n, err := strconv.Atoi(port)
			if err != nil {
				t.Fatalf("broker address %q: %v", a, err)
			}
			c.ports[fmt.Sprintf("%04X", n)] = true
		}
	}
	return c
}

// count returns the open descriptors that are not the in-process
// broker's, and all of them.
func (c *fdCounter) count() (own, all int, err error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, 0, fmt.Errorf("reading /proc/self/fd: %w", err)
	}
	if !c.fake {
		return len(ents), len(ents), nil
	}
	server, ok := c.serverInodes()
	n, sockets := 0, 0
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // closed since ReadDir
		}
		if inode, isSock := strings.CutPrefix(link, "socket:["); isSock {
			sockets++
			if ok && server[strings.TrimSuffix(inode, "]")] {
				continue
			}
		}
		n++
	}
	if !ok {
		n -= sockets / 2
	}
	return n, len(ents), nil
}

// serverInodes returns the inodes of the TCP sockets whose local port is a
// broker's: its listeners and the connections it accepted.
func (c *fdCounter) serverInodes() (map[string]bool, bool) {
	out := map[string]bool{}
	read := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		read++
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			if _, port, ok := strings.Cut(fields[1], ":"); ok && c.ports[port] {
				out[fields[9]] = true
			}
		}
		f.Close()
	}
	return out, read > 0
}
