package frameworktest

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// StatsString lays s out one partition a line, for a failure message.
func StatsString(s framework.Stats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "group %s generation %d\n", s.Group, s.Generation)
	ps := append([]framework.PartitionStats(nil), s.Partitions...)
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].Topic != ps[j].Topic {
			return ps[i].Topic < ps[j].Topic
		}
		return ps[i].Partition < ps[j].Partition
	})
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s/%d %-11s processed=%d durable=%d committed=%d hwm=%d lag=%d handled=%d attempts=%d err=%q\n",
			p.Topic, p.Partition, p.State, p.Processed, p.Durable, p.Committed, p.HighWatermark, p.Lag, p.Handled, p.Attempts, p.LastError)
	}
	return b.String()
}

// WantPartitions fails the test (t.Fatalf) unless s holds exactly the
// partitions 0..parts-1 of topic, each once: a check over s.Partitions
// means nothing on an empty or partial list.
func WantPartitions(t testing.TB, s framework.Stats, topic string, parts int) {
	t.Helper()
	seen := map[int]int{}
	ok := len(s.Partitions) == parts
	for _, p := range s.Partitions {
		seen[p.Partition]++
		if p.Topic != topic || p.Partition < 0 || p.Partition >= parts || seen[p.Partition] > 1 {
			ok = false
		}
	}
	if !ok {
		t.Fatalf("Stats holds %d partitions, want %s/0..%d once each:\n%s", len(s.Partitions), topic, parts-1, StatsString(s))
	}
}

// CheckInvariant fails the test (t.Errorf) unless every partition of s
// shows Kafka committed <= durable <= processed.
func CheckInvariant(t testing.TB, s framework.Stats) {
	t.Helper()
	for _, p := range s.Partitions {
		if (p.Committed >= 0 && p.Committed > p.Durable) || p.Durable > p.Processed {
			t.Errorf("invariant broken on %s/%d: committed %d <= durable %d <= processed %d does not hold",
				p.Topic, p.Partition, p.Committed, p.Durable, p.Processed)
		}
	}
}

// WatchInvariant samples r while it runs: every few milliseconds its
// Stats must pass CheckInvariant, and the offset Kafka reports as committed
// for group on topic (parts partitions, asked every tenth sample) must
// never exceed the durable watermark read right after it. The returned
// func stops the sampling and returns the number of samples taken.
func WatchInvariant(t testing.TB, r *Running, cl *testsupport.Cluster, group, topic string, parts int) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	samples := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var kafkaCommitted map[int]int64
			if i%10 == 0 {
				kafkaCommitted, _ = cl.TryCommitted(group, topic, parts)
			}
			st := r.C.Stats()
			CheckInvariant(t, st)
			for _, p := range st.Partitions {
				if c, ok := kafkaCommitted[p.Partition]; ok && c > p.Durable {
					t.Errorf("Kafka committed %d on %s/%d, beyond the durable watermark %d", c, p.Topic, p.Partition, p.Durable)
				}
			}
			samples++
		}
	}()
	var once sync.Once
	stop = func() int {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
		return samples
	}
	t.Cleanup(func() { stop() })
	return stop
}

// BufferedSampler samples a running consumer's Stats.BufferedBytes on a
// goroutine of its own until Stop, keeping the peak and the first sample
// above a limit.
type BufferedSampler struct {
	stop func()

	mu      sync.Mutex
	peak    int64
	samples int
	over    string
}

// SampleBuffered starts sampling r every interval; a sample above limit is
// described with handled(), the messages handled by then. Stop it before
// r stops (Stop also runs at the end of the test).
func SampleBuffered(t testing.TB, r *Running, every time.Duration, limit int64, handled func() int) *BufferedSampler {
	s := &BufferedSampler{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	s.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(s.stop)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(every):
			}
			b := r.C.Stats().BufferedBytes
			s.mu.Lock()
			s.samples++
			if b > s.peak {
				s.peak = b
				if b > limit && s.over == "" {
					s.over = fmt.Sprintf("%d buffered bytes with %d handled", b, handled())
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// Stop ends the sampling and returns the peak, the number of samples and
// the first sample above the limit ("" if none).
func (s *BufferedSampler) Stop() (peak int64, samples int, over string) {
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.samples, s.over
}
