package tidemarktest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tidemark/tidemark/framework"
)

// RunTimeout bounds how long Run waits for its condition, and then for
// the Consumer to stop.
const RunTimeout = time.Minute

// A Condition says whether a running Consumer has done what the test
// waits for. Run polls it from the test's goroutine.
type Condition func(c *framework.Consumer) bool

// Handled holds once the Consumer has handled n messages since it started
// (the sum of PartitionStats.Handled over the partitions it holds).
func Handled(n int) Condition {
	return func(c *framework.Consumer) bool {
		var sum uint64
		for _, p := range c.Stats().Partitions {
			sum += p.Handled
		}
		return sum >= uint64(n)
	}
}

// Processed holds once every message of msgs (as Broker.Produce returns
// them) is below its partition's processed watermark: it and every
// message before it in its partition was handled.
func Processed(msgs []kafka.Message) Condition {
	type tp struct {
		topic     string
		partition int
	}
	end := map[tp]int64{} // the offset after the last of msgs, per partition
	for _, m := range msgs {
		k := tp{m.Topic, m.Partition}
		end[k] = max(end[k], m.Offset+1)
	}
	return func(c *framework.Consumer) bool {
		done := 0
		for _, p := range c.Stats().Partitions {
			if e, ok := end[tp{p.Topic, p.Partition}]; ok && p.Processed >= e {
				done++
			}
		}
		return done == len(end)
	}
}

// Run runs a Consumer of cfg until until holds, then stops it as a
// service does on SIGTERM (cancelling Run's context: it drains, flushes
// and commits) and waits for Run to return. It returns the stopped
// Consumer, for its Stats.
//
// Run fills what cfg leaves empty: OffsetFile (a file in t.TempDir()),
// GroupID (a name unique to the test) and Logger (warnings and
// errors logged to t). It fails the test if New refuses cfg, if the
// Consumer's Run returns before until holds or with an error, or if until
// does not hold within RunTimeout. It must be called from the test's
// goroutine.
func Run(t testing.TB, cfg framework.Config, until Condition) *framework.Consumer {
	t.Helper()
	if cfg.OffsetFile == "" {
		cfg.OffsetFile = filepath.Join(t.TempDir(), "offsets.db")
	}
	if cfg.GroupID == "" {
		cfg.GroupID = uniqueName(t, "tidemarktest")
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatalf("tidemarktest: New: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	deadline := time.NewTimer(RunTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !until(c) {
		select {
		case err := <-done:
			t.Fatalf("tidemarktest: Consumer.Run returned before the condition held: %v (%s)", err, summary(c))
		case <-deadline.C:
			cancel()
			err := wait(done)
			t.Fatalf("tidemarktest: the condition did not hold within %s (%s); Run returned %v", RunTimeout, summary(c), err)
		case <-tick.C:
		}
	}
	cancel()
	if err := wait(done); err != nil {
		t.Fatalf("tidemarktest: Consumer.Run: %v (%s)", err, summary(c))
	}
	return c
}

// wait waits up to RunTimeout for Run's result after its cancel.
func wait(done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-time.After(RunTimeout):
		return fmt.Errorf("Run did not return within %s of its cancel", RunTimeout)
	}
}

// summary says what each partition did, for a failure message.
func summary(c *framework.Consumer) string {
	st := c.Stats().Partitions
	if len(st) == 0 {
		return "no partition assigned"
	}
	var b strings.Builder
	for i, p := range st {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s/%d %s: handled %d, processed %d of %d", p.Topic, p.Partition, p.State, p.Handled, p.Processed, p.HighWatermark)
		if p.Attempts > 0 {
			fmt.Fprintf(&b, ", %d attempts on offset %d", p.Attempts, p.Processed)
		}
	}
	return b.String()
}
