package framework

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// BenchmarkFetchRequest measures what one broker loop's request costs the
// fetcher at a width: build, and deliver of an answer with nothing for any
// partition (an idle topic), with the partitions spread over 3 brokers.
// One op is one request of one broker loop.
func BenchmarkFetchRequest(b *testing.B) {
	for _, parts := range []int{8, 1000, 10000} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			const brokers = 3
			f := newTestFetcher(Config{MaxBufferedBytes: 32 << 20, FetchMaxBytes: 50 << 20, FetchMaxWait: 250 * time.Millisecond})
			loops := make([]*brokerLoop, brokers)
			for i := range loops {
				loops[i] = newBrokerLoop(int32(i), "")
				f.addLoops(int32(i), loops[i:i+1])
			}
			res := make([]*kmsg.FetchResponse, brokers)
			for i := range res {
				res[i] = &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: "t"}}}
			}
			for p := 0; p < parts; p++ {
				tp := topicPartition{"t", int32(p)}
				f.leaders.put(tp, int32(p%brokers))
				f.add(&partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}, 0)
				r := &res[p%brokers].Topics[0]
				r.Partitions = append(r.Partitions, kmsg.FetchResponseTopicPartition{Partition: int32(p), HighWatermark: 0, LastStableOffset: -1})
			}
			b.ReportAllocs()
			b.ResetTimer()
			in := 0
			for i := 0; i < b.N; i++ {
				bl := loops[i%brokers]
				r, _ := f.build(bl, false)
				if r == nil {
					b.Fatal("no request")
				}
				in += len(r.states)
				f.deliver(bl, r, res[i%brokers])
			}
			b.ReportMetric(float64(in)/float64(b.N), "partitions/req")
		})
	}
}
