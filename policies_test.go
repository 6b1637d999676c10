package tidemark_test

// Failing messages and what is done with them: a message that keeps
// failing, a Handler that panics, each failure policy (dead-letter, skip,
// stop) with each Ordering, a dead-letter topic that refuses writes, is
// missing or has its leaders moved, and Pause and Resume.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
	"github.com/tidemark/tidemark/tidemarktest"
)

// A message whose Handler keeps failing stalls its partition visibly
// (Stats: retrying, attempts, the error) while other partitions move on;
// once it succeeds, nothing was skipped.
func TestFailingMessageStallsOnlyItsPartition(t *testing.T) {
	const parts = 3
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "t", parts)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(600, 30)...)
	target, ends := nthOf(t, msgs, 1, 42), partitionEnds(msgs)
	var healed atomic.Bool
	rec := tidemarktest.NewRecorder(handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		if m.Partition == target.Partition && m.Offset == target.Offset && !healed.Load() {
			return errors.New("downstream unavailable")
		}
		return nil
	}))
	var stalled, after framework.PartitionStats
	done := tidemarktest.Processed(msgs)
	cfg := frameworktest.Config(t, b.Brokers(), b.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), rec)
	tidemarktest.Run(t, cfg, func(c *framework.Consumer) bool {
		ps := c.Stats().Partitions
		if len(ps) != parts {
			return false
		}
		if !healed.Load() {
			// Other partitions done, partition 1 retrying: then it heals.
			if ps[0].Processed == ends[0] && ps[2].Processed == ends[2] && ps[1].State == framework.StateRetrying && ps[1].Attempts >= 3 {
				stalled = ps[1]
				healed.Store(true)
			}
			return false
		}
		after = ps[1]
		return done(c)
	})
	if stalled.Processed != target.Offset || stalled.Lag != ends[1]-target.Offset || !strings.Contains(stalled.LastError, "downstream unavailable") {
		t.Fatalf("stalled partition stats: %+v", stalled)
	}
	if after.State != framework.StateRunning {
		t.Fatalf("state %s after the message succeeded", after.State)
	}
	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
}

// nthOf is the message at offset i of partition p among msgs (as
// tidemarktest's Produce returns them); it fails the test if the keys put
// fewer messages there.
func nthOf(t *testing.T, msgs []kafka.Message, p int, i int64) kafka.Message {
	t.Helper()
	for _, m := range msgs {
		if m.Partition == p && m.Offset == i {
			return m
		}
	}
	t.Fatalf("no message at offset %d of partition %d: the keys spread the messages otherwise", i, p)
	return kafka.Message{}
}

// partitionEnds is, per partition, the offset after the last of msgs.
func partitionEnds(msgs []kafka.Message) map[int]int64 {
	ends := map[int]int64{}
	for _, m := range msgs {
		ends[m.Partition] = max(ends[m.Partition], m.Offset+1)
	}
	return ends
}

// Scenario 6c: a handler that panics is recovered, the message retried, and
// the process lives on; nothing is skipped.
func TestHandlerPanicIsRetried(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "t", 2)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(100, 10)...)
	target := nthOf(t, msgs, 1, 17)
	var panics atomic.Int32
	rec := tidemarktest.NewRecorder(handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		if m.Partition == target.Partition && m.Offset == target.Offset && panics.Add(1) <= 3 {
			panic("cannot parse message 17")
		}
		return nil
	}))
	log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
	cfg := frameworktest.Config(t, b.Brokers(), b.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Logger = log
	tidemarktest.Run(t, cfg, tidemarktest.Processed(msgs))
	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
	if n := panics.Load(); n != 4 {
		t.Fatalf("handler called %d times on the panicking message, want 3 panics and 1 success", n)
	}
	warned := logs.FilterMessage("handler failed; retrying the same message").FilterField(zap.Int64("offset", 17)).Len()
	if warned != 3 {
		t.Fatalf("%d retry warnings for offset 17, want 3", warned)
	}
	for _, e := range logs.FilterMessage("handler failed; retrying the same message").All() {
		if s := e.ContextMap()["error"]; !strings.Contains(s.(string), "handler panicked on "+topic+"/1 at offset 17: cannot parse message 17") {
			t.Fatalf("retry log error %q does not name the message", s)
		}
	}
}

// Issue 3: a handler failing on fixed offsets across 4 partitions x 10,000
// messages, with each failure policy. Every offset ends handled,
// dead-lettered (byte for byte, with the failure headers) or recorded as
// skipped; each poison message gets exactly MaxAttempts calls; partitions
// without a failure keep moving while one is stopped.
func TestFailurePolicies(t *testing.T) {
	const parts, perPart, maxAttempts = 4, 10_000, 3
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	produceWithHeaders(t, cl, topic, parts, perPart)
	// 10 poison offsets per partition, different in each.
	poison := map[int][]int64{}
	for p := 0; p < parts; p++ {
		for o := int64(500 + p); o < perPart; o += 1000 {
			poison[p] = append(poison[p], o)
		}
	}

	// Each policy runs with each ordering: with concurrent calls a failing
	// message holds only itself (its key is its own) while the others go
	// on within the window, kept below the poison spacing (1,000) so that
	// one poison message at a time is in the window.
	var ordering framework.Ordering
	run := func(t *testing.T, fp framework.FailurePolicy, poison map[int][]int64) (*poisonHandler, *frameworktest.Running, string, string) {
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		h := newPoisonHandler(poison)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, h)
		cfg.Failure = fp
		if cfg.Ordering = ordering; ordering != framework.OrderPartition {
			cfg.MaxInFlight, cfg.MaxWindow = 16, 500
		}
		cfg.RetryBackoff, cfg.MaxRetryBackoff = time.Millisecond, 5*time.Millisecond
		return h, frameworktest.Start(t, cfg), group, file
	}
	waitDone := func(t *testing.T, r *frameworktest.Running) {
		testsupport.WaitFor(t, 2*time.Minute, "every partition at the log end", func() bool {
			ps := r.C.Stats().Partitions
			if len(ps) != parts {
				return false
			}
			for _, p := range ps {
				if p.Durable != perPart || p.Committed != perPart {
					return false
				}
			}
			return true
		})
	}
	// checkHandled: every non-poison offset handled exactly once, every
	// poison offset attempted exactly maxAttempts times and never handled.
	checkHandled := func(t *testing.T, h *poisonHandler) {
		for p := 0; p < parts; p++ {
			for _, o := range poison[p] {
				if n := h.rec.Times(p, o); n != 0 || h.attempts(p, o) != maxAttempts {
					t.Errorf("poison %d@%d: handled %d times, attempted %d times (want 0 and %d)", p, o, n, h.attempts(p, o), maxAttempts)
				}
			}
		}
		testsupport.ExactlyOnce(t, handledOrGivenUp(h.rec, poison), testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
		if bad := h.rec.BadValues(); len(bad) > 0 {
			t.Errorf("bad payloads: %v", head(bad))
		}
	}

	for _, ordering = range []framework.Ordering{framework.OrderPartition, framework.OrderKey, framework.OrderNone} {
		t.Run(ordering.String(), func(t *testing.T) { testFailurePolicies(t, cl, topic, poison, run, waitDone, checkHandled) })
	}
}

func testFailurePolicies(t *testing.T, cl *testsupport.Cluster, topic string, poison map[int][]int64,
	run func(t *testing.T, fp framework.FailurePolicy, poison map[int][]int64) (*poisonHandler, *frameworktest.Running, string, string),
	waitDone func(t *testing.T, r *frameworktest.Running), checkHandled func(t *testing.T, h *poisonHandler)) {
	const parts, perPart, maxAttempts = 4, 10_000, 3
	isPoison := func(p int, o int64) bool { return slices.Contains(poison[p], o) }
	t.Run("dead-letter", func(t *testing.T) {
		dlt := testsupport.Name(t, "dlt")
		cl.CreateTopic(t, dlt, 3) // fewer partitions than the source: partition p goes to p % 3
		h, r, group, file := run(t, framework.FailurePolicy{Action: framework.DeadLetter, MaxAttempts: maxAttempts, DeadLetterTopic: dlt}, poison)
		waitDone(t, r)
		stats := r.C.Stats()
		r.Stop(t)
		checkHandled(t, h)
		for _, p := range stats.Partitions {
			if p.DeadLettered != uint64(len(poison[p.Partition])) || p.Skipped != 0 {
				t.Errorf("Stats %s/%d: dead-lettered %d skipped %d, want %d and 0", p.Topic, p.Partition, p.DeadLettered, p.Skipped, len(poison[p.Partition]))
			}
		}
		recs := readTopic(t, cl.Upstream, dlt, 40)
		if len(recs) != 40 {
			t.Fatalf("dead-letter topic holds %d records, want 40", len(recs))
		}
		where := map[string]string{} // "p@o" -> "dlt/part@offset"
		for _, r := range recs {
			sp, _ := header(r, framework.HeaderPartition)
			so, _ := header(r, framework.HeaderOffset)
			p, _ := strconv.Atoi(sp)
			o, _ := strconv.ParseInt(so, 10, 64)
			if !isPoison(p, o) {
				t.Fatalf("dead-lettered %d@%d, not a poison offset", p, o)
			}
			if int(r.Partition) != p%3 {
				t.Errorf("%d@%d went to dead-letter partition %d, want %d", p, o, r.Partition, p%3)
			}
			if !bytes.Equal(r.Key, sourceKey(p, int(o))) || !bytes.Equal(r.Value, testsupport.Value(p, int(o))) {
				t.Errorf("%d@%d: key %q value %q differ from the source", p, o, r.Key, r.Value)
			}
			if len(r.Headers) < 2 || r.Headers[0].Key != "trace-id" || string(r.Headers[0].Value) != fmt.Sprintf("trace-%d-%d", p, o) ||
				r.Headers[1].Key != "binary" || !bytes.Equal(r.Headers[1].Value, []byte{0, 1, 2, 0xff, byte(o)}) {
				t.Errorf("%d@%d: source headers not kept first and intact: %v", p, o, r.Headers)
			}
			for k, want := range map[string]string{
				framework.HeaderTopic: topic, framework.HeaderAttempts: strconv.Itoa(maxAttempts),
				framework.HeaderError: fmt.Sprintf("poison %d@%d", p, o), framework.HeaderGroup: group,
			} {
				if got, ok := header(r, k); !ok || got != want {
					t.Errorf("%d@%d: header %s = %q, want %q", p, o, k, got, want)
				}
			}
			for _, k := range []string{framework.HeaderTime, framework.HeaderTimestamp} {
				v, _ := header(r, k)
				if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
					t.Errorf("%d@%d: header %s = %q: %v", p, o, k, v, err)
				}
			}
			where[fmt.Sprintf("%d@%d", p, o)] = fmt.Sprintf("%s/%d@%d", dlt, r.Partition, r.Offset)
		}
		fs, recsByPart := storeFailures(t, file, group, topic, parts)
		for p := 0; p < parts; p++ {
			if len(fs[p]) != len(poison[p]) || recsByPart[p].DeadLettered != int64(len(poison[p])) {
				t.Errorf("partition %d: %d failure entries, count %d; want %d", p, len(fs[p]), recsByPart[p].DeadLettered, len(poison[p]))
			}
			for _, f := range fs[p] {
				key := fmt.Sprintf("%d@%d", p, f.Offset)
				if f.Action != offsetfile.FailureDeadLetter || f.Attempts != maxAttempts || f.DeadLetter != where[key] {
					t.Errorf("failure entry %s = %+v, want dead-lettered at %s", key, f, where[key])
				}
			}
		}
		t.Logf("4 x %d messages: %d handled, 40 dead-lettered (byte for byte, with headers), 0 lost", perPart, h.rec.Count())
	})

	t.Run("skip", func(t *testing.T) {
		h, r, group, file := run(t, framework.FailurePolicy{Action: framework.Skip, MaxAttempts: maxAttempts}, poison)
		waitDone(t, r)
		stats := r.C.Stats()
		r.Stop(t)
		checkHandled(t, h)
		for _, p := range stats.Partitions {
			if p.Skipped != uint64(len(poison[p.Partition])) || p.DeadLettered != 0 {
				t.Errorf("Stats %s/%d: skipped %d, want %d", p.Topic, p.Partition, p.Skipped, len(poison[p.Partition]))
			}
		}
		fs, recs := storeFailures(t, file, group, topic, parts)
		for p := 0; p < parts; p++ {
			var got []int64
			for _, f := range fs[p] {
				got = append(got, f.Offset)
				if f.Action != offsetfile.FailureSkip || f.Attempts != maxAttempts || f.Reason != fmt.Sprintf("poison %d@%d", p, f.Offset) || f.At.IsZero() {
					t.Errorf("partition %d: failure entry %+v", p, f)
				}
			}
			if !slices.Equal(got, poison[p]) || recs[p].Skipped != int64(len(poison[p])) {
				t.Errorf("partition %d: skipped %v (count %d), want %v", p, got, recs[p].Skipped, poison[p])
			}
		}
		t.Logf("4 x %d messages: %d handled, 40 skipped and listed in the offset file, 0 lost", perPart, h.rec.Count())
	})

	t.Run("stop", func(t *testing.T) {
		// Poison in partition 0 only: it stops on each one until resumed
		// (the test heals the message first); the others run to the end
		// meanwhile.
		only0 := map[int][]int64{0: poison[0]}
		h, r, group, file := run(t, framework.FailurePolicy{Action: framework.Stop, MaxAttempts: maxAttempts}, only0)
		for i, o := range only0[0] {
			testsupport.WaitFor(t, time.Minute, fmt.Sprintf("partition 0 stopped at %d", o), func() bool {
				for _, p := range r.C.Stats().Partitions {
					if p.Partition == 0 {
						return p.State == framework.StateStopped && p.Processed == o
					}
				}
				return false
			})
			if i == 0 {
				// While partition 0 is stopped, the others reach the end.
				testsupport.WaitFor(t, time.Minute, "partitions 1-3 at the log end while 0 is stopped", func() bool {
					n := 0
					for _, p := range r.C.Stats().Partitions {
						if p.Partition != 0 && p.Durable == perPart {
							n++
						}
						if p.Partition == 0 && p.Processed != o {
							t.Fatalf("partition 0 moved past its stop: %s", frameworktest.StatsString(r.C.Stats()))
						}
					}
					return n == parts-1
				})
			}
			if n := h.attempts(0, o); n != maxAttempts {
				t.Errorf("0@%d attempted %d times before the stop, want %d", o, n, maxAttempts)
			}
			h.heal(0, o)
			if err := r.C.Resume(topic, 0); err != nil {
				t.Fatal(err)
			}
		}
		waitDone(t, r)
		r.Stop(t)
		testsupport.ExactlyOnce(t, h.rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
		fs, _ := storeFailures(t, file, group, topic, parts)
		if n := len(fs[0]) + len(fs[1]) + len(fs[2]) + len(fs[3]); n != 0 {
			t.Errorf("%d failure entries with Stop: nothing is skipped", n)
		}
		t.Logf("partition 0 stopped and was resumed %d times; the others finished meanwhile; all 4 x %d handled once", len(only0[0]), perPart)
	})
}

// Issue 3: while the dead-letter topic cannot be written (produce requests
// fail), the partition waits on the message: nothing is skipped, nothing
// after it is handled, and once writes succeed the message is
// dead-lettered exactly once and the partition finishes.
func TestDeadLetterTopicUnavailable(t *testing.T) {
	const perPart = 200
	cl, topic := testsupport.NewTopic(t, 1, perPart)
	dlt := testsupport.Name(t, "dlt")
	cl.CreateTopic(t, dlt, 1)
	group := testsupport.Name(t, "g")
	file := filepath.Join(t.TempDir(), "o.db")
	h := newPoisonHandler(map[int][]int64{0: {50}})
	rule, err := cl.Proxy.Fail(kmsg.Produce, 19 /* NOT_ENOUGH_REPLICAS */)
	if err != nil {
		t.Fatal(err)
	}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, h)
	cfg.Failure = framework.FailurePolicy{Action: framework.DeadLetter, MaxAttempts: 2, DeadLetterTopic: dlt}
	cfg.RetryBackoff, cfg.MaxRetryBackoff = time.Millisecond, 50*time.Millisecond
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "several failed dead-letter writes", func() bool { return rule.Applied() >= 10 })
	st := r.C.Stats().Partitions[0]
	if st.State != framework.StateDeadLettering || st.Processed != 50 || st.Durable != 50 || st.Skipped != 0 || !strings.Contains(st.LastError, "dead-letter write of offset 50") {
		t.Fatalf("while the dead-letter topic fails: %s", frameworktest.StatsString(r.C.Stats()))
	}
	if n := h.rec.Count(); n != 50 {
		t.Fatalf("handled %d messages while waiting on offset 50, want 50", n)
	}
	// The consumer says so where operators look: Stats, readiness, the page.
	s := r.C.Stats()
	if !strings.Contains(s.DeadLetterError, strconv.Quote(dlt)) || !strings.Contains(s.DeadLetterError, "Not Enough Replicas") ||
		s.DeadLetterErrorSince.IsZero() {
		t.Fatalf("Stats.DeadLetterError %q since %v, want the topic, the broker's error and since when", s.DeadLetterError, s.DeadLetterErrorSince)
	}
	if err := r.C.Ready(); err == nil || !strings.Contains(err.Error(), strconv.Quote(dlt)) || !strings.Contains(err.Error(), "since") {
		t.Fatalf("Ready() = %v while the dead-letter topic refuses writes, want an error naming it and since when", err)
	}
	if page := frameworktest.Status(t, r.C, "/status"); !strings.Contains(page, `id="dead-letter-trouble"`) || !strings.Contains(page, dlt) {
		t.Fatalf("the status page does not show the dead-letter trouble:\n%s", page)
	}
	rule.Remove()
	testsupport.WaitFor(t, time.Minute, "the partition at the log end", func() bool {
		return r.C.Stats().Partitions[0].Durable == perPart
	})
	if s := r.C.Stats(); s.DeadLetterError != "" {
		t.Fatalf("Stats.DeadLetterError %q after a write succeeded, want none", s.DeadLetterError)
	}
	if err := r.C.Ready(); err != nil {
		t.Fatalf("Ready() = %v once dead-letter writes succeed again", err)
	}
	r.Stop(t)
	testsupport.ExactlyOnce(t, h.rec, testsupport.Offsets(1, 51), testsupport.Offsets(1, perPart))
	recs := readTopic(t, cl.Upstream, dlt, 1)
	if len(recs) != 1 || !bytes.Equal(recs[0].Value, testsupport.Value(0, 50)) {
		t.Fatalf("dead-letter topic: %d records, want exactly offset 50", len(recs))
	}
	fs, _ := storeFailures(t, file, group, topic, 1)
	if len(fs[0]) != 1 || fs[0][0].Action != offsetfile.FailureDeadLetter || fs[0][0].Offset != 50 {
		t.Fatalf("failure entries %+v", fs[0])
	}
	t.Logf("%d produce requests to the dead-letter topic failed; the partition waited on offset 50, then dead-lettered it once; 0 skipped, 0 lost", rule.Applied())
}

// A dead-letter topic that does not exist is found when the consumer
// starts, not at the first message given up on: Run returns an error
// naming it, having handled nothing.
func TestDeadLetterTopicMissing(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "t", 1)
	b.Produce(t, topic, tidemarktest.Keyed(10, 10)...)
	dlt := b.Name(t, "dlt-missing")
	rec := tidemarktest.NewRecorder(nil)
	cfg := frameworktest.Config(t, b.Brokers(), b.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Failure = framework.FailurePolicy{Action: framework.DeadLetter, MaxAttempts: 2, DeadLetterTopic: dlt}
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), strconv.Quote(dlt)) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Run() = %v, want an error saying the dead-letter topic %q does not exist", err, dlt)
	}
	if ctx.Err() != nil {
		t.Fatalf("Run returned only when its context ended: %v", err)
	}
	if n := rec.Count(); n != 0 {
		t.Fatalf("handled %d messages, want none before the dead-letter topic is known", n)
	}
	t.Logf("Run: %v", err)
}

// Issue 3: Pause and Resume under load. A paused partition handles nothing
// after the call in flight, in Stats as paused; the others keep going; a
// partition paused before Run is never handled until resumed. Nothing is
// lost or handled twice.
func TestPauseResumeUnderLoad(t *testing.T) {
	const parts, perPart = 4, 3000
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	rec.Before = func(context.Context, kafka.Message) error { time.Sleep(100 * time.Microsecond); return nil }
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		topic string
		p     int
	}{{"not-consumed", 0}, {topic, -1}} {
		if err := c.Pause(bad.topic, bad.p); err == nil {
			t.Errorf("Pause(%q, %d) accepted", bad.topic, bad.p)
		}
	}
	if err := c.Pause(topic, 3); err != nil { // before Run
		t.Fatal(err)
	}
	r := frameworktest.Run(t, c)
	part := func(p int) framework.PartitionStats {
		for _, s := range r.C.Stats().Partitions {
			if s.Partition == p {
				return s
			}
		}
		return framework.PartitionStats{Partition: p, Processed: -1}
	}
	testsupport.WaitFor(t, time.Minute, "partition 1 under way", func() bool { return part(1).Processed > 200 })
	if err := r.C.Pause(topic, 1); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 10*time.Second, "partition 1 paused", func() bool { return part(1).State == framework.StatePaused })
	frozen := part(1).Processed
	testsupport.WaitFor(t, time.Minute, "partitions 0 and 2 at the log end", func() bool {
		if p1, p3 := part(1), part(3); p1.Processed != frozen || p1.Handled != uint64(frozen) || p3.Handled != 0 {
			t.Fatalf("a paused partition moved: %s", frameworktest.StatsString(r.C.Stats()))
		}
		return part(0).Durable == perPart && part(2).Durable == perPart
	})
	if p1 := part(1); !p1.Paused || p1.Processed >= perPart {
		t.Fatalf("partition 1: %+v", p1)
	}
	for _, p := range []int{1, 3} {
		if err := r.C.Resume(topic, p); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.WaitFor(t, time.Minute, "every partition at the log end", func() bool {
		for p := 0; p < parts; p++ {
			if part(p).Durable != perPart {
				return false
			}
		}
		return true
	})
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	t.Logf("partition 1 paused at %d while 0 and 2 finished; partition 3 paused from the start; all resumed; 0 lost, 0 twice", frozen)
}

// Pausing a partition that is not assigned (and may not exist) keeps it out
// of Stats until it is assigned; the pause then applies.
func TestPauseUnassignedPartition(t *testing.T) {
	cl, topic := testsupport.NewTopic(t, 2, 10)
	rec := &testsupport.Recorder{}
	c, err := framework.New(frameworktest.Config(t, cl.Brokers, testsupport.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), rec))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{1, 7} {
		if err := c.Pause(topic, p); err != nil {
			t.Fatal(err)
		}
	}
	if ps := c.Stats().Partitions; len(ps) != 0 {
		t.Fatalf("Stats before Run shows %d partitions: %+v", len(ps), ps)
	}
	r := frameworktest.Run(t, c)
	testsupport.WaitFor(t, time.Minute, "partition 0 consumed", func() bool { return rec.Count() == 10 })
	if err := r.C.Pause(topic, 9); err != nil {
		t.Fatal(err)
	}
	if err := r.C.Resume(topic, 7); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 10*time.Second, "partition 1 paused", func() bool {
		ps := r.C.Stats().Partitions
		return len(ps) == 2 && ps[1].Partition == 1 && ps[1].State == framework.StatePaused
	})
	for _, p := range r.C.Stats().Partitions {
		if p.Partition > 1 {
			t.Fatalf("Stats shows partition %d of a 2-partition topic: %s", p.Partition, frameworktest.StatsString(r.C.Stats()))
		}
	}
}

// The dead-letter topic's partition leaders move between the three brokers
// of a cluster, six times, while the failure policy dead-letters messages
// into it: every poison message is on the dead-letter topic exactly once,
// every other message handled once, and the source's commits reach its
// log end.
func TestDeadLetterLeadersMove(t *testing.T) {
	if testsupport.RealBroker() {
		t.Skip("moves leaders with kfake's controls: the real-broker variant needs a 3-node cluster")
	}
	const brokers, moves = 3, 6
	const parts, perPart, dltParts = 4, 2000, 3
	const every = 20 // one poison message in every 20: 400 dead-lettered
	topic, dlt, group := testsupport.Name(t, "t"), testsupport.Name(t, "dlt"), testsupport.Name(t, "g")
	fake, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.GroupMinSessionTimeout(time.Second),
		kfake.SeedTopics(parts, topic), kfake.SeedTopics(dltParts, dlt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	addrs := fake.ListenAddrs()
	kc := testsupport.NewProducer(t, addrs)
	for p := 0; p < parts; p++ {
		if err := testsupport.ProduceSync(kc, testsupport.ValueRecords(topic, p, 0, perPart)); err != nil {
			t.Fatal(err)
		}
	}
	poison := map[int][]int64{}
	for p := 0; p < parts; p++ {
		for o := int64(p); o < perPart; o += every {
			poison[p] = append(poison[p], o)
		}
	}
	const total = parts * perPart / every
	h := newPoisonHandler(poison)
	h.rec.Before = func(context.Context, kafka.Message) error {
		time.Sleep(100 * time.Microsecond) // spread the dead-lettering over the moves
		return nil
	}
	cfg := frameworktest.Config(t, addrs, group, topic, filepath.Join(t.TempDir(), "o.db"), h)
	cfg.Failure = framework.FailurePolicy{Action: framework.DeadLetter, MaxAttempts: 2, DeadLetterTopic: dlt}
	cfg.RetryBackoff, cfg.MaxRetryBackoff = time.Millisecond, 5*time.Millisecond
	r := frameworktest.Start(t, cfg)
	deadLettered := func() int {
		n := 0
		for _, p := range r.C.Stats().Partitions {
			n += int(p.DeadLettered)
		}
		return n
	}
	// Move every dead-letter partition to the next broker each time
	// another sixth of the poison messages has been dead-lettered.
	var at []int
	for i := 1; i <= moves; i++ {
		want := i * total / (moves + 1)
		testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("%d messages dead-lettered before move %d", want, i), func() bool { return deadLettered() >= want })
		for p := int32(0); p < dltParts; p++ {
			next := (fake.LeaderFor(dlt, p) + 1) % brokers
			if err := fake.MoveTopicPartition(dlt, p, next); err != nil {
				t.Fatalf("move %d of %s/%d to broker %d: %v", i, dlt, p, next, err)
			}
		}
		at = append(at, deadLettered())
	}
	if at[len(at)-1] >= total {
		t.Fatalf("every message was dead-lettered by the last move (%v): the moves did not overlap the writes", at)
	}
	testsupport.WaitFor(t, time.Minute, "every partition handled and committed at its log end", func() bool {
		ps := r.C.Stats().Partitions
		n := 0
		for _, p := range ps {
			if p.Committed == perPart && p.Durable == perPart {
				n++
			}
		}
		return n == parts
	})
	r.Stop(t)

	// Every non-poison offset once, every poison offset tried MaxAttempts
	// times and never handled.
	for p := 0; p < parts; p++ {
		for _, o := range poison[p] {
			if n := h.rec.Times(p, o); n != 0 || h.attempts(p, o) != 2 {
				t.Errorf("poison %d@%d: handled %d times, attempted %d (want 0 and 2)", p, o, n, h.attempts(p, o))
			}
		}
	}
	testsupport.ExactlyOnce(t, handledOrGivenUp(h.rec, poison), testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	// The dead-letter topic: each poison message exactly once (every other
	// offset counted once, so that the check covers the poison ones alone).
	recs := readTopic(t, addrs[0], dlt, total)
	onDLT := map[testsupport.Offset]int{}
	for _, rec := range recs {
		sp, _ := header(rec, framework.HeaderPartition)
		so, _ := header(rec, framework.HeaderOffset)
		p, _ := strconv.Atoi(sp)
		o, _ := strconv.ParseInt(so, 10, 64)
		if !slices.Contains(poison[p], o) || !bytes.Equal(rec.Value, testsupport.Value(p, int(o))) {
			t.Errorf("%s/%d@%d holds %d@%d %q: not a poison message", dlt, rec.Partition, rec.Offset, p, o, rec.Value)
		}
		onDLT[testsupport.Offset{Partition: p, Offset: o}]++
	}
	testsupport.ExactlyOnce(t, testsupport.HandledFunc(func(p int, o int64) int {
		if slices.Contains(poison[p], o) {
			return onDLT[testsupport.Offset{Partition: p, Offset: o}]
		}
		return 1
	}), testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	if len(recs) != total {
		t.Fatalf("dead-letter topic: %d records for %d poison messages", len(recs), total)
	}
	t.Logf("%d messages dead-lettered while the dead-letter topic's leaders moved %d times (at %v dead-lettered): each on it exactly once",
		total, moves, at)
}

// produceWithHeaders appends n messages to every partition of topic, each
// with a key, a Value payload and two headers, so that a dead-lettered copy
// can be compared byte for byte.
func produceWithHeaders(t testing.TB, cl *testsupport.Cluster, topic string, parts, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const chunk = 2000
	for p := 0; p < parts; p++ {
		for i := 0; i < n; i += chunk {
			for attempt := 1; ; attempt++ {
				var recs []kafka.Record
				for j := i; j < n && j < i+chunk; j++ {
					recs = append(recs, kafka.Record{
						Key:   kafka.NewBytes(sourceKey(p, j)),
						Value: kafka.NewBytes(testsupport.Value(p, j)),
						Headers: []kafka.Header{
							{Key: "trace-id", Value: []byte(fmt.Sprintf("trace-%d-%d", p, j))},
							{Key: "binary", Value: []byte{0, 1, 2, 0xff, byte(j)}},
						},
					})
				}
				res, err := cl.Client().Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p,
					RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(recs...)})
				if err == nil {
					err = res.Error
				}
				if err == nil {
					break
				}
				var ke kafka.Error
				if !errors.As(err, &ke) || !ke.Temporary() || attempt == 50 {
					t.Fatalf("producing to %s/%d: %v", topic, p, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

func sourceKey(p, j int) []byte { return fmt.Appendf(nil, "key-%d-%d", p, j) }

// poisonHandler fails every attempt on the offsets it is given and records
// every other message, and how often each poison offset was attempted.
type poisonHandler struct {
	rec    *testsupport.Recorder
	mu     sync.Mutex
	poison map[int]map[int64]bool
	tries  map[string]int
}

func newPoisonHandler(poison map[int][]int64) *poisonHandler {
	h := &poisonHandler{rec: &testsupport.Recorder{}, poison: map[int]map[int64]bool{}, tries: map[string]int{}}
	for p, offs := range poison {
		h.poison[p] = map[int64]bool{}
		for _, o := range offs {
			h.poison[p][o] = true
		}
	}
	return h
}

func (h *poisonHandler) Handle(ctx context.Context, m kafka.Message) error {
	h.mu.Lock()
	bad := h.poison[m.Partition][m.Offset]
	if bad {
		h.tries[fmt.Sprintf("%d@%d", m.Partition, m.Offset)]++
	}
	h.mu.Unlock()
	if bad {
		return fmt.Errorf("poison %d@%d", m.Partition, m.Offset)
	}
	return h.rec.Handle(ctx, m)
}

// heal makes the poison offset succeed from now on.
func (h *poisonHandler) heal(p int, o int64) {
	h.mu.Lock()
	delete(h.poison[p], o)
	h.mu.Unlock()
}

func (h *poisonHandler) attempts(p int, o int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tries[fmt.Sprintf("%d@%d", p, o)]
}

// readTopic reads every record of topic from the start, from the broker at
// seed, until want records arrived or a minute passed.
func readTopic(t testing.TB, seed, topic string, want int) []*kgo.Record {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(seed), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		fs := kc.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	// Anything beyond want would be a duplicate: look a little longer.
	sctx, scancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer scancel()
	kc.PollFetches(sctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	return out
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// handledOrGivenUp is what rec handled, with the poison offsets (which
// the failure policy gave up on) counted as handled once.
func handledOrGivenUp(rec *testsupport.Recorder, poison map[int][]int64) testsupport.Handled {
	return testsupport.HandledFunc(func(p int, o int64) int {
		if slices.Contains(poison[p], o) {
			return 1
		}
		return rec.Times(p, o)
	})
}

// storeFailures opens the offset file read-only and returns each
// partition's failure entries and durable record.
func storeFailures(t testing.TB, file, group, topic string, parts int) (map[int][]offsetfile.Failure, map[int]offsetfile.Record) {
	t.Helper()
	s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fs, recs := map[int][]offsetfile.Failure{}, map[int]offsetfile.Record{}
	for p := 0; p < parts; p++ {
		k := offsetfile.Key{Group: group, Topic: topic, Partition: int32(p)}
		f, err := s.Failures(k)
		if err != nil {
			t.Fatal(err)
		}
		fs[p] = f
		recs[p], _ = s.Durable(k)
	}
	return fs, recs
}

// A Handler call cancelled by a graceful stop is not an attempt that
// counts: with Skip after one attempt, the message the stop interrupted is
// not recorded as skipped, and the next run handles it. Each Ordering, and
// the BatchHandler split down to that message.
func TestStopIsNotAFailedAttempt(t *testing.T) {
	const perPart, stuck = 100, 50
	for _, tc := range []struct {
		name  string
		order framework.Ordering
		batch bool
	}{
		{"partition", framework.OrderPartition, false},
		{"key", framework.OrderKey, false},
		{"none", framework.OrderNone, false},
		{"batch", framework.OrderPartition, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tidemarktest.NewBroker(t)
			topic := b.CreateTopic(t, "t", 1)
			msgs := b.Produce(t, topic, tidemarktest.Keyed(perPart, perPart)...) // a key each: OrderKey orders nothing
			group, file := b.Name(t, "g"), filepath.Join(t.TempDir(), "o.db")
			var hold atomic.Bool
			hold.Store(true)
			reached := make(chan struct{}, 1)
			rec := tidemarktest.NewRecorder(handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
				if m.Offset == stuck && hold.Load() {
					select {
					case reached <- struct{}{}:
					default:
					}
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}))
			config := func() framework.Config {
				cfg := frameworktest.Config(t, b.Brokers(), group, topic, file, rec)
				cfg.Failure = framework.FailurePolicy{Action: framework.Skip, MaxAttempts: 1}
				cfg.DrainTimeout = time.Second
				cfg.Ordering = tc.order
				if tc.order != framework.OrderPartition {
					cfg.MaxInFlight = 4
				}
				if tc.batch {
					cfg.Handler, cfg.BatchSize = nil, 16
					cfg.BatchHandler = handler.BatchHandlerFunc(func(ctx context.Context, msgs []kafka.Message) error {
						for _, m := range msgs {
							if err := rec.Handle(ctx, m); err != nil {
								return err
							}
						}
						return nil
					})
				}
				return cfg
			}
			// The stop comes while offset 50 is in its call.
			c := tidemarktest.Run(t, config(), func(*framework.Consumer) bool { return len(reached) > 0 })
			if s := c.Stats().Partitions; len(s) != 1 || s[0].Skipped != 0 {
				t.Fatalf("after the stop: %+v, want nothing skipped", s)
			}
			hold.Store(false)
			tidemarktest.Run(t, config(), tidemarktest.Processed(msgs))
			times := 0
			for _, m := range rec.Handled() {
				if m.Offset == stuck {
					times++
				}
			}
			if times != 1 {
				t.Errorf("offset %d handled %d times, want once, by the second run", stuck, times)
			}
			opts := []tidemarktest.CheckOption{tidemarktest.AllowDuplicates()}
			if tc.order == framework.OrderNone {
				opts = append(opts, tidemarktest.IgnoreOrder())
			}
			if err := rec.Check(msgs, opts...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A Handler's panic is logged with its stack on the first attempt and when
// the policy gives the message up, and Stats carries it; a graceful stop
// keeps the partition's real error and attempts instead of "context
// canceled".
func TestPanicStackAndStopKeepTheError(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "t", 2)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(40, 40)...)
	nthOf(t, msgs, 0, 4)
	nthOf(t, msgs, 1, 4)
	log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
	cfg := frameworktest.Config(t, b.Brokers(), b.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"),
		handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
			if m.Offset == 4 {
				panicAtFour(m.Partition)
			}
			return nil
		}))
	cfg.Logger = log
	cfg.TopicFailure = map[string]framework.FailurePolicy{topic: {Action: framework.Skip, MaxAttempts: 1000}}
	cfg.MaxRetryBackoff = 20 * time.Millisecond
	var running []framework.PartitionStats
	var withStack []observer.LoggedEntry
	c := tidemarktest.Run(t, cfg, func(c *framework.Consumer) bool {
		// Offset 4 retried on both partitions: what Stats and the log
		// say while it runs.
		ps := c.Stats().Partitions
		if len(ps) != 2 || ps[0].Attempts < 5 || ps[1].Attempts < 5 {
			return false
		}
		running = ps
		withStack = logs.FilterMessage("handler failed; retrying the same message").FilterFieldKey("panic_stack").All()
		return true
	})
	for _, p := range running {
		if !strings.Contains(p.PanicStack, "panicAtFour") || !strings.Contains(p.LastError, "handler panicked") {
			t.Fatalf("partition %d: PanicStack %.200q, LastError %q: want the panic's stack and error", p.Partition, p.PanicStack, p.LastError)
		}
	}
	if len(withStack) != 2 {
		t.Fatalf("%d retry logs carry the stack, want 2 (the first attempt of each partition)", len(withStack))
	}
	for _, e := range withStack {
		if e.ContextMap()["attempt"] != int64(1) || !strings.Contains(e.ContextMap()["panic_stack"].(string), "panicAtFour") {
			t.Fatalf("stack logged as %v", e.ContextMap())
		}
	}
	for _, p := range c.Stats().Partitions {
		if !strings.Contains(p.LastError, "handler panicked") || p.Attempts < 5 || p.PanicStack == "" {
			t.Fatalf("after the stop, partition %d: LastError %q, Attempts %d: want the panic and its attempts", p.Partition, p.LastError, p.Attempts)
		}
	}
}

func panicAtFour(partition int) { panic(fmt.Sprintf("bad record on partition %d", partition)) }
