package tidemark_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// Past 4,096 partitions the per-partition shares of the default 16 MiB
// budget (at least 4 KiB each) add up to more than the budget: a backlog on
// 10,000 partitions over 3 brokers, with handling held, still keeps
// Stats.BufferedBytes within MaxBufferedBytes plus one record batch per
// fetch loop, and is then consumed exactly once.
func TestTenThousandPartitionsStayWithinBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 partitions: not under -short")
	}
	if testsupport.RealBroker() {
		t.Skip("10,000 partitions: kfake only")
	}
	const parts, perPart, size = 10000, 4, 1 << 10 // 40 MiB of values
	const budget = 16 << 20                        // the default
	const maxBatch = 61 + perPart*(size+32)        // see TestThousandPartitionsStayBounded

	cl := testsupport.Start(t, kfake.NumBrokers(3))
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	slack := int64(cl.WaitLeaders(t, topic, parts)*testsupport.FetchLanes) * maxBatch
	kc := testsupport.NewProducer(t, []string{cl.Upstream}, kgo.ProducerBatchCompression(kgo.NoCompression()))
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
	cfg := frameworktest.Config(t, []string{cl.Upstream}, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.FetchMaxWait, cfg.FetchMaxBytes, cfg.MaxBufferedBytes = 0, 0, 0 // the defaults
	r := frameworktest.Start(t, cfg)

	sampler := frameworktest.SampleBuffered(t, r, 10*time.Millisecond, budget+slack, rec.Count)

	filled := time.Now().Add(60 * time.Second)
	for r.C.Stats().BufferedBytes < budget/2 && time.Now().Before(filled) {
		time.Sleep(50 * time.Millisecond)
	}
	if b := r.C.Stats().BufferedBytes; b < budget/2 {
		t.Errorf("Stats.BufferedBytes %d after 60s with handling held and a 40 MiB backlog, want at least half the budget (%d)", b, budget/2)
	} else {
		time.Sleep(time.Second) // a measurement window, not a wait for a condition
	}
	close(gate)
	testsupport.WaitFor(t, 180*time.Second, fmt.Sprintf("%d messages handled", parts*perPart), func() bool { return rec.Count() == parts*perPart })
	maxBuf, samples, overBudget := sampler.Stop()
	requests := r.C.Stats().FetchRequests
	r.Stop(t)

	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	t.Logf("%d samples: at most %d buffered bytes (budget %d + slack %d, one batch per fetch loop); %d fetch requests", samples, maxBuf, budget, slack, requests)
	if overBudget != "" {
		t.Errorf("Stats.BufferedBytes above MaxBufferedBytes %d + one batch per fetch loop %d: %s", budget, slack, overBudget)
	}
}
