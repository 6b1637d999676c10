package framework

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// BenchmarkAssignmentStart measures what an assignment of 10,000 partitions
// costs from the assignment to the partitions' runs being open (committed
// offsets, the log's bounds, reconciliation, the flush), and its revoke,
// on kfake in this process, with a new offset file each time. One op is
// one start and one stop.
func BenchmarkAssignmentStart(b *testing.B) {
	const parts = 10000
	cl := testsupport.Start(b)
	topic, group := testsupport.Name(b, "t"), testsupport.Name(b, "g")
	cl.CreateTopic(b, topic, parts)
	cl.WaitLeaders(b, topic, parts)
	tps := make([]topicPartition, parts)
	for i := range tps {
		tps[i] = topicPartition{topic, int32(i)}
	}
	ctx := context.Background()
	b.ReportAllocs()
	var start, stop time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c, err := New(Config{Brokers: cl.Brokers, GroupID: group, Topics: []string{topic},
			OffsetFile: filepath.Join(b.TempDir(), "o.db"), InspectSocket: InspectDisabled,
			Handler: handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
			Logger:  zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		finish := runFetcher(c)
		c.assignment.runCtx = ctx
		c.env.handlerCtx = ctx
		c.identity.setGen(1)
		b.StartTimer()
		t0 := time.Now()
		c.assignment.start(ctx, tps)
		t1 := time.Now()
		c.assignment.revoke(tps, false, "bench")
		t2 := time.Now()
		b.StopTimer()
		start += t1.Sub(t0)
		stop += t2.Sub(t1)
		if err := finish(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(start.Milliseconds())/float64(b.N), "start-ms/op")
	b.ReportMetric(float64(stop.Milliseconds())/float64(b.N), "stop-ms/op")
}
