package tidemark_test

// Memory with 10,000 partitions and highly compressible batches: the
// fetched but unhandled bytes against MaxBufferedBytes, and the heap in use
// against the budget plus a per-partition cost (issue 28).

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// A backlog of zstd-compressed batches on 10,000 partitions, with handling
// held so that the consumer fetches and decodes all it will, at the default
// MaxBufferedBytes (16 MiB): the fetched and decompressed but unhandled
// bytes (Stats.BufferedBytes) stay within the budget plus one batch per
// fetch loop, and the heap in use, after a GC, grows by at most the budget plus
// wideHeapPerPartition per partition.
//
// The backlog is 10,000 x 8 records of 1 KiB, 78 MiB decoded, which
// compresses to 1.5 MiB: a budget counted in compressed bytes let every
// partition hold its whole decoded batch at once (17.0-17.9 KiB per
// partition beyond the budget on 2026-12-02, 28 KiB asserted). Decoded
// batches now count in the budget (fetcher.inflate): about 3,900 partitions
// reach the handler, the others wait to decompress. Measured on kfake
// (2026-12-03, 2 shared cores, the budget then 32 MiB): 11.9-15.9 KiB per
// partition beyond the budget, against issue 28's target of 16 KiB; with
// 16 MiB (2026-12-08, 4 runs) 3.4-14.9 KiB, the most when 8,837
// partitions, not about 1,900, had a message in the handler; asserted at
// 20 KiB.
func TestTenThousandPartitionsStayBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 partitions: not under -short")
	}
	if testsupport.RealBroker() {
		t.Skip("10,000 partitions: on the in-process broker only (a single-node Kafka's limits and memory are not the consumer's)")
	}
	const parts, perPart, size = 10_000, 8, 1 << 10
	const budget = 16 << 20 // Config.MaxBufferedBytes's default
	// What each partition may cost beyond the budget (see the test's
	// comment); issue 28's target is 16 KiB.
	const wideHeapPerPartition = 20 << 10
	const targetPerPartition = 16 << 10
	// One compressed batch per fetch loop may pass the budget (a broker
	// returns a partition's first batch whole): a batch of this topic
	// compresses to well under 1 KiB; the uncompressed bound is the slack.
	const maxBatch = 61 + perPart*(size+32)

	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	slack := int64(cl.WaitLeaders(t, topic, parts)*testsupport.FetchLanes) * maxBatch
	kc := testsupport.NewProducer(t, []string{cl.Upstream},
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerLinger(50*time.Millisecond), kgo.MaxBufferedRecords(parts*perPart))
	recs := make([]*kgo.Record, 0, parts*perPart)
	for p := 0; p < parts; p++ {
		for o := 0; o < perPart; o++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(p), Value: paddedValue(p, o, size)})
		}
	}
	if err := testsupport.ProduceSync(kc, recs); err != nil {
		t.Fatalf("producing the backlog: %v", err)
	}
	kc.Close()
	recs = nil

	// waiting counts the partitions whose first message reached the
	// handler: its batch is decoded, and the handler holds it at the gate.
	gate := make(chan struct{})
	var waiting atomic.Int64
	rec := &testsupport.Recorder{
		Before: func(ctx context.Context, m kafka.Message) error {
			if m.Offset == 0 {
				waiting.Add(1)
			}
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Want: func(p int, o int64) []byte { return paddedValue(p, int(o), size) },
	}
	var released sync.Once
	release := func() { released.Do(func() { close(gate) }) }
	defer release()

	cfg := frameworktest.Config(t, []string{cl.Upstream}, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.FetchMaxWait, cfg.FetchMaxBytes, cfg.MaxBufferedBytes = 0, 0, 0 // the defaults
	base := heapInUse()
	r := frameworktest.Start(t, cfg)

	sampler := frameworktest.SampleBuffered(t, r, 20*time.Millisecond, budget+slack, rec.Count)

	// With handling held, the consumer fetches until the budget or the
	// backlog is exhausted: wait until every partition's first message is
	// in the handler (its batch decoded, the rest of the backlog fetched
	// or not), or 45 s, then take the heap after a GC twice, a second
	// apart, and keep the larger.
	// Decoded batches count in the budget, so only the partitions whose
	// batch fits reach the handler; the others wait to decompress. Wait
	// until none has come for 3 s (or all have).
	deadline := time.Now().Add(45 * time.Second)
	for last, since := int64(-1), time.Now(); time.Now().Before(deadline) && waiting.Load() < parts; time.Sleep(200 * time.Millisecond) {
		if n := waiting.Load(); n != last {
			last, since = n, time.Now()
		} else if n > 0 && time.Since(since) > 3*time.Second {
			break
		}
	}
	if waiting.Load() == 0 {
		t.Errorf("after 45 s with handling held, no partition's first message reached the handler")
	}
	var heap uint64
	for i := 0; i < 2; i++ {
		time.Sleep(time.Second) // a measurement window, not a wait for a condition
		h := heapInUse()
		heap = max(heap, h-min(base, h))
	}
	st := r.C.Stats()
	inHandler := waiting.Load()
	release()
	testsupport.WaitFor(t, 90*time.Second, fmt.Sprintf("%d messages handled", parts*perPart), func() bool { return rec.Count() == parts*perPart })
	maxBuf, samples, overBudget := sampler.Stop()
	r.Stop(t)

	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	if bad := rec.BadValues(); len(bad) > 0 {
		t.Errorf("%d messages with the wrong payload: %v", len(bad), head(bad))
	}
	perPartition := float64(heap-min(heap, budget)) / parts
	t.Logf("%d partitions, %d MiB decoded backlog (zstd): with handling held, %d buffered bytes (peak %d over %d samples; budget %d + slack %d), "+
		"heap in use %.1f MiB above the start after a GC (%.1f KiB per partition): %.1f KiB per partition beyond the budget (asserted <= %d KiB; issue 28's target %d KiB), %d of %d partitions holding fetched bytes, %d with a message in the handler",
		parts, parts*perPart*size>>20, st.BufferedBytes, maxBuf, samples, budget, slack,
		float64(heap)/(1<<20), float64(heap)/parts/1024, perPartition/1024, wideHeapPerPartition>>10, targetPerPartition>>10, heldPartitions(st.Partitions), len(st.Partitions), inHandler)
	if overBudget != "" {
		t.Errorf("Stats.BufferedBytes above MaxBufferedBytes %d + one batch per fetch loop %d: %s", budget, slack, overBudget)
	}
	if maxBuf == 0 {
		t.Errorf("Stats.BufferedBytes stayed 0 over %d samples with handling held on a backlog of %d partitions", samples, parts)
	}
	if limit := uint64(budget + parts*wideHeapPerPartition); heap > limit {
		t.Errorf("heap in use grew by %.1f MiB with handling held, want at most %.1f MiB (MaxBufferedBytes %d MiB + %d partitions x %d KiB)",
			float64(heap)/(1<<20), float64(limit)/(1<<20), budget>>20, parts, wideHeapPerPartition>>10)
	}
}

// heldPartitions counts the partitions holding fetched bytes.
func heldPartitions(ps []framework.PartitionStats) int {
	n := 0
	for _, p := range ps {
		if p.BufferedBytes > 0 {
			n++
		}
	}
	return n
}

// heapInUse is the heap in use after a garbage collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC() // the second empties the sync.Pools' victim caches
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// What an idle assigned partition costs beyond the budget: 10,000
// partitions with nothing to fetch, all running, against the same process
// before the consumer started (the topic already made, so the in-process
// broker's own state for it is in the baseline): the heap in use after a
// GC plus the goroutine stacks, per partition. Issue 28's target, stated
// in the README, is 16 KiB. An idle partition has no goroutine (it parks:
// partition.run); in process this test also charges the broker's
// per-partition fetch session, group and commit state to the consumer.
// Measured on kfake (2026-12-02): 7.1-7.4 KiB, 6.5 KiB under -race (11.5
// and 15.7 KiB with a goroutine per partition); 8.3-8.5 KiB once the
// offset file's writer kept its largest flush's buffers (a 10,000-partition
// flush reuses them 200 times a second); 5.4-5.5 KiB (2026-12-06), then
// 5.1-5.2 KiB with the latency histogram and the gate's channel made at
// first use; 4.6-4.9 KiB with an offset-file slot of one record (232 bytes,
// 728 before), 3.9-4.2 KiB with a direct-mode dispatcher without queues;
// 3.3-4.0 KiB with one shared breaker for the runs after a clean end and
// no ready channel for a partition that parks (3.8-4.8 KiB just before,
// 2026-12-06); asserted at 10 KiB.
func TestIdlePartitionCost(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 partitions: not under -short")
	}
	if testsupport.RealBroker() {
		t.Skip("10,000 partitions: on the in-process broker only (a single-node Kafka's limits and memory are not the consumer's)")
	}
	const parts, target = 10_000, 10 << 10
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	cl.WaitLeaders(t, topic, parts)
	cfg := frameworktest.Config(t, []string{cl.Upstream}, testsupport.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), &testsupport.Recorder{})
	cfg.FetchMaxWait, cfg.FetchMaxBytes, cfg.MaxBufferedBytes = 0, 0, 0 // the defaults
	base := memInUse()
	r := frameworktest.Start(t, cfg)
	frameworktest.WaitRunning(t, r, parts, 60*time.Second)
	time.Sleep(time.Second) // a settling window: the first fetches and commits of every partition
	used := memInUse()
	r.Stop(t)
	per := float64(used-min(used, base)) / parts
	t.Logf("%d idle partitions: heap and stacks in use grew by %.1f MiB, %.1f KiB per partition (target %d KiB)",
		parts, float64(used-min(used, base))/(1<<20), per/1024, target>>10)
	if per > float64(target) {
		t.Errorf("an idle partition costs %.1f KiB (heap after a GC, and stacks), want at most %d KiB", per/1024, target>>10)
	}
}

// memInUse is the heap in use after a garbage collection, plus the
// goroutine stacks.
func memInUse() uint64 {
	heapInUse()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}
