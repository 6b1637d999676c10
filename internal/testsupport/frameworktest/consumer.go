package frameworktest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// SessionTimeout is the group session timeout of Fast: the smallest Kafka
// accepts by default (group.min.session.timeout.ms is 6s).
const SessionTimeout = 6 * time.Second

// Fast sets short intervals on cfg, so that rebalances and commits happen
// within seconds: commits every 100 ms, heartbeats every 300 ms, a 6 s
// session, fetches that wait at most 200 ms, retries from 5 to 100 ms.
func Fast(cfg framework.Config) framework.Config {
	cfg.CommitInterval = 100 * time.Millisecond
	cfg.HeartbeatInterval = 300 * time.Millisecond
	cfg.SessionTimeout = SessionTimeout
	cfg.RebalanceTimeout = 10 * time.Second
	cfg.JoinGroupBackoff = 200 * time.Millisecond
	cfg.DrainTimeout = 2 * time.Second
	cfg.FetchMaxWait = 200 * time.Millisecond
	cfg.RetryBackoff = 5 * time.Millisecond
	cfg.MaxRetryBackoff = 100 * time.Millisecond
	return cfg
}

// Config is a Fast Config of one group consuming one topic on brokers
// (testsupport.Cluster.Brokers: through the fault proxy), logging to the
// test (testsupport.Logger).
func Config(t testing.TB, brokers []string, group, topic, file string, h handler.Handler) framework.Config {
	return Fast(framework.Config{
		Brokers:    brokers,
		GroupID:    group,
		Topics:     []string{topic},
		OffsetFile: file,
		Handler:    h,
		Logger:     testsupport.Logger(t),
	})
}

// Running is a Consumer whose Run is in progress, on a goroutine of its
// own, until Stop or the end of the test.
type Running struct {
	// C is the consumer.
	C *framework.Consumer

	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // Run's, once done is closed

	mu       sync.Mutex
	reported bool // Run's error was handed to the test (Wait) or reported (Stop)
}

// Start builds a Consumer of cfg (failing the test if New refuses it) and
// runs it, as Run does.
func Start(t testing.TB, cfg framework.Config) *Running {
	t.Helper()
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return Run(t, c)
}

// Run runs c until Stop is called or the test ends.
func Run(t testing.TB, c *framework.Consumer) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{C: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = c.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Stop cancels Run's context and waits for Run to return. It fails the
// test if Run returns an error (unless Wait handed it to the test already)
// or takes longer than 30s. Stopping again does nothing.
func (r *Running) Stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return within 30s of cancel")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil && !r.reported {
		t.Errorf("Run returned %v after cancel, want nil", r.err)
	}
	r.reported = true
}

// StopErr is Stop for a Run expected to return an error: it returns it
// instead of reporting it.
func (r *Running) StopErr(t testing.TB) error {
	t.Helper()
	r.mu.Lock()
	r.reported = true
	r.mu.Unlock()
	r.Stop(t)
	return r.err
}

// Wait waits up to timeout (not at all if it is 0) for Run to return by
// itself, without a Stop, and returns whether it did and its error. An
// error it returns is the test's to check: Stop no longer reports it.
func (r *Running) Wait(timeout time.Duration) (returned bool, err error) {
	if timeout > 0 {
		select {
		case <-r.done:
		case <-time.After(timeout):
		}
	}
	select {
	case <-r.done:
	default:
		return false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reported = true
	return true, r.err
}

// Handled is the number of messages the consumer handled, in all its
// partitions (PartitionStats.Handled).
func (r *Running) Handled() uint64 {
	var n uint64
	for _, p := range r.C.Stats().Partitions {
		n += p.Handled
	}
	return n
}

// CommittedAt counts the running partitions of rs (nil ones skipped) whose
// committed offset is off.
func CommittedAt(off int64, rs ...*Running) int {
	n := 0
	for _, r := range rs {
		if r == nil {
			continue
		}
		for _, p := range r.C.Stats().Partitions {
			if p.State == framework.StateRunning && p.Committed == off {
				n++
			}
		}
	}
	return n
}

// Status serves path from c's StatusHandler, in process, and returns the
// body.
func Status(t testing.TB, c *framework.Consumer, path string) string {
	t.Helper()
	w := httptest.NewRecorder()
	c.StatusHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w.Body.String()
}

// WaitRunning waits up to timeout until parts partitions of r are running.
func WaitRunning(t testing.TB, r *Running, parts int, timeout time.Duration) {
	t.Helper()
	testsupport.WaitFor(t, timeout, fmt.Sprintf("all %d partitions running", parts), func() bool {
		n := 0
		for _, p := range r.C.Stats().Partitions {
			if p.State == framework.StateRunning {
				n++
			}
		}
		return n == parts
	})
}
