package offsetfile_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// BenchmarkWatermarks8Partitions measures durable offsets per second: 8
// goroutines, one per partition, each record a watermark per processed
// offset (SetWatermark of the next offset) and end every batch of offsets
// with Flush, as a consumer does before it commits to Kafka. The writer
// group-commits, with fsync. One benchmark op is one offset; an offset counts
// once the Flush that follows it has returned, i.e. once it is durable.
func BenchmarkWatermarks8Partitions(b *testing.B) {
	benchWatermarks(b, &offsetfile.Options{}, 500)
}

// BenchmarkWatermarks8PartitionsNoSync is the same without fsync, for
// comparison only.
func BenchmarkWatermarks8PartitionsNoSync(b *testing.B) {
	benchWatermarks(b, &offsetfile.Options{NoSync: true}, 500)
}

// BenchmarkWatermarks8PartitionsFlushEach is the worst case: every
// goroutine waits for each offset to be durable before the next one, so a
// transaction carries at most one offset per partition.
func BenchmarkWatermarks8PartitionsFlushEach(b *testing.B) {
	benchWatermarks(b, &offsetfile.Options{}, 1)
}

// benchWatermarks: batch is the number of offsets per partition between two
// Flush calls (500: a typical poll).
func benchWatermarks(b *testing.B, opts *offsetfile.Options, batch int64) {
	const partitions = 8
	s, err := offsetfile.Open(tempPath(b), opts)
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
			k := offsetfile.Key{Group: "bench", Topic: "events", Partition: int32(p)}
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

// BenchmarkOpenCheck10000 measures Open (read-write, then Close) of a file
// of 10,000 partitions (one group, 20 topics; every tenth partition with
// 5 failure entries, every fifth with completed ranges): the page walk, the
// decoding of every record and failure entry, the load into memory, the
// writer goroutine's start and stop. BenchmarkOpenNoCheck10000 is what Open
// did before it checked the file (bbolt's open and a decoding of every
// record): the difference is the cost of the check.
func BenchmarkOpenCheck10000(b *testing.B) {
	path := openBenchFile(b)
	b.ResetTimer()
	for b.Loop() {
		s, err := offsetfile.Open(path, &offsetfile.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := s.Durable(offsetfile.Key{Group: "billing", Topic: "topic-19", Partition: 499}); !ok {
			b.Fatal("a record is missing")
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenNoCheck10000(b *testing.B) {
	path := openBenchFile(b)
	b.ResetTimer()
	for b.Loop() {
		n, err := offsetfile.OpenUnchecked(path)
		if err != nil {
			b.Fatal(err)
		}
		if n != 10000 {
			b.Fatalf("%d records", n)
		}
	}
}

func openBenchFile(b *testing.B) string {
	b.Helper()
	path := tempPath(b)
	s, err := offsetfile.Open(path, &offsetfile.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10000 {
		k := offsetfile.Key{Group: "billing", Topic: fmt.Sprintf("topic-%02d", i%20), Partition: int32(i / 20)}
		r := offsetfile.Record{Watermark: int64(1000 + i), RecordedAt: at, Generation: 7, Member: "tidemark-3f2a9c",
			Committed: int64(990 + i), CommittedAt: at, Run: &offsetfile.RunState{Inflight: -1},
			LastCommit: &offsetfile.CommitAttempt{Offset: int64(990 + i), Generation: 7, At: at, Outcome: offsetfile.CommitOK, Latency: time.Millisecond}}
		if i%5 == 0 {
			r.Completed = []offsetfile.Range{{From: int64(1002 + i), To: int64(1010 + i)}}
		}
		if err := s.Put(k, r); err != nil {
			b.Fatal(err)
		}
		if i%10 == 0 {
			for j := range 5 {
				f := offsetfile.Failure{Offset: int64(900 + j), At: at, Action: offsetfile.FailureDeadLetter, Attempts: 3,
					Reason: "handler: timeout", DeadLetter: fmt.Sprintf("billing.dlq/0@%d", i*5+j)}
				if err := s.RecordFailure(k, f); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkFlush10000 measures what a consumer's start does to the file
// for a 10,000-partition assignment: a watermark and a run state queued for
// every partition, then one Flush (to the journal) and one Sync (the
// checkpoint). One op is the whole assignment.
func BenchmarkFlush10000(b *testing.B) {
	for _, interval := range []time.Duration{0, time.Hour} {
		b.Run(fmt.Sprintf("SyncInterval=%v", interval), func(b *testing.B) {
			s, err := offsetfile.Open(tempPath(b), &offsetfile.Options{SyncInterval: interval})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := s.Close(); err != nil {
					b.Error(err)
				}
			}()
			ctx := context.Background()
			b.ReportAllocs()
			var flush, sync time.Duration
			for i := 0; b.Loop(); i++ {
				t0 := time.Now()
				for p := range int32(10000) {
					k := offsetfile.Key{Group: "bench", Topic: "events", Partition: p}
					if err := s.SetWatermark(k, int64(i), 1, "member-1"); err != nil {
						b.Fatal(err)
					}
					if err := s.SetRun(k, offsetfile.RunState{Open: true, Inflight: -1}); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := s.Sync(ctx); err != nil {
					b.Fatal(err)
				}
				flush, sync = flush+t1.Sub(t0), sync+time.Since(t1)
			}
			b.ReportMetric(float64(flush.Milliseconds())/float64(b.N), "flush-ms/op")
			b.ReportMetric(float64(sync.Milliseconds())/float64(b.N), "sync-ms/op")
		})
	}
}

// BenchmarkMarkerFlush10000 measures a consumer's steady state on a wide
// topic: 10,000 Markers each moved once, then one Flush (to the journal,
// as every FlushInterval between checkpoints). One op is one such flush;
// ns/key is its cost per partition.
func BenchmarkMarkerFlush10000(b *testing.B) {
	s, err := offsetfile.Open(tempPath(b), &offsetfile.Options{SyncInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	}()
	const n = 10000
	markers := make([]*offsetfile.Marker, n)
	for p := range markers {
		k := offsetfile.Key{Group: "bench-group", Topic: "events-wide", Partition: int32(p)}
		if markers[p], err = s.NewMarker(k, 1, "member-1"); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := int64(1); b.Loop(); i++ {
		for _, m := range markers {
			m.Set(i)
		}
		if err := s.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/key")
}
