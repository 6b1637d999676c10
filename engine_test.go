package tidemark_test

// The fetch engine and what it reads: partition leaders moving between
// brokers, compressed batches, a message larger than FetchMaxBytes,
// partitions added while consuming, memory and connections with 1,000
// partitions, the fetch rate of idle partitions; record batches as the
// broker may send them (an undecodable record, compacted batches,
// transaction markers); several topics, and one deleted while consumed;
// connections over SASL and TLS.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"math/big"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
	"github.com/tidemark/tidemark/tidemarktest"
)

// Partition leaders move between the three brokers of a cluster several
// times while one consumer reads a topic that is still being written. Every
// offset is handled exactly once, and the committed offsets reach the log
// ends.
func TestLeadersMove(t *testing.T) {
	if testsupport.RealBroker() {
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
	kc := testsupport.NewProducer(t, addrs)
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
					recs = append(recs, testsupport.ValueRecords(topic, p, first, round)...)
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

	rec := &testsupport.Recorder{}
	rec.Before = func(context.Context, kafka.Message) error {
		time.Sleep(time.Millisecond) // a phase lasts 300 ms: moves land in its middle
		return nil
	}
	cfg := frameworktest.Config(t, addrs, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := frameworktest.Start(t, cfg)

	// Move every partition to the next broker halfway through each phase,
	// while the consumer works through it, then write the next phase:
	// every partition must find its new leader to get past the move.
	var past []time.Duration
	for i := 1; i <= moves; i++ {
		want := ((i-1)*phase + phase/2) * parts
		testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("%d messages handled before move %d", want, i),
			func() bool { return rec.Count() >= want })
		for p := int32(0); p < parts; p++ {
			next := (fake.LeaderFor(topic, p) + 1) % brokers
			if err := fake.MoveTopicPartition(topic, p, next); err != nil {
				t.Fatalf("move %d of %s/%d to broker %d: %v", i, topic, p, next, err)
			}
		}
		moved, handled := time.Now(), rec.Count()
		phases <- i
		testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("every partition past move %d (offset %d)", i, i*phase), func() bool {
			n := 0
			for _, p := range r.C.Stats().Partitions {
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
	if want := testsupport.Offsets(parts, perPart); !testsupport.EqualOffsets(ends, want) {
		t.Fatalf("log ends %v after producing, want %v: the producer lost or repeated records", ends, want)
	}

	testsupport.WaitFor(t, 30*time.Second, "every message handled", func() bool { return rec.Count() == parts*perPart })
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	committer := &kafka.Client{Addr: kafka.TCP(addrs...), Transport: tr, Timeout: 10 * time.Second}
	var committed map[int]int64
	testsupport.WaitFor(t, 15*time.Second, "committed offsets at the log ends", func() bool {
		committed, err = committedOffsets(committer, group, topic, parts)
		return err == nil && testsupport.EqualOffsets(committed, ends)
	})
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), ends)
	if bad := rec.BadValues(); len(bad) > 0 {
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
		kc := testsupport.NewProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(c.codec), kgo.ProducerLinger(50*time.Millisecond))
		for b := 0; b < batches; b++ {
			var recs []*kgo.Record
			for i := 0; i < perBatch; i++ {
				recs = append(recs, codecRecord(topic, p, c.name, b*perBatch+i, rnd))
			}
			if err := testsupport.ProduceSync(kc, recs); err != nil {
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
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), h))
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ms := range got {
			n += len(ms)
		}
		return n
	}
	testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("%d compressed messages handled", total), func() bool { return count() >= total })
	// Anything beyond total would be a duplicate: wait until the watermarks
	// reach the log ends, so that nothing more is on its way.
	testsupport.WaitFor(t, 15*time.Second, "watermarks at the log ends", func() bool {
		st := r.C.Stats()
		n := 0
		for _, p := range st.Partitions {
			if p.Processed == batches*perBatch {
				n++
			}
		}
		return n == len(codecs)
	})
	r.Stop(t)

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

// A compressed batch whose records decompress to more than
// MaxBufferedBytes is refused, not held beyond the budget: the messages
// before it are handled, then its partition stalls at its first offset
// with an error naming MaxBufferedBytes, and nothing after it is handled
// or skipped. The other partition goes on. A budget that holds it consumes
// it all.
func TestBatchLargerThanBudget(t *testing.T) {
	const budget = 256 << 10
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopicWith(t, topic, 2, map[string]string{"max.message.bytes": strconv.Itoa(2 << 20)})
	// Zeros: 512 KiB of value compress to about 1 KiB with zstd.
	kc := testsupport.NewProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	produce := func(p int32, n, size int) {
		t.Helper()
		var recs []*kgo.Record
		for i := 0; i < n; i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Value: make([]byte, size)})
		}
		if err := testsupport.ProduceSync(kc, recs); err != nil {
			t.Fatalf("producing %d messages of %d bytes to partition %d: %v", n, size, p, err)
		}
	}
	produce(0, 20, 100)
	produce(0, 1, 512<<10) // offset 20: inflates to twice the budget
	produce(0, 20, 100)
	produce(1, 40, 100)
	kc.Close()

	file := filepath.Join(t.TempDir(), "o.db")
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
	cfg.MaxBufferedBytes = budget
	r := frameworktest.Start(t, cfg)
	var stalled framework.PartitionStats
	testsupport.WaitFor(t, 30*time.Second, "partition 0 stalled and partition 1 handled", func() bool {
		for _, p := range r.C.Stats().Partitions {
			if p.Partition == 0 && p.State == framework.StateStalled {
				stalled = p
			}
		}
		return stalled.State == framework.StateStalled && rec.Count() == 20+40
	})
	r.Stop(t)
	if stalled.Processed != 20 {
		t.Errorf("partition 0 stalled at %d, want 20 (the large batch's offset)", stalled.Processed)
	}
	for _, want := range []string{"offset 20", "MaxBufferedBytes", strconv.Itoa(budget)} {
		if !strings.Contains(stalled.LastError, want) {
			t.Errorf("the stall's error %q does not say %q", stalled.LastError, want)
		}
	}
	testsupport.ExactlyOnce(t, rec, map[int]int64{0: 0, 1: 0}, map[int]int64{0: 20, 1: 40})

	// A budget that holds the batch resumes at it: the rest, once each.
	rec2 := &testsupport.Recorder{}
	cfg = frameworktest.Config(t, cl.Brokers, group, topic, file, rec2)
	cfg.MaxBufferedBytes = 4 << 20
	r = frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the rest of partition 0", func() bool { return rec2.Count() == 21 })
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec2, map[int]int64{0: 20, 1: 40}, map[int]int64{0: 41, 1: 40})
}

// With FetchMaxBytes 64 KiB, a 900 KiB message (the real broker's default
// max.message.bytes is about 1 MiB) among small ones is still fetched:
// everything is handled in order, nothing lost.
func TestMessageLargerThanFetchSize(t *testing.T) {
	const big = 900 << 10
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopicWith(t, topic, 1, map[string]string{"max.message.bytes": strconv.Itoa(2 << 20)})

	// Small batches around two big messages, each big one in a batch of its
	// own; uncompressed, so the batch on the wire is as large as the value.
	kc := testsupport.NewProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(kgo.NoCompression()))
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
		if err := testsupport.ProduceSync(kc, recs); err != nil {
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
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), h)
	cfg.FetchMaxBytes = 64 << 10
	r := frameworktest.Start(t, cfg)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("%d messages handled, two of them of %d bytes", len(want), big),
		func() bool { return count() >= len(want) })
	testsupport.WaitFor(t, 15*time.Second, "the watermark at the log end", func() bool {
		ps := r.C.Stats().Partitions
		return len(ps) == 1 && ps[0].Processed == int64(len(want))
	})
	r.Stop(t)

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
	cl, topic := testsupport.NewTopic(t, before, perPart)
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	testsupport.WaitFor(t, 30*time.Second, "the first partitions handled", func() bool { return rec.Count() == before*perPart })

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
	cl.WaitLeaders(t, topic, after)
	added := time.Now()
	kc := testsupport.NewProducer(t, []string{cl.Upstream})
	var recs []*kgo.Record
	for p := 0; p < after; p++ {
		first := 0
		if p < before {
			first = perPart
		}
		recs = append(recs, testsupport.ValueRecords(topic, p, first, perPart)...)
	}
	if err := testsupport.ProduceSync(kc, recs); err != nil {
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
			t.Logf("%d of %d messages handled; stats:\n%s", rec.Count(), total, frameworktest.StatsString(r.C.Stats()))
		}
	}()
	testsupport.WaitFor(t, 60*time.Second, fmt.Sprintf("the %d added partitions handled without a restart", after-before),
		func() bool { return rec.Count() == total })
	t.Logf("added partitions handled %s after they were created", time.Since(added).Round(time.Millisecond))
	testsupport.WaitFor(t, 15*time.Second, "committed offsets at the log ends", func() bool {
		c, err := cl.TryCommitted(group, topic, after)
		return err == nil && testsupport.EqualOffsets(c, ends)
	})
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(after, 0), ends)
	if bad := rec.BadValues(); len(bad) > 0 {
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
	// The engine reserves each request's MaxBytes out of what the budget has
	// left, and a broker keeps to MaxBytes except that it returns the first
	// record batch of a response even when it is larger (KIP-74): what the
	// documents promise, MaxBufferedBytes plus one record batch, is per
	// fetch in flight, one per broker loop. A batch holds records of one
	// partition: at most perPart records of size bytes, each with at most
	// 32 bytes of record framing (length, attributes, timestamp and offset
	// deltas, key and value lengths, header count: varints), and the
	// 61-byte batch header. (The old slack, the broker's max.message.bytes,
	// 1 MiB, let about 50 of this topic's batches through.)
	const maxBatch = 61 + perPart*(size+32)
	// The consumer's own descriptors: sockets to the brokers, the offset
	// file, the inspect socket.
	const maxFDs = 50

	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	slack := int64(cl.WaitLeaders(t, topic, parts)*testsupport.FetchLanes) * maxBatch // one batch per fetch loop
	// Uncompressed: the budget counts fetched bytes as the broker sends
	// them, and a compressed backlog of padded values would fit in it whole.
	kc := testsupport.NewProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(kgo.NoCompression()))
	var recs []*kgo.Record
	for p := 0; p < parts; p++ {
		for o := 0; o < perPart; o++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(p), Value: paddedValue(p, o, size)})
		}
	}
	if err := testsupport.ProduceSync(kc, recs); err != nil {
		t.Fatalf("producing the backlog: %v", err)
	}
	kc.Close()

	// Handling waits at the gate at first, so that the buffer fills.
	gate := make(chan struct{})
	rec := &testsupport.Recorder{
		Before: func(ctx context.Context, m kafka.Message) error {
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Want: func(p int, o int64) []byte { return paddedValue(p, int(o), size) },
	}
	// Straight to the broker, not through the fault proxy, so that each
	// connection of the consumer is one socket to the broker.
	cfg := frameworktest.Config(t, []string{cl.Upstream}, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
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
	r := frameworktest.Start(t, cfg)

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
			st := r.C.Stats()
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
					overBudget = fmt.Sprintf("%d buffered bytes with %d handled", maxBuf, rec.Count())
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
	for r.C.Stats().BufferedBytes < budget/2 && time.Now().Before(filled) {
		time.Sleep(20 * time.Millisecond)
	}
	if b := r.C.Stats().BufferedBytes; b < budget/2 {
		t.Errorf("Stats.BufferedBytes %d after 10s with handling held and a 20 MiB backlog, want at least half the budget (%d)", b, budget/2)
	} else {
		time.Sleep(500 * time.Millisecond) // a measurement window, not a wait for a condition
	}
	close(gate)
	testsupport.WaitFor(t, 90*time.Second, fmt.Sprintf("%d messages handled", parts*perPart), func() bool { return rec.Count() == parts*perPart })
	stopSampling()
	r.Stop(t)

	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	if bad := rec.BadValues(); len(bad) > 0 {
		t.Errorf("%d messages with the wrong payload: %v", len(bad), head(bad))
	}
	t.Logf("%d samples: at most %d buffered bytes (budget %d + slack %d, one batch per fetch loop), %d in one partition; at most %d fds of the consumer's own (%d in all, an in-process broker's included) over %d samples",
		samples, maxBuf, budget, slack, maxPartBuf, maxFD, maxAll, fdCount)
	if overBudget != "" {
		t.Errorf("Stats.BufferedBytes above MaxBufferedBytes %d + one batch per fetch loop %d: %s", budget, slack, overBudget)
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
	leaders := cl.WaitLeaders(t, topic, parts)

	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), &testsupport.Recorder{})
	cfg.FetchMaxWait = 200 * time.Millisecond
	r := frameworktest.Start(t, cfg)
	frameworktest.WaitRunning(t, r, parts, 30*time.Second)
	// The proxy between the consumer and the broker counts the fetch
	// requests on the wire; Stats.FetchRequests must agree with it.
	from, wireFrom := r.C.Stats().FetchRequests, cl.Proxy.Counts(kmsg.Fetch).Seen
	start := time.Now()
	// A measurement window, not a wait for a condition.
	time.Sleep(window)
	to, wireTo := r.C.Stats().FetchRequests, cl.Proxy.Counts(kmsg.Fetch).Seen
	elapsed := time.Since(start)
	r.Stop(t)

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

// The broker's record batches as the fetcher may meet them. The fault proxy
// rewrites Fetch responses into what a broker sends after compaction, or
// into a record that does not decode, so the next two tests run on kfake
// and on Apache Kafka alike.

// A record that cannot be decoded stops its partition, visibly, at that
// record: nothing after it is handled, the watermark and the commit stay on
// it. (The engine before the fetch-by-broker rewrite dropped the rest of the
// batch and went on with the next one.)
func TestUndecodableRecordStopsPartition(t *testing.T) {
	cl, topic := testsupport.NewTopic(t, 1, 20) // offsets 0..19: one batch
	cl.Produce(t, topic, 1, 20, 20)             // 20..39: a second batch
	cl.Proxy.OnFetch(func(tp string, _ int32, raw []byte) []byte {
		if tp != topic {
			return raw
		}
		return rewriteBatches(raw, func(base, offset int64, rec []byte) []byte {
			if offset != 10 {
				return rec
			}
			// The last byte of a record without headers is its header
			// count, 0; 63 headers run past the record's end.
			bad := append([]byte(nil), rec...)
			bad[len(bad)-1] = 0x7e
			return bad
		})
	})
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	testsupport.WaitFor(t, time.Minute, "the partition stalled", func() bool {
		ps := r.C.Stats().Partitions
		return len(ps) == 1 && ps[0].State == framework.StateStalled
	})
	testsupport.WaitFor(t, 10*time.Second, "the watermark committed", func() bool {
		c, err := cl.TryCommitted(group, topic, 1)
		return err == nil && c[0] == 10
	})
	p := r.C.Stats().Partitions[0]
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 0), testsupport.Offsets(1, 10))
	if n := rec.Count(); n != 10 {
		t.Fatalf("%d messages handled, want the 10 before the bad record and none after it", n)
	}
	if p.Processed != 10 || !strings.Contains(p.LastError, "offset 10") || !strings.Contains(p.LastError, "malformed record") {
		t.Fatalf("stalled partition: processed %d, last error %q; want 10 and a decoding error naming offset 10", p.Processed, p.LastError)
	}
	if c := cl.Committed(t, group, topic, 1); c[0] != 10 {
		t.Fatalf("committed %d after the stall, want 10", c[0])
	}
	t.Logf("stalled: %s", p.LastError)
}

// Compaction keeps a batch's last offset when it removes the batch's last
// records, and an idempotent producer's batch stays, empty, when all of its
// records are removed. The watermark, lag and commit must reach the log end
// over both. (The engine before the rewrite read batches through kafka-go,
// which drops the last offset delta, and stopped short forever.)
func TestCompactedBatchesReachLogEnd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		drop    func(base, offset int64) bool
		handled int // of 0..14
	}{
		// 0..9 in one batch whose last two records were compacted away.
		{"last records removed", func(base, offset int64) bool { return base == 0 && offset >= 8 }, 8 + 5},
		// 10..14 in a batch left empty.
		{"empty batch at the tail", func(base, offset int64) bool { return base == 10 }, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, topic := testsupport.NewTopic(t, 1, 10)
			cl.Produce(t, topic, 1, 10, 5)
			cl.Proxy.OnFetch(func(tp string, _ int32, raw []byte) []byte {
				if tp != topic {
					return raw
				}
				return rewriteBatches(raw, func(base, offset int64, rec []byte) []byte {
					if tc.drop(base, offset) {
						return nil
					}
					return rec
				})
			})
			group := testsupport.Name(t, "g")
			rec := &testsupport.Recorder{}
			cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
			cfg.FetchMaxBytes = 1 // one batch a response: the rewritten one comes alone
			r := frameworktest.Start(t, cfg)
			testsupport.WaitFor(t, 30*time.Second, "the watermark at the log end", func() bool {
				ps := r.C.Stats().Partitions
				return len(ps) == 1 && ps[0].Processed == 15 && ps[0].Lag == 0
			})
			testsupport.WaitFor(t, 10*time.Second, "the commit at the log end", func() bool {
				c, err := cl.TryCommitted(group, topic, 1)
				return err == nil && c[0] == 15
			})
			r.Stop(t)
			if n := rec.Count(); n != tc.handled {
				t.Fatalf("%d messages handled, want %d", n, tc.handled)
			}
		})
	}
}

// The same on a real log cleaner: an idempotent producer's last batch stays,
// empty, after compaction removed its only record, and comes alone in a
// fetch when the batch after it is larger than the fetch size. On Apache
// Kafka the topic gets small segments and a low dirty ratio (scripts/kafka-
// local sets log.cleaner.backoff.ms=1000); kfake's Compact drops empty
// batches, so there the test only checks that compaction loses nothing.
func TestCompactedTopicReachesLogEnd(t *testing.T) {
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "compact")
	cl.CreateTopicWith(t, topic, 1, map[string]string{
		"cleanup.policy":            "compact",
		"segment.ms":                "100",
		"min.cleanable.dirty.ratio": "0.001",
		"delete.retention.ms":       "0",
		"min.compaction.lag.ms":     "0",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	produce := func(key string, value []byte) int64 {
		t.Helper()
		// A producer of its own for each record: each is the last batch of
		// an idempotent producer, which the cleaner keeps even when empty.
		kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(2<<20))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		r, err := kc.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Value: value}).First()
		if err != nil {
			t.Fatalf("producing %s: %v", key, err)
		}
		return r.Offset
	}
	produce("a", []byte("old"))                            // 0: removed by compaction, its batch kept empty
	produce("a", bytes.Repeat([]byte("n"), 900<<10))       // 1: larger than a fetch asks for
	time.Sleep(300 * time.Millisecond)                     // past segment.ms: the next append rolls the segment
	if end := produce("b", []byte("tail")) + 1; end != 3 { // 2: in the active segment
		t.Fatalf("log end %d, want 3", end)
	}
	if cl.Fake != nil {
		cl.Fake.Compact()
	}
	// Wait for the cleaner: offset 0's record is gone.
	testsupport.WaitFor(t, time.Minute, "the log cleaner to remove offset 0", func() bool {
		kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream), kgo.FetchMaxBytes(4<<20),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(0)}}))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		fs := kc.PollFetches(pctx)
		first := int64(-1)
		fs.EachRecord(func(r *kgo.Record) {
			if first < 0 {
				first = r.Offset
			}
		})
		return first == 1
	})
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{AnyValue: true}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.FetchMaxBytes = 64 << 10
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the watermark at the log end", func() bool {
		ps := r.C.Stats().Partitions
		return len(ps) == 1 && ps[0].Processed == 3 && ps[0].Lag == 0
	})
	testsupport.WaitFor(t, 10*time.Second, "the commit at the log end", func() bool {
		c, err := cl.TryCommitted(group, topic, 1)
		return err == nil && c[0] == 3
	})
	r.Stop(t)
	if n := rec.Count(); n != 2 || rec.Times(0, 1) != 1 || rec.Times(0, 2) != 1 {
		t.Fatalf("handled %d offsets, offset 1 %d times, offset 2 %d times: want offsets 1 and 2 once", n, rec.Times(0, 1), rec.Times(0, 2))
	}
}

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
	testsupport.WaitFor(t, 30*time.Second, "the three commit markers in the log", func() bool {
		_, end = cl.Bounds(t, topic, 1)
		return end[0] == int64(seq)+3
	})

	got := map[int64]string{}
	rec := &testsupport.Recorder{}
	rec.Before = func(_ context.Context, m kafka.Message) error {
		got[m.Offset] = string(m.Value) // one partition: calls are sequential
		return nil
	}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "the watermark at the log end", func() bool {
		ps := r.C.Stats().Partitions
		if len(ps) == 1 && ps[0].Durable > end[0] {
			t.Fatalf("watermark %d beyond the log end %d", ps[0].Durable, end[0])
		}
		return len(ps) == 1 && ps[0].Durable == end[0]
	})
	r.Stop(t)
	if len(got) != seq {
		t.Fatalf("handled %d messages, want %d: %v", len(got), seq, got)
	}
	if c := cl.Committed(t, group, topic, 1)[0]; c != end[0] {
		t.Fatalf("committed %d, want the log end %d", c, end[0])
	}
	t.Logf("%d transactional messages and %d markers: all handled, watermark and commit at the log end %d", seq, end[0]-int64(seq), end[0])
}

// Three topics of 2, 3 and 4 partitions in one consumer, more messages
// produced to each while it runs: every message of every topic handled
// exactly once, and Kafka's committed offsets at each topic's log end.
func TestSeveralTopics(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	partsOf := map[string]int{}
	var topics []string
	var first, all []kafka.Message
	for i, parts := range []int{2, 3, 4} {
		topic := b.CreateTopic(t, fmt.Sprintf("t%d", i), parts)
		msgs := b.Produce(t, topic, tidemarktest.Keyed(500*parts, 8*parts)...)
		spread(t, msgs, parts)
		first = append(first, msgs...)
		partsOf[topic] = parts
		topics = append(topics, topic)
	}
	all = append(all, first...)
	group := b.Name(t, "g")
	rec := &tidemarktest.Recorder{}
	cfg := frameworktest.Config(t, b.Brokers(), group, topics[0], filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Topics = topics

	// The first messages, then 300 more per partition while it runs.
	firstDone := tidemarktest.Processed(first)
	var ends map[string]map[int]int64 // per topic, the log end of each partition
	atLogEnd := func(c *framework.Consumer) bool {
		ps := c.Stats().Partitions
		n := 0
		for _, p := range ps {
			if end := ends[p.Topic][p.Partition]; p.Committed == end && p.Durable == end {
				n++
			}
		}
		return n == 2+3+4 && len(ps) == 2+3+4
	}
	var st framework.Stats
	tidemarktest.Run(t, cfg, func(c *framework.Consumer) bool {
		if ends == nil {
			if !firstDone(c) {
				return false
			}
			ends = map[string]map[int]int64{}
			for _, topic := range topics {
				more := b.Produce(t, topic, tidemarktest.Keyed(300*partsOf[topic], 8*partsOf[topic])...)
				all = append(all, more...)
				ends[topic] = spread(t, more, partsOf[topic])
			}
			return false
		}
		if !atLogEnd(c) {
			return false
		}
		st = c.Stats()
		return true
	})

	perTopic := map[string]int{}
	for _, p := range st.Partitions {
		perTopic[p.Topic]++
	}
	handled := map[string]int{}
	for _, m := range rec.Handled() {
		handled[m.Topic]++
	}
	rec.Verify(t, all)
	for _, topic := range topics {
		produced := 0
		for _, m := range all {
			if m.Topic == topic {
				produced++
			}
		}
		if n := handled[topic]; n != produced {
			t.Errorf("%s: %d messages handled, %d produced", topic, n, produced)
		}
		if got := b.Committed(t, group, topic); !maps.Equal(got, ends[topic]) {
			t.Errorf("%s: Kafka's committed offsets %v, want %v", topic, got, ends[topic])
		}
		if perTopic[topic] != partsOf[topic] {
			t.Errorf("%s: Stats lists %d partitions, want %d", topic, perTopic[topic], partsOf[topic])
		}
	}
	t.Logf("3 topics (2, 3, 4 partitions, %d messages in all): every message handled once, committed at each log end", len(all))
}

// A subscribed topic deleted while it is being consumed. What the code
// does: fetches for the deleted topic fail with UNKNOWN_TOPIC_OR_PARTITION
// (the partition's LastError) and its leader lookups fail (logged); the
// member's partition watch (every 5s) sees the topic's partitions gone and
// rejoins; the new assignment leaves them out, so they are revoked
// (drained; their final commit fails, logged) and stay in Stats as
// revoked with the error. Run keeps going, the other topic is consumed as
// it grows, and a clean stop returns nil. The test asserts that: the
// deleted topic's partitions end revoked with the error in Stats and the
// log names the topic; nothing of it is handled twice, nothing after the
// deletion beyond what had been fetched; and no offset committed for it, in
// Kafka or in the offset file, passes what was handled.
func TestTopicDeletedWhileConsumed(t *testing.T) {
	const parts, doomedPerPart, keptPerPart = 2, 5000, 500
	cl := testsupport.Start(t)
	kept, doomed := testsupport.Name(t, "kept"), testsupport.Name(t, "doomed")
	cl.CreateTopic(t, kept, parts)
	cl.Produce(t, kept, parts, 0, keptPerPart)
	cl.CreateTopic(t, doomed, parts)
	cl.Produce(t, doomed, parts, 0, doomedPerPart)
	group := testsupport.Name(t, "g")
	// The doomed topic is handled slowly and fetched in small pieces, so
	// that it is deleted with most of it neither handled nor fetched.
	rec := &testsupport.Recorder{}
	rec.Before = func(ctx context.Context, m kafka.Message) error {
		if m.Topic == doomed {
			time.Sleep(time.Millisecond)
		}
		return nil
	}
	logger, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
	file := filepath.Join(t.TempDir(), "o.db")
	cfg := frameworktest.Config(t, cl.Brokers, group, kept, file, rec)
	cfg.Topics = []string{kept, doomed}
	cfg.Logger = logger
	cfg.FetchMaxBytes, cfg.MaxBufferedBytes = 8<<10, 32<<10
	r := frameworktest.Start(t, cfg)

	testsupport.WaitFor(t, time.Minute, "some of the doomed topic handled", func() bool { return rec.CountOf(doomed) >= 200 })
	// A paused partition sends no fetch that could fail: Stats must say
	// why it is revoked all the same (a partition whose buffer is full, or
	// that waits for a share of the budget, is in the same place).
	if err := r.C.Pause(doomed, 1); err != nil {
		t.Fatal(err)
	}
	cl.DeleteTopic(t, doomed)
	handledAtDelete := rec.CountOf(doomed)
	t.Logf("deleted %s with %d of %d of its messages handled", doomed, handledAtDelete, parts*doomedPerPart)
	// The consumer goes on with the other topic.
	cl.Produce(t, kept, parts, keptPerPart, keptPerPart)

	// The deleted topic's partitions end revoked, with the reason in Stats.
	isGone := func(e string) bool { return strings.Contains(e, "Unknown Topic Or Partition") }
	var seen []string // the deleted topic's partitions as last seen, for a failure
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the deleted topic's partitions, last seen: %q", seen)
		}
	})
	testsupport.WaitFor(t, 30*time.Second, "the deleted topic's partitions revoked, the error in Stats", func() bool {
		n := 0
		seen = seen[:0]
		for _, p := range r.C.Stats().Partitions {
			if p.Topic != doomed {
				continue
			}
			seen = append(seen, fmt.Sprintf("%d: %s, last error %q", p.Partition, p.State, p.LastError))
			if p.State == framework.StateRevoked && isGone(p.LastError) {
				n++
			}
		}
		return n == parts
	})
	testsupport.WaitFor(t, time.Minute, "the kept topic handled and committed at its new end", func() bool {
		n := 0
		for _, p := range r.C.Stats().Partitions {
			if p.Topic == kept && p.Committed == 2*keptPerPart && p.State == framework.StateRunning {
				n++
			}
		}
		return n == parts
	})
	st := r.C.Stats()
	if returned, err := r.Wait(0); returned {
		t.Fatalf("Run returned %v after the topic was deleted; want it to keep going", err)
	}
	handledDoomed := rec.CountOf(doomed)
	if handledDoomed >= parts*doomedPerPart {
		t.Errorf("all %d messages of the deleted topic were handled: it was not deleted while being consumed", handledDoomed)
	}
	var told []string
	for _, e := range logs.All() {
		if e.Level < zapcore.WarnLevel {
			continue
		}
		for _, f := range e.Context {
			if strings.Contains(f.String, doomed) || f.Interface != nil && strings.Contains(fmt.Sprint(f.Interface), doomed) {
				told = append(told, e.Message)
				break
			}
		}
	}
	if len(told) == 0 {
		t.Errorf("no warning or error in the log names the deleted topic %s", doomed)
	}
	t.Logf("%d warnings and errors name the deleted topic, e.g. %q", len(told), head(told))
	r.Stop(t)

	// Nothing of the deleted topic handled twice; no commit past what was
	// handled, in Kafka (if it still answers for the topic) or the file.
	// handled is, per partition, one past the highest offset below which
	// every offset was handled.
	handled := map[int]int64{}
	for p := 0; p < parts; p++ {
		for rec.Topic(doomed).Times(p, handled[p]) > 0 {
			handled[p]++
		}
	}
	if d := testsupport.Check(rec.Topic(doomed), testsupport.Offsets(parts, 0), testsupport.Offsets(parts, doomedPerPart)); len(d.Twice) > 0 {
		t.Errorf("%s: %s", doomed, d)
	}
	if c, err := cl.TryCommitted(group, doomed, parts); err == nil {
		for p, o := range c {
			if o > handled[p] {
				t.Errorf("Kafka's committed offset of %s/%d is %d, past what was handled (%d)", doomed, p, o, handled[p])
			}
		}
		t.Logf("Kafka's committed offsets of the deleted topic: %v (everything handled below %v)", c, handled)
	} else {
		t.Logf("Kafka's committed offsets of the deleted topic: %v", err)
	}
	_, recs := storeFailures(t, file, group, doomed, parts)
	for p, rcd := range recs {
		if rcd.Watermark > handled[p] || rcd.Committed > handled[p] {
			t.Errorf("the offset file's record of %s/%d: watermark %d, committed %d, past what was handled (%d)", doomed, p, rcd.Watermark, rcd.Committed, handled[p])
		}
	}
	testsupport.ExactlyOnce(t, rec.Topic(kept), testsupport.Offsets(parts, 0), testsupport.Offsets(parts, 2*keptPerPart))
	if n := rec.CountOf(kept); n != parts*2*keptPerPart {
		t.Errorf("%s: %d offsets handled, %d of them beyond its end", kept, n, n-parts*2*keptPerPart)
	}
	if got := cl.Committed(t, group, kept, parts); !testsupport.EqualOffsets(got, testsupport.Offsets(parts, 2*keptPerPart)) {
		t.Errorf("%s: committed %v, want %d everywhere", kept, got, 2*keptPerPart)
	}
	t.Logf("%d of %d messages of the deleted topic handled (%d when it was deleted); stats:\n%s", handledDoomed, parts*doomedPerPart, handledAtDelete, frameworktest.StatsString(st))
}

// TLS and SASL reach both of kafka-go's connection paths: the group's
// Dialer (join, heartbeats, commits) and the Transport (fetches, offsets).
func TestSASL(t *testing.T) {
	if testsupport.RealBroker() {
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

	rec := &testsupport.Recorder{AnyValue: true}
	cfg := frameworktest.Config(t, []string{addr}, "g", "secured", filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.SASL = mech
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "messages over SASL", func() bool { return rec.Count() == 20 })
	r.Stop(t)
	st := r.C.Stats()
	frameworktest.WantPartitions(t, st, "secured", 2)
	for _, p := range st.Partitions {
		if p.Committed != 10 {
			t.Fatalf("%s/%d committed %d over SASL, want 10", p.Topic, p.Partition, p.Committed)
		}
	}
}

// TLS end to end, on a listener that speaks only TLS: every connection the
// consumer opens through package internal/wire (the group loop's and the
// heartbeats' to the coordinator, the fetch and ListOffsets connections,
// and the client's for metadata, offsets and commits) reaches the broker, so every
// message is handled once and committed at the log end; the handshakes are
// counted on the client's side. A consumer without TLS on the same
// listener handles nothing: the listener really refuses plaintext.
func TestTLS(t *testing.T) {
	const parts, perPart = 3, 300
	addr, clientTLS := tlsBroker(t)
	tr := &kafka.Transport{TLS: clientTLS}
	t.Cleanup(tr.CloseIdleConnections)
	admin := &kafka.Client{Addr: kafka.TCP(addr), Transport: tr, Timeout: 20 * time.Second}
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: parts, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("creating %s over TLS: %v", topic, err)
	}
	for p := 0; p < parts; p++ {
		for attempt := 1; ; attempt++ {
			// Records are readers, consumed by a send: anew for each attempt.
			var recs []kafka.Record
			for o := 0; o < perPart; o++ {
				recs = append(recs, kafka.Record{Value: kafka.NewBytes(testsupport.Value(p, o))})
			}
			pr, err := admin.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
				Records: kafka.NewRecordReader(recs...)})
			if err == nil {
				err = pr.Error
			}
			if err == nil {
				break
			}
			if attempt == 50 {
				t.Fatalf("producing to %s/%d over TLS: %v", topic, p, err)
			}
			time.Sleep(100 * time.Millisecond) // a new partition's leader may still be elected
		}
	}

	// Plaintext against the TLS listener: nothing gets through.
	plainRec := &testsupport.Recorder{}
	plain, err := framework.New(frameworktest.Config(t, []string{addr}, group+"-plain", topic,
		filepath.Join(t.TempDir(), "plain.db"), plainRec))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	perr := plain.Run(pctx)
	pcancel()
	if n := plainRec.Count(); n > 0 {
		t.Fatalf("a consumer without TLS handled %d messages from the TLS listener", n)
	}
	t.Logf("without TLS: nothing handled in 3s (Run: %v)", perr)

	var handshakes atomic.Int64
	cfgTLS := clientTLS.Clone()
	cfgTLS.VerifyConnection = func(tls.ConnectionState) error { handshakes.Add(1); return nil }
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, []string{addr}, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.TLS = cfgTLS
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "every message handled and committed over TLS", func() bool {
		return frameworktest.CommittedAt(perPart, r) == parts
	})
	st := r.C.Stats()
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	if bad := rec.BadValues(); len(bad) > 0 {
		t.Fatalf("wrong payloads: %v", head(bad))
	}
	// Kafka's committed offsets, read over TLS.
	ids := []int{}
	for p := 0; p < parts; p++ {
		ids = append(ids, p)
	}
	of, err := admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		t.Fatalf("reading the committed offsets over TLS: %v", err)
	}
	for _, p := range of.Topics[topic] {
		if p.Error != nil || p.CommittedOffset != perPart {
			t.Errorf("%s/%d: committed %d (%v), want %d", topic, p.Partition, p.CommittedOffset, p.Error, perPart)
		}
	}
	// At least the group's coordinator connection, its heartbeat
	// connection, a fetch connection and kafka-go's Transport.
	if n := handshakes.Load(); n < 4 {
		t.Errorf("%d TLS handshakes by the consumer, want at least 4 (coordinator, heartbeats, fetches, kafka-go's Transport)", n)
	}
	if st.Generation <= 0 {
		t.Errorf("generation %d: the consumer never joined the group", st.Generation)
	}
	t.Logf("over TLS (%s): %d messages handled once, committed at the log end; %d TLS handshakes; generation %d",
		addr, parts*perPart, handshakes.Load(), st.Generation)
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

// logEnds lists the log end offsets of topic with a new kgo client, which
// finds the current leaders and retries a partition whose leader moved.
func logEnds(t testing.TB, seeds []string, topic string, parts int) map[int]int64 {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	var ends map[int]int64
	testsupport.WaitForNoError(t, 30*time.Second, "the log ends of "+topic, func() (err error) {
		ends, err = tryLogEnds(kc, topic, parts)
		return err
	})
	return ends
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

// rewriteBatches rewrites each record of the uncompressed v2 batches in raw
// with fn (nil drops the record), keeping each batch's base and last offset
// as Kafka's log cleaner does, and fixes the count, length and CRC.
func rewriteBatches(raw []byte, fn func(base, offset int64, rec []byte) []byte) []byte {
	var out []byte
	for len(raw) >= 61 {
		n := 12 + int(binary.BigEndian.Uint32(raw[8:]))
		if n > len(raw) {
			break // cut short by the response's size limit: forwarded as is
		}
		batch := raw[:n]
		raw = raw[n:]
		base := int64(binary.BigEndian.Uint64(batch))
		count := int(binary.BigEndian.Uint32(batch[57:]))
		recs := batch[61:]
		var kept []byte
		nk := 0
		for i := 0; i < count; i++ {
			l, k := binary.Varint(recs)
			rec := recs[:k+int(l)]
			recs = recs[k+int(l):]
			body := rec[k+1:] // after the length and the attributes byte
			_, k1 := binary.Varint(body)
			delta, _ := binary.Varint(body[k1:])
			if r := fn(base, base+delta, rec); r != nil {
				kept = append(kept, r...)
				nk++
			}
		}
		nb := append(append([]byte(nil), batch[:61]...), kept...)
		binary.BigEndian.PutUint32(nb[8:], uint32(len(nb)-12))
		binary.BigEndian.PutUint32(nb[57:], uint32(nk))
		binary.BigEndian.PutUint32(nb[17:], crc32.Checksum(nb[21:], crc32.MakeTable(crc32.Castagnoli)))
		out = append(out, nb...)
	}
	return append(out, raw...)
}

// Environment of TestTLS on a real broker (scripts/kafka-local sets both:
// its broker has an SSL listener with a self-signed certificate).
const (
	envTLSBrokers = "KAFKA_TLS_BROKERS" // host:port of the broker's SSL listener
	envTLSCA      = "KAFKA_TLS_CA"      // PEM file of the certificate to trust
)

// selfSigned returns a server certificate for 127.0.0.1 and localhost, and
// a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tidemark test broker"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

// tlsBroker returns the address of a broker that speaks only TLS, and a
// client TLS config that trusts it: kfake with kfake.TLS, or the SSL
// listener of the real broker of scripts/kafka-local.
func tlsBroker(t *testing.T) (string, *tls.Config) {
	t.Helper()
	if testsupport.RealBroker() {
		addr, caFile := os.Getenv(envTLSBrokers), os.Getenv(envTLSCA)
		if addr == "" || caFile == "" {
			t.Skipf("%s is set but %s and %s are not: this broker has no TLS listener known to the test (scripts/kafka-local start gives one)",
				testsupport.EnvBrokers, envTLSBrokers, envTLSCA)
		}
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatalf("%s: %v", envTLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			t.Fatalf("%s=%s holds no PEM certificate", envTLSCA, caFile)
		}
		return strings.Split(addr, ",")[0], &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	cert, pool := selfSigned(t)
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return fake.ListenAddrs()[0], &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}
