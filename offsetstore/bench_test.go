package offsetstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/offsetstore"
)

// BenchmarkWatermarks8Partitions measures durable offsets per second: 8
// goroutines, one per partition, each record a watermark per processed
// offset (SetWatermark of the next offset) and end every batch of offsets
// with Flush, as a consumer does before it commits to Kafka. The writer
// group-commits, with fsync. One benchmark op is one offset; an offset counts
// once the Flush that follows it has returned, i.e. once it is durable.
func BenchmarkWatermarks8Partitions(b *testing.B) {
	benchWatermarks(b, &offsetstore.Options{}, 500)
}

// BenchmarkWatermarks8PartitionsNoSync is the same without fsync, for
// comparison only.
func BenchmarkWatermarks8PartitionsNoSync(b *testing.B) {
	benchWatermarks(b, &offsetstore.Options{NoSync: true}, 500)
}

// BenchmarkWatermarks8PartitionsFlushEach is the worst case: every
// goroutine waits for each offset to be durable before the next one, so a
// transaction carries at most one offset per partition.
func BenchmarkWatermarks8PartitionsFlushEach(b *testing.B) {
	benchWatermarks(b, &offsetstore.Options{}, 1)
}

// benchWatermarks: batch is the number of offsets per partition between two
// Flush calls (500: a typical poll).
func benchWatermarks(b *testing.B, opts *offsetstore.Options, batch int64) {
	const partitions = 8
	s, err := offsetstore.Open(tempPath(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range partitions {
		n := b.N / partitions
		if p < b.N%partitions {
			n++
		}
		wg.Go(func() {
			k := offsetstore.Key{Group: "bench", Topic: "events", Partition: int32(p)}
			for off := int64(0); off < int64(n); {
				end := min(off+batch, int64(n))
				for ; off < end; off++ {
					if err := s.SetWatermark(k, off+1, 1, "member-1"); err != nil {
						b.Error(err)
						return
					}
				}
				if err := s.Flush(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "offsets/s")
}
