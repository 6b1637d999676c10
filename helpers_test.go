package tidemark_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// sessionTimeout is the group session timeout the suite uses: the smallest
// Kafka accepts by default (group.min.session.timeout.ms is 6s).
const sessionTimeout = 6 * time.Second

// baseConfig is a Config tuned for tests: short intervals so that
// rebalances and commits happen within seconds.
func baseConfig(t testing.TB, cl *testsupport.Cluster, group, topic, file string, h handler.Handler) framework.Config {
	return fastConfig(framework.Config{
		Brokers:    cl.Brokers,
		GroupID:    group,
		Topics:     []string{topic},
		OffsetFile: file,
		Handler:    h,
		Logger:     testLogger(t),
	})
}

// fastConfig sets the suite's short intervals on cfg.
func fastConfig(cfg framework.Config) framework.Config {
	cfg.CommitInterval = 100 * time.Millisecond
	cfg.HeartbeatInterval = 300 * time.Millisecond
	cfg.SessionTimeout = sessionTimeout
	cfg.RebalanceTimeout = 10 * time.Second
	cfg.JoinGroupBackoff = 200 * time.Millisecond
	cfg.DrainTimeout = 2 * time.Second
	cfg.FetchMaxWait = 200 * time.Millisecond
	cfg.RetryBackoff = 5 * time.Millisecond
	cfg.MaxRetryBackoff = 100 * time.Millisecond
	return cfg
}

// testLogger logs warnings and errors to the test's output (all levels with
// TIDEMARK_DEBUG=1).
func testLogger(t testing.TB) *zap.Logger {
	level := zapcore.WarnLevel
	if os.Getenv("TIDEMARK_DEBUG") != "" {
		level = zapcore.DebugLevel
	}
	return zaptest.NewLogger(t, zaptest.Level(level))
}

// observedLogger tees the test logger into an observer that tests assert on.
func observedLogger(t testing.TB) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	return zap.New(zapcore.NewTee(testLogger(t).Core(), core)), logs
}

// recorder is a Handler that counts how often each offset was handled and
// checks each message's payload against its partition and offset.
type recorder struct {
	mu    sync.Mutex
	seen  map[int]map[int64]int
	bad   []string
	total int
	// before, if set, runs before a message is recorded; an error from it
	// is returned without recording.
	before func(ctx context.Context, m kafka.Message) error
	// base is the sequence number of offset 0 in each partition.
	base int
}

func newRecorder() *recorder { return &recorder{seen: map[int]map[int64]int{}} }

func (r *recorder) Handle(ctx context.Context, m kafka.Message) error {
	if r.before != nil {
		if err := r.before(ctx, m); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if want := testsupport.Value(m.Partition, r.base+int(m.Offset)); string(m.Value) != string(want) {
		r.bad = append(r.bad, fmt.Sprintf("%s/%d@%d: value %q, want %q", m.Topic, m.Partition, m.Offset, m.Value, want))
	}
	if r.seen[m.Partition] == nil {
		r.seen[m.Partition] = map[int64]int{}
	}
	r.seen[m.Partition][m.Offset]++
	r.total++
	return nil
}

// count is the number of distinct offsets handled.
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.seen {
		n += len(m)
	}
	return n
}

// check compares what was handled with [from, to) in every partition: it
// returns the offsets never handled and the extra handlings.
func (r *recorder) check(partitions int, from, to map[int]int64) (lost []string, dups int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := 0; p < partitions; p++ {
		for o := from[p]; o < to[p]; o++ {
			n := r.seen[p][o]
			if n == 0 {
				lost = append(lost, fmt.Sprintf("%d@%d", p, o))
			}
			if n > 1 {
				dups += n - 1
			}
		}
	}
	return lost, dups
}

func (r *recorder) badValues() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// running is a Consumer whose Run is in progress.
type running struct {
	c      *framework.Consumer
	cancel context.CancelFunc
	done   chan error
}

func startConsumer(t testing.TB, cfg framework.Config) *running {
	t.Helper()
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return runConsumer(t, c)
}

// runConsumer runs c until the test ends or stop is called.
func runConsumer(t testing.TB, c *framework.Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and waits for it; it fails the test if Run returns an
// error or takes longer than 30s.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return within 30s of cancel")
	}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// offsets builds a partition -> offset map with the same value everywhere.
func offsets(partitions int, v int64) map[int]int64 {
	m := make(map[int]int64, partitions)
	for p := 0; p < partitions; p++ {
		m[p] = v
	}
	return m
}

func statsString(s framework.Stats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "group %s generation %d\n", s.Group, s.Generation)
	ps := s.Partitions
	sort.Slice(ps, func(i, j int) bool { return ps[i].Partition < ps[j].Partition })
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s/%d %-11s processed=%d durable=%d committed=%d hwm=%d lag=%d handled=%d attempts=%d err=%q\n",
			p.Topic, p.Partition, p.State, p.Processed, p.Durable, p.Committed, p.HighWatermark, p.Lag, p.Handled, p.Attempts, p.LastError)
	}
	return b.String()
}

// checkInvariant asserts Kafka committed <= durable <= processed for every
// partition of a Stats snapshot.
func checkInvariant(t testing.TB, s framework.Stats) {
	t.Helper()
	for _, p := range s.Partitions {
		if (p.Committed >= 0 && p.Committed > p.Durable) || p.Durable > p.Processed {
			t.Errorf("invariant broken on %s/%d: committed %d <= durable %d <= processed %d does not hold",
				p.Topic, p.Partition, p.Committed, p.Durable, p.Processed)
		}
	}
}

// watchInvariant samples the consumer while it runs: every few
// milliseconds its Stats must show committed <= durable <= processed, and
// the offset Kafka reports as committed must never exceed the durable
// watermark read right after it. The returned func stops the sampling and
// returns the number of samples taken.
func watchInvariant(t testing.TB, r *running, cl *testsupport.Cluster, group, topic string, parts int) (stop func() int) {
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
			st := r.c.Stats()
			checkInvariant(t, st)
			for _, p := range st.Partitions {
				if c, ok := kafkaCommitted[p.Partition]; ok && c > p.Durable {
					t.Errorf("Kafka committed %d on %s/%d, beyond the durable watermark %d", c, p.Topic, p.Partition, p.Durable)
				}
			}
			samples++
		}
	}()
	return func() int {
		close(done)
		wg.Wait()
		return samples
	}
}

// newTopic starts a broker for t and creates a topic of parts partitions
// holding perPart messages each, with Value payloads.
func newTopic(t testing.TB, parts, perPart int) (*testsupport.Cluster, string) {
	t.Helper()
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	cl.Produce(t, topic, parts, 0, perPart)
	return cl, topic
}

// getStatus serves path from c's StatusHandler and returns the body.
func getStatus(t testing.TB, c *framework.Consumer, path string) string {
	t.Helper()
	w := httptest.NewRecorder()
	c.StatusHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w.Body.String()
}
