package metrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// The suite's helpers, as the root suite's (helpers_test.go there): a
// Config with short intervals, a running Consumer stopped when the test
// ends, and polling.

// fastConfig is a Config for tests on cl: short intervals, so that
// rebalances and commits happen within seconds.
func fastConfig(t testing.TB, cl *testsupport.Cluster, group, topic, file string) framework.Config {
	return framework.Config{
		Brokers:           cl.Brokers,
		GroupID:           group,
		Topics:            []string{topic},
		OffsetFile:        file,
		Logger:            testLogger(t),
		CommitInterval:    100 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		DrainTimeout:      2 * time.Second,
		FetchMaxWait:      200 * time.Millisecond,
		RetryBackoff:      5 * time.Millisecond,
		MaxRetryBackoff:   100 * time.Millisecond,
	}
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

// running is a Consumer whose Run is in progress.
type running struct {
	c      *framework.Consumer
	cancel context.CancelFunc
	done   chan error
}

// run runs c until the test ends or stop is called.
func run(t testing.TB, c *framework.Consumer) *running {
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

// scrape GETs the handler as Prometheus does and returns the body and the
// metric families parsed back from it.
func scrape(t testing.TB, h http.Handler) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET /metrics: Content-Type %q, want the text format", ct)
	}
	body := rec.Body.String()
	p := expfmt.NewTextParser(model.LegacyValidation) // names Prometheus 2 accepts too
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing the exposition: %v\n%s", err, body)
	}
	return body, families
}

// series finds the one series of family name whose labels include want,
// and returns its value (a histogram: its count).
func series(t testing.TB, families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	v, ok := lookup(families, name, want)
	if !ok {
		t.Fatalf("no series %s%v in the exposition", name, want)
	}
	return v
}

func lookup(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	found, v := 0, 0.0
next:
	for _, m := range f.GetMetric() {
		for k, val := range want {
			match := false
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == k && l.GetValue() == val)
			}
			if !match {
				continue next
			}
		}
		found++
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Histogram != nil:
			v = float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		}
	}
	return v, found == 1
}
