package testsupport

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// NewProducer returns a franz-go producer to seeds, closed when the test
// ends, that writes each record to the partition it names. Unlike
// kafka-go's Writer, its idempotent producer writes each record exactly
// once and in order even while partition leaders move, so the message at
// offset o of partition p of a topic it alone writes from 0 with
// ValueRecords is Value(p, o).
func NewProducer(t testing.TB, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	kc, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	if err != nil {
		t.Fatalf("starting a kgo producer: %v", err)
	}
	t.Cleanup(kc.Close)
	return kc
}

// ProduceSync writes recs with kc within a minute.
func ProduceSync(kc *kgo.Client, recs []*kgo.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return kc.ProduceSync(ctx, recs...).FirstErr()
}

// ValueRecords are n records for partition p of topic numbered from first,
// with Value payloads (what a Recorder expects) and "k<number>" keys.
func ValueRecords(topic string, p, first, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(p), Key: fmt.Appendf(nil, "k%d", first+i), Value: Value(p, first+i)}
	}
	return recs
}
