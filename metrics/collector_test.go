package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
	"github.com/tidemark/tidemark/metrics"
)

func TestNewCollectorRefusesNil(t *testing.T) {
	if col, err := metrics.NewCollector(nil); err == nil || col != nil {
		t.Fatalf("NewCollector(nil) = %v, %v; want an error", col, err)
	}
	rec := httptest.NewRecorder()
	metrics.Handler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "nil *framework.Consumer") {
		t.Fatalf("Handler(nil) answered %d %q, want 500 with the error", rec.Code, rec.Body.String())
	}
}

// TestMetricsOfARun runs a consumer on two partitions with known failures,
// a partition held in a Handler call and a paused one, scrapes Handler as
// Prometheus would, parses the exposition back and checks the figures;
// then lints the exposition (promlint, and promtool when installed).
func TestMetricsOfARun(t *testing.T) {
	const (
		parts    = 2
		n        = 40 // messages per partition at first
		k        = 7  // produced to both once the first n are done: partition 1 holds on the first of them
		j        = 5  // produced to both once partition 0 is paused
		attempts = 3
	)
	poison := map[int64]bool{2: true, 11: true, 29: true} // in each partition, below n
	cl := testsupport.Start(t)
	t.Logf("broker %s (a real Kafka: %v)", cl.Upstream, cl.Real)
	topic, dlt, group := testsupport.Name(t, "t"), testsupport.Name(t, "dlt"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	cl.CreateTopic(t, dlt, 1)
	cl.Produce(t, topic, parts, 0, n)

	var calls atomic.Int64
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), nil)
	cfg.Failure = framework.FailurePolicy{Action: framework.DeadLetter, MaxAttempts: attempts, DeadLetterTopic: dlt}
	cfg.Handler = handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		calls.Add(1)
		// Calls of 100 µs or more are each timed (quicker ones are
		// sampled): the histogram's count is then exact.
		time.Sleep(150 * time.Microsecond)
		if poison[m.Offset] {
			return errors.New("poison message")
		}
		if m.Partition == 1 && m.Offset >= n {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := metrics.Handler(c)
	r := frameworktest.Run(t, c)
	t.Cleanup(open) // before the stop run registered
	part := func(s framework.Stats, p int) framework.PartitionStats {
		for _, ps := range s.Partitions {
			if ps.Partition == p {
				return ps
			}
		}
		return framework.PartitionStats{Processed: -1, Durable: -1, Committed: -1, HighWatermark: -1}
	}
	settled := func(p framework.PartitionStats, at int64) bool {
		return p.Processed == at && p.Durable == at && p.Committed == at
	}

	testsupport.WaitFor(t, time.Minute, "the first messages handled, dead-lettered and committed", func() bool {
		s := c.Stats()
		return settled(part(s, 0), n) && settled(part(s, 1), n) && part(s, 0).DeadLettered == 3 && part(s, 1).DeadLettered == 3
	})
	cl.Produce(t, topic, parts, n, k)
	testsupport.WaitFor(t, time.Minute, "partition 0 caught up, partition 1 holding on offset n", func() bool {
		s := c.Stats()
		p1 := part(s, 1)
		return settled(part(s, 0), n+k) && p1.HighWatermark == n+k && p1.InFlight == 1 && p1.LagTime > 0
	})
	if err := c.Pause(topic, 0); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 10*time.Second, "partition 0 paused", func() bool { return part(c.Stats(), 0).State == framework.StatePaused })
	time.Sleep(2 * cfg.FetchMaxWait) // a fetch sent before the pause has returned
	cl.Produce(t, topic, parts, n+k, j)
	testsupport.WaitFor(t, time.Minute, "partition 1 fetched the last messages", func() bool {
		s := c.Stats()
		return part(s, 1).HighWatermark == n+k+j && !s.Rebalancing && s.Commits.OK > 0
	})
	time.Sleep(2 * cfg.FetchMaxWait) // and partition 0 could have, were it fetched

	body, fams := scrape(t, h)
	s := c.Stats()
	t.Logf("after the scrape: %+v", s.Partitions)
	t.Logf("paused partition 0: high watermark %d (log end %d), lag %d", part(s, 0).HighWatermark, n+k+j, part(s, 0).Lag)

	g := map[string]string{"group": group}
	pl := func(p int, extra ...string) map[string]string {
		m := map[string]string{"group": group, "topic": topic, "partition": fmt.Sprint(p)}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	check := func(name string, labels map[string]string, want float64) {
		t.Helper()
		if got := series(t, fams, name, labels); got != want {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	poisoned := float64(len(poison))
	for p, done := range map[int]int64{0: n + k, 1: n} {
		// A message the policy gave up on is done too: it counts as handled.
		check("tidemark_handled_messages_total", pl(p), float64(done))
		check("tidemark_handler_errors_total", pl(p), poisoned*attempts)
		check("tidemark_handler_retries_total", pl(p), poisoned*(attempts-1))
		check("tidemark_dead_lettered_messages_total", pl(p), poisoned)
		check("tidemark_skipped_messages_total", pl(p), 0)
		check("tidemark_processed_offset", pl(p), float64(done))
		check("tidemark_durable_offset", pl(p), float64(done))
		check("tidemark_committed_offset", pl(p), float64(done))
		check("tidemark_undurable_messages", pl(p), 0)
		check("tidemark_uncommitted_messages", pl(p), 0)
		check("tidemark_careful_mode", pl(p), 0)
		check("tidemark_window_full", pl(p), 0)
		check("tidemark_durable_wait", pl(p), 0)
		check("tidemark_waiting_messages", pl(p), 0)
		series(t, fams, "tidemark_buffered_bytes", pl(p))
	}
	check("tidemark_lag_messages", pl(1), k+j)
	check("tidemark_high_watermark_offset", pl(1), n+k+j)
	check("tidemark_in_flight_messages", pl(1), 1)
	check("tidemark_in_flight_messages", pl(0), 0)
	if v := series(t, fams, "tidemark_lag_seconds", pl(1)); !(v > 0) {
		t.Errorf("tidemark_lag_seconds of the partition holding on a message = %v, want > 0", v)
	}
	// The paused partition is left out of fetches: its figures are those
	// of its last fetch, as Stats shows them.
	p0 := part(s, 0)
	check("tidemark_high_watermark_offset", pl(0), float64(p0.HighWatermark))
	check("tidemark_lag_messages", pl(0), float64(p0.Lag))
	for _, st := range framework.PartitionStates() {
		want := map[framework.PartitionState][2]float64{framework.StatePaused: {1, 0}, framework.StateRunning: {0, 1}}[st]
		check("tidemark_partition_state", pl(0, "state", string(st)), want[0])
		check("tidemark_partition_state", pl(1, "state", string(st)), want[1])
		check("tidemark_partitions", map[string]string{"group": group, "state": string(st)}, want[0]+want[1])
	}

	if v := series(t, fams, "tidemark_commits_total", map[string]string{"group": group, "outcome": "ok"}); !(v > 0) {
		t.Errorf(`tidemark_commits_total{outcome="ok"} = %v, want > 0`, v)
	}
	for _, o := range []string{"fenced", "error", "unknown"} {
		series(t, fams, "tidemark_commits_total", map[string]string{"group": group, "outcome": o})
	}
	// Every call returned but partition 1's, still in the Handler.
	checkHistogram(t, fams, "tidemark_handler_duration_seconds", group, uint64(calls.Load()-1))
	checkHistogram(t, fams, "tidemark_offset_file_flush_duration_seconds", group, 0)
	if got, want := calls.Load()-1, int64(2*poisoned*attempts)+int64(2*n-2*poisoned)+k; got != want {
		t.Errorf("%d Handler calls returned, want %d", got, want)
	}
	check("tidemark_rebalancing", g, 0)
	check("tidemark_breaker_trips_total", g, 0)
	check("tidemark_careful_mode_entries_total", g, 0)
	check("tidemark_offset_file_error", g, 0)
	if v := series(t, fams, "tidemark_generation", g); v < 1 {
		t.Errorf("tidemark_generation = %v, want >= 1", v)
	}
	if v := series(t, fams, "tidemark_rebalances_total", g); v < 1 {
		t.Errorf("tidemark_rebalances_total = %v, want >= 1", v)
	}
	if v := series(t, fams, "tidemark_rebalance_seconds_total", g); !(v > 0) {
		t.Errorf("tidemark_rebalance_seconds_total = %v, want > 0", v)
	}
	if v := series(t, fams, "tidemark_fetch_requests_total", g); v < 1 {
		t.Errorf("tidemark_fetch_requests_total = %v, want >= 1", v)
	}
	series(t, fams, "tidemark_consumer_buffered_bytes", g)
	for name, f := range fams {
		if f.GetHelp() == "" {
			t.Errorf("%s has no help text", name)
		}
		for _, m := range f.GetMetric() {
			if v, ok := label(m, "group"); !ok || v != group {
				t.Errorf("a series of %s has group %q, want %q", name, v, group)
			}
		}
	}

	t.Run("promlint", func(t *testing.T) {
		problems, err := promlint.New(strings.NewReader(body)).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	})
	t.Run("promtool", func(t *testing.T) {
		path, err := exec.LookPath("promtool")
		if err != nil {
			t.Skip("promtool is not on PATH: `promtool check metrics` not run (promlint above runs the same rules)")
		}
		cmd := exec.Command(path, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	})
	t.Run("pedantic registry", func(t *testing.T) {
		col, err := metrics.NewCollector(c)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewPedanticRegistry() // checks every metric against its description
		if err := reg.Register(col); err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
		if err := reg.Register(mustCollector(t, c)); err == nil {
			t.Error("a second Collector of the same consumer registered in the same registry: its series would collide")
		}
	})
	open()
	r.Stop(t)
}

func mustCollector(t testing.TB, c *framework.Consumer) *metrics.Collector {
	col, err := metrics.NewCollector(c)
	if err != nil {
		t.Fatal(err)
	}
	return col
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// checkHistogram checks a histogram of the exposition: its buckets
// cumulative, in seconds (framework.LatencyBounds), +Inf equal to the
// count, and the count equal to want (0: at least one observation).
func checkHistogram(t *testing.T, fams map[string]*dto.MetricFamily, name, group string, want uint64) {
	t.Helper()
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) != 1 {
		t.Fatalf("%s: want one histogram series, got %v", name, f)
	}
	h := f.GetMetric()[0].GetHistogram()
	if want == 0 && h.GetSampleCount() == 0 || want != 0 && h.GetSampleCount() != want {
		t.Errorf("%s_count = %d, want %d (0: any but 0)", name, h.GetSampleCount(), want)
	}
	if !(h.GetSampleSum() > 0) {
		t.Errorf("%s_sum = %v, want > 0", name, h.GetSampleSum())
	}
	bs := h.GetBucket() // the text format's +Inf bucket last
	if len(bs) != len(framework.LatencyBounds)+1 {
		t.Fatalf("%s: %d buckets, want %d (framework.LatencyBounds and +Inf)", name, len(bs), len(framework.LatencyBounds)+1)
	}
	if inf := bs[len(bs)-1]; !math.IsInf(inf.GetUpperBound(), 1) || inf.GetCumulativeCount() != h.GetSampleCount() {
		t.Errorf("%s: last bucket le=%v holds %d, want +Inf holding the count %d", name, inf.GetUpperBound(), inf.GetCumulativeCount(), h.GetSampleCount())
	}
	bs = bs[:len(bs)-1]
	prev := uint64(0)
	for i, b := range bs {
		if got, want := b.GetUpperBound(), framework.LatencyBounds[i].Seconds(); math.Abs(got-want) > 1e-12 {
			t.Errorf("%s bucket %d: le %v, want %v", name, i, got, want)
		}
		if b.GetCumulativeCount() < prev || b.GetCumulativeCount() > h.GetSampleCount() {
			t.Errorf("%s bucket le=%v: %d after %d, count %d: not cumulative", name, b.GetUpperBound(), b.GetCumulativeCount(), prev, h.GetSampleCount())
		}
		prev = b.GetCumulativeCount()
	}
}

// TestFrameworkDoesNotImportPrometheus: a program that does not import
// metrics must not compile the Prometheus client.
func TestFrameworkDoesNotImportPrometheus(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		t.Skipf("no go command at %s: %v", goTool, err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/tidemark/tidemark/framework", "github.com/tidemark/tidemark/handler",
		"github.com/tidemark/tidemark/internal/offsetfile").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "prometheus") {
			bad = append(bad, pkg)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("framework, handler or offsetstore depend on %q", bad)
	}
}
