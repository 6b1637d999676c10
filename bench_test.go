//go:build unix

// BenchmarkConsume: tidemark's end-to-end throughput against kafka-go's
// group Reader, side by side in the same process on the same data.
//
// One op is consuming the whole preloaded topic once (8 partitions x 25,000
// messages of 100 bytes) with a fresh consumer group, so b.N counts whole
// passes over the topic: run it with a fixed count, -benchtime Nx. Every
// sub-benchmark works on the same topic, preloaded once for the run. The
// clients talk to the broker directly, not through testsupport's fault proxy.
//
// Run (about 20s on 2 cores):
//
//	go test -run '^$' -bench BenchmarkConsume -benchtime 3x -count 5 . | tee bench.txt
//
// With -benchtime 3x each sample is the mean of 3 passes; the first pass of
// each sample (b.N=1) is a warm-up whose result the testing package drops.
// -count repeats each sub-benchmark back to back, so on a machine shared
// with other work a burst of load lands on one implementation only. To
// interleave them, run the process several times instead (one preload per
// process, about 5s each):
//
//	for i in $(seq 10); do go test -run '^$' -bench BenchmarkConsume -benchtime 3x -count 1 . ; done | tee bench.txt
//
// Summarise and compare, with benchstat from the Go module proxy (go run
// pkg@version builds it outside this module; go.mod is not touched):
//
//	go run golang.org/x/perf/cmd/benchstat@latest bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl bench.txt
//
// The second form puts the implementations side by side, each metric with
// its median and confidence interval per implementation and the difference
// against the first column (tidemark); a ratio such as tidemark's msgs/s
// over kafka-go-reader-commit-1s's is the ratio of those medians.
//
// KAFKA_BROKERS=host:port runs the same benchmark against a real broker
// (a fresh topic is created, preloaded and deleted afterwards). The file
// builds on unix only, for getrusage.
//
// Metrics, per sub-benchmark:
//
//	msgs/s     messages handled per second, from the first message handled to
//	           the last one (group join, warm-up fetch and shutdown excluded)
//	ns/msg     the inverse, per message
//	ns/op      the same window per op (the built-in ns/op, which would include
//	           the group join and shutdown, is replaced)
//	cpu-ns/msg CPU time of the whole process (getrusage: user + system, every
//	           thread, the in-process broker included) over the same window,
//	           per message: steadier than msgs/s on a machine shared with other
//	           work, which stretches wall time far more than CPU time
//	cores      cpu-ns/msg x msgs/s: CPUs the process kept busy in the window
//	runq-wait-ns/msg (Linux) time the process's threads were ready to run but
//	           waited for a CPU, per message. A sample well above its
//	           sub-benchmark's usual value ran while other work on the machine
//	           took CPUs away: its msgs/s measured that load as much as the
//	           consumer (cpu-ns/msg moves much less). On an otherwise idle 2-core
//	           machine tidemark stays under ~100 and keeps ~1.9 CPUs busy, the
//	           1s-commit Reader under ~400 with ~1.6 CPUs
//	allocs/msg heap allocations per message (runtime.MemStats.Mallocs), from
//	B/msg      just before the consumer starts to the last message handled; this
//	           includes the group join and the in-process broker's own
//	           allocations (it runs in this process: about 330 B/msg and few
//	           allocations, the same for every client), not the shutdown
//	ns-to-durable/op (tidemark only) from the last message handled until
//	           every partition's durable watermark in the offset file covers it
//	B/op, allocs/op (ReportAllocs) the whole op, join and shutdown included
//
// Sub-benchmarks:
//
//	impl=tidemark                   durable offsets (bbolt, fsync), Config
//	                                defaults (CommitInterval 1s, fetches of up
//	                                to 1 MiB per partition), no-op handler
//	impl=tidemark-nosync            Config.NoSync: the cost of fsync
//	impl=kafka-go-reader-commit-1s  kafka-go Reader, GroupID, FetchMessage +
//	                                CommitMessages, CommitInterval 1s (commits
//	                                queued, sent once a second), MaxWait 100ms,
//	                                ReadLagInterval -1, other fields default
//	                                (MaxBytes 1 MB, QueueCapacity 100): the peer
//	impl=kafka-go-reader-sync-commit  the same Reader committing every message
//	                                synchronously (CommitInterval 0), on the
//	                                first 2,000 messages only; compare msgs/s
//	                                and ns/msg, not ns/op
package tidemark_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

const (
	benchPartitions   = 8
	benchPerPartition = 25000
	benchValueSize    = 100
	benchTotal        = benchPartitions * benchPerPartition
	// benchSyncShare is how many messages the synchronous-commit Reader
	// consumes per op: one OffsetCommit round trip per message makes the
	// whole topic take too long.
	benchSyncShare = 2000
	// benchTimeout bounds one op; a consumer that stalls fails the
	// benchmark instead of hanging it.
	benchTimeout = 2 * time.Minute
)

func BenchmarkConsume(b *testing.B) {
	// The top-level benchmark function runs once per process, whatever
	// -count says (the testing package repeats only the sub-benchmarks), so
	// the topic is created and preloaded once and shared by every
	// sub-benchmark and every sample; it is closed when this function's
	// cleanups run, after the last sub-benchmark.
	fx := preloadBenchTopic(b)

	b.Run("impl=tidemark", func(b *testing.B) { benchTidemark(b, fx, false) })
	b.Run("impl=tidemark-nosync", func(b *testing.B) { benchTidemark(b, fx, true) })
	b.Run("impl=kafka-go-reader-commit-1s", func(b *testing.B) { benchReader(b, fx, time.Second, benchTotal) })
	b.Run("impl=kafka-go-reader-sync-commit", func(b *testing.B) { benchReader(b, fx, 0, benchSyncShare) })
}

type benchTopic struct {
	brokers []string
	topic   string
}

// preloadBenchTopic starts the broker (or uses KAFKA_BROKERS), creates the
// topic and produces benchPerPartition messages of benchValueSize bytes to
// each partition.
func preloadBenchTopic(b *testing.B) *benchTopic {
	b.Helper()
	start := time.Now()
	cl := testsupport.Start(b)
	topic := testsupport.Name(b, "bench")
	cl.CreateTopic(b, topic, benchPartitions)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const chunk = 2500
	recs := make([]kafka.Record, chunk)
	for p := 0; p < benchPartitions; p++ {
		for i := 0; i < benchPerPartition; i += chunk {
			n := min(chunk, benchPerPartition-i)
			for j := 0; j < n; j++ {
				recs[j] = kafka.Record{Value: kafka.NewBytes(benchValue(p, i+j))}
			}
			res, err := cl.Client().Produce(ctx, &kafka.ProduceRequest{
				Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
				Records: kafka.NewRecordReader(recs[:n]...),
			})
			if err == nil {
				err = res.Error
			}
			if err == nil && len(res.RecordErrors) > 0 {
				err = fmt.Errorf("record errors: %v", res.RecordErrors)
			}
			if err != nil {
				b.Fatalf("preloading %s/%d: %v", topic, p, err)
			}
		}
	}
	_, end := cl.Bounds(b, topic, benchPartitions)
	for p := 0; p < benchPartitions; p++ {
		if end[p] != benchPerPartition {
			b.Fatalf("preloaded %s/%d holds %d messages, want %d", topic, p, end[p], benchPerPartition)
		}
	}
	if cl.Real {
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := cl.Client().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
			if err == nil {
				err = res.Errors[topic]
			}
			if err != nil {
				b.Logf("deleting the benchmark topic %s: %v", topic, err)
			}
		})
	}
	b.Logf("preloaded %d x %d messages of %d bytes in %s (broker %s, real=%v)",
		benchPartitions, benchPerPartition, benchValueSize, time.Since(start).Round(time.Millisecond), cl.Upstream, cl.Real)
	// Straight to the broker: the fault proxy would be part of the
	// measurement otherwise.
	return &benchTopic{brokers: []string{cl.Upstream}, topic: topic}
}

// benchValue is a benchValueSize-byte payload naming its partition and
// sequence number.
func benchValue(p, seq int) []byte {
	v := fmt.Appendf(make([]byte, 0, benchValueSize), "p%d-m%07d-", p, seq)
	for len(v) < benchValueSize {
		v = append(v, '.')
	}
	return v
}

// benchCount is what the no-op handlers do per message: check that the
// partition's offsets arrive in order without gaps or repeats, count them,
// and note when the first and the last message of the op were handled.
type benchCount struct {
	base  time.Time
	want  int64 // messages to handle in this op
	done  chan struct{}
	first atomic.Int64 // ns since base of the first message handled; 0 = none yet
	last  atomic.Int64 // ns since base of the last message handled
	total atomic.Int64 // used only with a shared budget (the Reader)
	left  atomic.Int64 // partitions not yet complete (tidemark)
	parts [benchPartitions]benchPart
	// cpuAtFirst and cpuAtLast are the process's CPU time (user + system,
	// every thread, the in-process broker's too) when the first and the
	// last message were handled; waitAtFirst and waitAtLast the time its
	// threads spent waiting for a CPU (-1 where unknown).
	cpuAtFirst, cpuAtLast   time.Duration
	waitAtFirst, waitAtLast time.Duration
	// memAtLast is read from the goroutine that handles the last message.
	memAtLast runtime.MemStats
}

type benchPart struct {
	next, n, bad int64
	_            [40]byte // one cache line each: partitions run on different goroutines
}

func newBenchCount(want int64, parts int) *benchCount {
	c := &benchCount{base: time.Now(), want: want, done: make(chan struct{})}
	c.left.Store(int64(parts))
	return c
}

// see records a message in its partition's counter, which it returns, and
// notes the start of the measured window at the op's first message.
func (c *benchCount) see(partition int, offset int64) *benchPart {
	if c.first.Load() == 0 {
		cpu := processCPU()
		if c.first.CompareAndSwap(0, int64(time.Since(c.base))) {
			c.cpuAtFirst = cpu
			c.waitAtFirst = runQueueWait()
		}
	}
	p := &c.parts[partition]
	if offset != p.next {
		p.bad++
	}
	p.next = offset + 1
	p.n++
	return p
}

// finish is called once, by whichever goroutine handled the op's last message.
func (c *benchCount) finish() {
	c.last.Store(int64(time.Since(c.base)))
	c.cpuAtLast = processCPU()
	c.waitAtLast = runQueueWait()
	runtime.ReadMemStats(&c.memAtLast)
	close(c.done)
}

func (c *benchCount) check(b *testing.B, perPart int64) {
	b.Helper()
	var n int64
	for i := range c.parts {
		p := &c.parts[i]
		n += p.n
		if p.bad > 0 || (perPart > 0 && (p.n != perPart || p.next != perPart)) {
			b.Fatalf("partition %d: %d messages, next offset %d, %d out of order; want %d in order", i, p.n, p.next, p.bad, perPart)
		}
	}
	if n != c.want {
		b.Fatalf("handled %d messages, want %d", n, c.want)
	}
}

// benchStats accumulates the measured windows of every op of one
// sub-benchmark and reports them.
type benchStats struct {
	window        time.Duration
	cpu           time.Duration
	wait          time.Duration
	noWait        bool
	msgs          int64
	mallocs       uint64
	bytes         uint64
	toDurable     time.Duration
	haveToDurable bool
}

func (s *benchStats) add(c *benchCount, before *runtime.MemStats) {
	s.window += time.Duration(c.last.Load() - c.first.Load())
	s.cpu += c.cpuAtLast - c.cpuAtFirst
	if c.waitAtFirst < 0 || c.waitAtLast < 0 {
		s.noWait = true
	}
	s.wait += c.waitAtLast - c.waitAtFirst
	s.msgs += c.want
	s.mallocs += c.memAtLast.Mallocs - before.Mallocs
	s.bytes += c.memAtLast.TotalAlloc - before.TotalAlloc
}

func (s *benchStats) report(b *testing.B) {
	if s.msgs == 0 || s.window <= 0 {
		return
	}
	ns := float64(s.window.Nanoseconds())
	b.ReportMetric(ns/float64(b.N), "ns/op")
	b.ReportMetric(ns/float64(s.msgs), "ns/msg")
	b.ReportMetric(float64(s.msgs)/s.window.Seconds(), "msgs/s")
	b.ReportMetric(float64(s.cpu.Nanoseconds())/float64(s.msgs), "cpu-ns/msg")
	b.ReportMetric(float64(s.cpu)/float64(s.window), "cores")
	if !s.noWait {
		b.ReportMetric(float64(s.wait.Nanoseconds())/float64(s.msgs), "runq-wait-ns/msg")
	}
	b.ReportMetric(float64(s.mallocs)/float64(s.msgs), "allocs/msg")
	b.ReportMetric(float64(s.bytes)/float64(s.msgs), "B/msg")
	if s.haveToDurable {
		b.ReportMetric(float64(s.toDurable.Nanoseconds())/float64(b.N), "ns-to-durable/op")
	}
}

var benchGroupSeq atomic.Int64

func benchGroup(impl string) string {
	return fmt.Sprintf("bench-%s-%d-%d", impl, time.Now().UnixNano()%1e9, benchGroupSeq.Add(1))
}

func benchTidemark(b *testing.B, fx *benchTopic, noSync bool) {
	b.ReportAllocs()
	dir := b.TempDir()
	var st benchStats
	st.haveToDurable = true
	for i := 0; i < b.N; i++ {
		c := newBenchCount(benchTotal, benchPartitions)
		h := handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
			if p := c.see(m.Partition, m.Offset); p.n == benchPerPartition && c.left.Add(-1) == 0 {
				c.finish()
			}
			return nil
		})
		cons, err := framework.New(framework.Config{
			Brokers:    fx.brokers,
			GroupID:    benchGroup("tidemark"),
			Topics:     []string{fx.topic},
			OffsetFile: filepath.Join(dir, fmt.Sprintf("offsets-%d.db", i)),
			Handler:    h,
			NoSync:     noSync,
		})
		if err != nil {
			b.Fatalf("New: %v", err)
		}
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- cons.Run(ctx) }()
		stop := func() {
			cancel()
			if err := <-ran; err != nil {
				b.Errorf("Run: %v", err)
			}
		}
		select {
		case <-c.done:
		case err := <-ran:
			cancel()
			b.Fatalf("Run returned %v before every message was handled", err)
		case <-time.After(benchTimeout):
			stop()
			b.Fatalf("not every message handled within %s:\n%s", benchTimeout, frameworktest.StatsString(cons.Stats()))
		}
		// Every message handled: wait until the offset file holds every
		// watermark, so the op ends with the offsets recorded durably.
		durable := waitBenchDurable(cons, c.base, benchPerPartition, benchTimeout)
		stop()
		if durable < 0 {
			b.Fatalf("offset file does not cover every message within %s:\n%s", benchTimeout, frameworktest.StatsString(cons.Stats()))
		}
		c.check(b, benchPerPartition)
		st.add(c, &before)
		st.toDurable += time.Duration(durable) - time.Duration(c.last.Load())
	}
	st.report(b)
}

// waitBenchDurable polls Stats until the durable watermark of every
// partition reaches want. It returns when that was seen, in ns since base, or
// -1 on timeout.
func waitBenchDurable(cons *framework.Consumer, base time.Time, want int64, timeout time.Duration) int64 {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st := cons.Stats()
		ok := len(st.Partitions) == benchPartitions
		for _, p := range st.Partitions {
			ok = ok && p.Durable >= want
		}
		if ok {
			return int64(time.Since(base))
		}
		time.Sleep(100 * time.Microsecond)
	}
	return -1
}

func benchReader(b *testing.B, fx *benchTopic, commitInterval time.Duration, share int64) {
	b.ReportAllocs()
	impl := "reader-1s"
	if commitInterval == 0 {
		impl = "reader-sync"
	}
	var st benchStats
	for i := 0; i < b.N; i++ {
		c := newBenchCount(share, benchPartitions)
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		rd := kafka.NewReader(kafka.ReaderConfig{
			Brokers:         fx.brokers,
			GroupID:         benchGroup(impl),
			Topic:           fx.topic,
			CommitInterval:  commitInterval,
			MaxWait:         100 * time.Millisecond,
			ReadLagInterval: -1,
		})
		err := consumeWithReader(rd, c)
		if cerr := rd.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("Close: %w", cerr)
		}
		if err != nil {
			b.Fatalf("kafka-go Reader: %v (after %d of %d messages)", err, c.total.Load(), share)
		}
		perPart := int64(benchPerPartition)
		if share != benchTotal {
			perPart = 0 // a share: any split across partitions, each in order
		}
		c.check(b, perPart)
		st.add(c, &before)
	}
	st.report(b)
}

// consumeWithReader is the loop kafka-go's documentation recommends for
// at-least-once processing: FetchMessage, handle (a no-op here, the same
// counting as tidemark's handler), CommitMessages.
func consumeWithReader(rd *kafka.Reader, c *benchCount) error {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	for {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("FetchMessage: %w", err)
		}
		c.see(m.Partition, m.Offset)
		if err := rd.CommitMessages(ctx, m); err != nil {
			return fmt.Errorf("CommitMessages: %w", err)
		}
		if c.total.Add(1) == c.want {
			c.finish()
			return nil
		}
	}
}

// processCPU is the CPU time the process has used so far, user and system,
// over all its threads.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runQueueWait is the time the process's threads have spent runnable but
// waiting for a CPU (the second field of Linux's per-thread schedstat), or
// -1 where that is not available. It reads one small file per thread (about
// 10us each).
func runQueueWait() time.Duration {
	const dir = "/proc/self/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return -1
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return -1
		}
		sum += ns
	}
	return time.Duration(sum)
}
