package tidemark_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/offsetstore"
)

// orderChecker is a Handler that checks the order guarantees of an
// Ordering while it records what it handled: calls of one key never
// overlap and come in offset order (OrderKey), calls of a partition never
// overlap (OrderPartition), and no partition has more than max calls at
// once.
type orderChecker struct {
	rec      *recorder
	ordering framework.Ordering
	max      int
	work     time.Duration

	mu        sync.Mutex
	keyBusy   map[string]bool
	keyLast   map[string]int64
	inFlight  map[int]int
	peak      map[int]int
	unordered int // calls that started while an earlier offset of the partition was still in a call
	violation []string
}

func newOrderChecker(o framework.Ordering, max int, work time.Duration) *orderChecker {
	return &orderChecker{rec: newRecorder(), ordering: o, max: max, work: work,
		keyBusy: map[string]bool{}, keyLast: map[string]int64{}, inFlight: map[int]int{}, peak: map[int]int{}}
}

func (h *orderChecker) Handle(ctx context.Context, m kafka.Message) error {
	key := fmt.Sprintf("%d/%s", m.Partition, m.Key)
	h.mu.Lock()
	h.inFlight[m.Partition]++
	n := h.inFlight[m.Partition]
	h.peak[m.Partition] = max(h.peak[m.Partition], n)
	if n > h.max {
		h.violation = append(h.violation, fmt.Sprintf("%d calls at once on partition %d (max %d)", n, m.Partition, h.max))
	}
	if h.ordering == framework.OrderPartition && n > 1 {
		h.violation = append(h.violation, fmt.Sprintf("concurrent calls on partition %d with OrderPartition", m.Partition))
	}
	if m.Key != nil && h.ordering != framework.OrderNone {
		if h.keyBusy[key] {
			h.violation = append(h.violation, fmt.Sprintf("key %s: concurrent calls (offset %d)", key, m.Offset))
		}
		if last, ok := h.keyLast[key]; ok && last >= m.Offset {
			h.violation = append(h.violation, fmt.Sprintf("key %s: offset %d after %d", key, m.Offset, last))
		}
		h.keyBusy[key], h.keyLast[key] = true, m.Offset
	}
	if n > 1 {
		h.unordered++
	}
	h.mu.Unlock()
	if h.work > 0 {
		time.Sleep(h.work)
	}
	err := h.rec.Handle(ctx, m)
	h.mu.Lock()
	h.inFlight[m.Partition]--
	if m.Key != nil && h.ordering != framework.OrderNone {
		h.keyBusy[key] = false
	}
	h.mu.Unlock()
	return err
}

// keyOf gives 50 keys per partition, and no key to every 7th message.
func keyOf(_, seq int) []byte {
	if seq%7 == 3 {
		return nil
	}
	return fmt.Appendf(nil, "key-%d", seq%50)
}

// Concurrency inside a partition: every ordering hands each message to the
// Handler once, keeps its order guarantee, and uses its calls at once.
func TestOrderings(t *testing.T) {
	const parts, perPart = 4, 2000
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	cl.ProduceKeyed(t, topic, parts, 0, perPart, keyOf)
	for _, tc := range []struct {
		ordering framework.Ordering
		inFlight int
	}{{framework.OrderPartition, 1}, {framework.OrderKey, 16}, {framework.OrderNone, 16}} {
		t.Run(tc.ordering.String(), func(t *testing.T) {
			group := testsupport.Name(t, "g")
			h := newOrderChecker(tc.ordering, tc.inFlight, 200*time.Microsecond)
			cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), h)
			cfg.Ordering, cfg.MaxInFlight = tc.ordering, tc.inFlight
			r := startConsumer(t, cfg)
			stop := watchInvariant(t, r, cl, group, topic, parts)
			waitFor(t, 2*time.Minute, "every partition committed at the log end", func() bool {
				return equalOffsets(cl.Committed(t, group, topic, parts), offsets(parts, perPart))
			})
			stop()
			st := r.c.Stats()
			r.stop(t)
			lost, dups := h.rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
			if len(lost) > 0 || dups > 0 {
				t.Fatalf("lost %d (%v), %d handled twice", len(lost), lost[:min(len(lost), 5)], dups)
			}
			if bad := h.rec.badValues(); len(bad) > 0 {
				t.Fatalf("bad payloads: %v", bad[:min(len(bad), 5)])
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if len(h.violation) > 0 {
				t.Fatalf("%d order violations, e.g. %v", len(h.violation), h.violation[:min(len(h.violation), 5)])
			}
			for _, p := range st.Partitions {
				if p.InFlight != 0 || p.Waiting != 0 || p.CompletedAhead != 0 || p.OldestIncomplete != -1 {
					t.Errorf("%s/%d at the end: in flight %d, waiting %d, completed ahead %d, oldest incomplete %d",
						p.Topic, p.Partition, p.InFlight, p.Waiting, p.CompletedAhead, p.OldestIncomplete)
				}
			}
			if tc.inFlight > 1 {
				for p := 0; p < parts; p++ {
					if h.peak[p] < 2 {
						t.Errorf("partition %d never had two calls at once (peak %d)", p, h.peak[p])
					}
				}
			}
			t.Logf("%s: %d messages once each, peak calls at once per partition %v, %d calls overlapping an earlier one",
				tc.ordering, parts*perPart, h.peak, h.unordered)
		})
	}
}

// A key stuck in a call holds only its own messages: the others complete
// above it until MaxWindow, Stats says which offset holds the partition and
// why it stopped taking messages, and the offset file records what
// completed above the watermark. A restart of the same consumer handles
// none of it again.
func TestStuckKeyWindow(t *testing.T) {
	const perPart, window = 3000, 1000
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)
	cl.ProduceKeyed(t, topic, 1, 0, perPart, func(_, seq int) []byte { return fmt.Appendf(nil, "key-%d", seq%100) })
	file := filepath.Join(t.TempDir(), "o.db")
	const stuck = 10 // key-10: offsets 10, 110, 210, ...
	release := make(chan struct{})
	var once sync.Once
	h := newOrderChecker(framework.OrderKey, 8, 0)
	gate := handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		if m.Offset == stuck {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return h.Handle(ctx, m)
	})
	cfg := baseConfig(t, cl, group, topic, file, gate)
	cfg.Ordering, cfg.MaxInFlight, cfg.MaxWindow = framework.OrderKey, 8, window
	r := startConsumer(t, cfg)
	var ps framework.PartitionStats
	waitFor(t, time.Minute, "the window full behind the stuck key, everything else in it done", func() bool {
		st := r.c.Stats().Partitions
		if len(st) == 0 {
			return false
		}
		ps = st[0]
		return ps.WindowFull && ps.CompletedAhead == window-10
	})
	// Everything in the window but key-10's messages completed: offsets
	// 10..1009 hold 10 of key-10 (10, 110, ... 910): one in a call, 9 waiting.
	if ps.Processed != stuck || ps.OldestIncomplete != stuck || ps.InFlight != 1 || ps.Waiting != 9 || ps.CompletedAhead != window-10 {
		t.Fatalf("window full: processed %d, oldest incomplete %d, in flight %d, waiting %d, completed ahead %d; want %d, %d, 1, 9, %d",
			ps.Processed, ps.OldestIncomplete, ps.InFlight, ps.Waiting, ps.CompletedAhead, stuck, stuck, window-10)
	}
	if ps.OldestAge <= 0 {
		t.Errorf("oldest incomplete age %s", ps.OldestAge)
	}
	if n := h.rec.count(); n != window { // 0..9, and 990 above the stuck one
		t.Fatalf("%d messages handled with the window full, want %d", n, window)
	}
	// The completed offsets are durable, as ranges: (10, 110), (110, 210) ...
	waitFor(t, 10*time.Second, "the completed ranges durable", func() bool {
		snap := liveSnapshot(t, file)
		for _, e := range snap.Records {
			if e.Watermark == stuck && completedCount(e.Completed) == window-10 {
				if len(e.Completed) != 10 {
					t.Fatalf("completed ranges %v, want 10 ranges around key-10's offsets", e.Completed)
				}
				return true
			}
		}
		return false
	})
	// A graceful stop while the key is stuck: the call is cancelled after
	// DrainTimeout; the restart handles the stuck key's messages and what
	// was never taken, and nothing that completed.
	r.stop(t)
	once.Do(func() { close(release) })
	r = startConsumer(t, cfg)
	waitFor(t, time.Minute, "committed at the log end after the restart", func() bool {
		return equalOffsets(cl.Committed(t, group, topic, 1), offsets(1, perPart))
	})
	r.stop(t)
	lost, dups := h.rec.check(1, offsets(1, 0), offsets(1, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("lost %d (%v), %d handled twice across the restart", len(lost), lost[:min(len(lost), 5)], dups)
	}
	if len(h.violation) > 0 {
		t.Fatalf("order violations: %v", h.violation[:min(len(h.violation), 5)])
	}
}

// liveSnapshot reads a running consumer's snapshot from its inspect
// socket.
func liveSnapshot(t testing.TB, file string) *framework.InspectSnapshot {
	t.Helper()
	ep, err := framework.ReadInspectEndpoint(file)
	if err != nil {
		t.Fatalf("inspect endpoint of %s: %v", file, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := ep.Snapshot(ctx, false)
	if err != nil {
		t.Fatalf("inspect snapshot of %s: %v", file, err)
	}
	return snap
}

func completedCount(rs []offsetstore.Range) int64 {
	var n int64
	for _, r := range rs {
		n += r.To - r.From
	}
	return n
}

// A SIGKILL while one message is stuck in a call and 100,000 completed
// above it: the restart handles the stuck message and none of the 100,000
// again (at most MaxInFlight plus what was not yet durable, and the test
// waits until it all is).
func TestSIGKILLWithStuckKey(t *testing.T) {
	const perPart, inFlight = 100_001, 64
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	cl.CreateTopic(t, topic, 1)
	cl.Produce(t, topic, 1, 0, perPart) // a key of its own per message
	start := func(env ...string) *exec.Cmd {
		return startConsumeChild(t, append([]string{
			"CHILD_BROKERS=" + strings.Join(cl.Brokers, ","), "CHILD_GROUP=" + group, "CHILD_TOPIC=" + topic,
			"CHILD_FILE=" + file, "CHILD_LEDGER=" + ledgerPath, "CHILD_ORDERING=key",
			fmt.Sprintf("CHILD_MAX_IN_FLIGHT=%d", inFlight), "CHILD_MAX_WINDOW=200000"}, env...)...)
	}
	cmd := start("CHILD_STUCK_AT=0:5")
	waitFor(t, 3*time.Minute, "everything but the stuck message handled and durable", func() bool {
		if len(readLedger(t, ledgerPath)) < perPart-1 {
			return false
		}
		for _, e := range liveSnapshot(t, file).Records {
			if e.Watermark == 5 && completedCount(e.Completed) == perPart-6 {
				return true
			}
		}
		return false
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	before := len(readLedger(t, ledgerPath))
	cmd = start()
	// The restart handles the stuck message, then skips the completed ones
	// as it fetches them; its watermark, and so the commit, reach the end.
	waitFor(t, 2*time.Minute, "the stuck message handled and the commit at the log end after the restart", func() bool {
		c, _ := cl.TryCommitted(group, topic, 1)
		return distinct(readLedger(t, ledgerPath)) == perPart && c[0] == perPart
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	entries := readLedger(t, ledgerPath)
	again := len(entries) - distinct(entries)
	t.Logf("SIGKILL with 1 message stuck and %d completed above it: the restart handled %d messages, %d of them again",
		perPart-1, len(entries)-before, again)
	if again > inFlight {
		t.Fatalf("%d messages handled again after the restart, want at most MaxInFlight (%d)", again, inFlight)
	}
	if c := cl.Committed(t, group, topic, 1); c[0] != perPart {
		t.Fatalf("committed %v, want %d", c, perPart)
	}
}

// A BatchHandler gets runs of one partition (one key with OrderKey), in
// offset order; a failing batch is split until the failing message is
// found, and the failure policy acts on it alone.
func TestBatchHandler(t *testing.T) {
	const parts, perPart, batch, maxAttempts = 2, 3000, 50, 2
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	cl.ProduceKeyed(t, topic, parts, 0, perPart, func(_, seq int) []byte { return fmt.Appendf(nil, "key-%d", seq%5) })
	poison := map[int64]bool{777: true, 2001: true}
	for _, ordering := range []framework.Ordering{framework.OrderPartition, framework.OrderKey, framework.OrderNone} {
		t.Run(ordering.String(), func(t *testing.T) {
			group := testsupport.Name(t, "g")
			file := filepath.Join(t.TempDir(), "o.db")
			rec := newRecorder()
			var (
				mu        sync.Mutex
				calls     int
				sizes     = map[int]int{}
				alone     = map[string]int{} // poison offsets called alone
				violation []string
			)
			bh := handler.BatchHandlerFunc(func(ctx context.Context, msgs []kafka.Message) error {
				mu.Lock()
				calls++
				sizes[len(msgs)]++
				if len(msgs) > batch {
					violation = append(violation, fmt.Sprintf("batch of %d", len(msgs)))
				}
				bad := false
				for i, m := range msgs {
					if m.Partition != msgs[0].Partition {
						violation = append(violation, "batch across partitions")
					}
					if i > 0 && m.Offset <= msgs[i-1].Offset {
						violation = append(violation, fmt.Sprintf("offsets %d then %d", msgs[i-1].Offset, m.Offset))
					}
					if ordering == framework.OrderKey && string(m.Key) != string(msgs[0].Key) {
						violation = append(violation, "batch across keys with OrderKey")
					}
					if ordering != framework.OrderKey && i > 0 && m.Offset != msgs[i-1].Offset+1 {
						violation = append(violation, fmt.Sprintf("gap %d..%d in a batch", msgs[i-1].Offset, m.Offset))
					}
					if poison[m.Offset] {
						bad = true
						if len(msgs) == 1 {
							alone[fmt.Sprintf("%d@%d", m.Partition, m.Offset)]++
						}
					}
				}
				mu.Unlock()
				if bad {
					return fmt.Errorf("poison in batch from %d", msgs[0].Offset)
				}
				for _, m := range msgs {
					if err := rec.Handle(ctx, m); err != nil {
						return err
					}
				}
				return nil
			})
			cfg := baseConfig(t, cl, group, topic, file, nil)
			cfg.Handler, cfg.BatchHandler, cfg.BatchSize = nil, bh, batch
			cfg.Ordering = ordering
			if ordering != framework.OrderPartition {
				cfg.MaxInFlight = 4
			}
			cfg.Failure = framework.FailurePolicy{Action: framework.Skip, MaxAttempts: maxAttempts}
			r := startConsumer(t, cfg)
			waitFor(t, 2*time.Minute, "committed at the log end", func() bool {
				return equalOffsets(cl.Committed(t, group, topic, parts), offsets(parts, perPart))
			})
			r.stop(t)
			mu.Lock()
			defer mu.Unlock()
			if len(violation) > 0 {
				t.Fatalf("%d violations, e.g. %v", len(violation), violation[:min(len(violation), 5)])
			}
			for p := 0; p < parts; p++ {
				for o := range poison {
					if n := alone[fmt.Sprintf("%d@%d", p, o)]; n != maxAttempts {
						t.Errorf("poison %d@%d called alone %d times, want MaxAttempts (%d)", p, o, n, maxAttempts)
					}
					if rec.seen[p][o] != 0 {
						t.Errorf("poison %d@%d recorded as handled", p, o)
					}
					rec.seen[p][o] = 1 // skipped: counted for the check below
				}
			}
			lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
			if len(lost) > 0 || dups > 0 {
				t.Fatalf("lost %d (%v), %d handled twice", len(lost), lost[:min(len(lost), 5)], dups)
			}
			fs, _ := storeFailures(t, file, group, topic, parts)
			for p := 0; p < parts; p++ {
				if len(fs[p]) != len(poison) {
					t.Errorf("partition %d: %d failures recorded, want %d", p, len(fs[p]), len(poison))
				}
			}
			t.Logf("%s: %d calls for %d messages; batch sizes %v", ordering, calls, parts*perPart, sizes)
			if sizes[batch] == 0 {
				t.Errorf("no full batch of %d", batch)
			}
		})
	}
}

// A stop while a key's message is failing: the messages waiting behind it
// are not handled by the drain (their key's order), and the restart
// handles it, then them, in order; nothing twice.
func TestDrainKeepsKeyOrder(t *testing.T) {
	const perPart = 400
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)
	cl.ProduceKeyed(t, topic, 1, 0, perPart, func(_, seq int) []byte { return fmt.Appendf(nil, "key-%d", seq%2) })
	file := filepath.Join(t.TempDir(), "o.db")
	h := newOrderChecker(framework.OrderKey, 4, 0)
	var failing sync.Map // offset 0 (key-0) fails while set
	failing.Store(int64(0), true)
	gate := handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		if _, bad := failing.Load(m.Offset); bad {
			return fmt.Errorf("offset %d failing", m.Offset)
		}
		return h.Handle(ctx, m)
	})
	cfg := baseConfig(t, cl, group, topic, file, gate)
	cfg.Ordering, cfg.MaxInFlight = framework.OrderKey, 4
	cfg.RetryBackoff, cfg.MaxRetryBackoff = 50*time.Millisecond, 200*time.Millisecond
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "key-1 handled to the end while key-0 fails", func() bool { return h.rec.count() == perPart/2 })
	r.stop(t) // the drain starts while offset 0 is in its retry backoff
	if n := h.rec.count(); n != perPart/2 {
		t.Fatalf("%d handled by the first run, want only key-1's %d: the drain ran key-0's messages behind its failing one", n, perPart/2)
	}
	failing.Delete(int64(0))
	r = startConsumer(t, cfg)
	waitFor(t, time.Minute, "committed at the log end after the restart", func() bool {
		return equalOffsets(cl.Committed(t, group, topic, 1), offsets(1, perPart))
	})
	r.stop(t)
	lost, dups := h.rec.check(1, offsets(1, 0), offsets(1, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("lost %d (%v), %d handled twice", len(lost), lost[:min(len(lost), 5)], dups)
	}
	if len(h.violation) > 0 {
		t.Fatalf("order violations: %v", h.violation[:min(len(h.violation), 5)])
	}
}

// OrderKey: a message whose call returned is recorded at once, not when
// the next call of its key returns. One key's messages come in one batch,
// so they run as one job; the last one blocks: every offset before it must
// reach the watermark, the offset file and Kafka's commit while it is still
// in its call (a SIGKILL then handles again only the message in the call).
func TestOrderKeyCompletionNotHeldByNextCall(t *testing.T) {
	const n = 6
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)
	cl.ProduceKeyed(t, topic, 1, 0, n, func(int, int) []byte { return []byte("k") })
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	rec := newRecorder()
	rec.before = func(ctx context.Context, m kafka.Message) error {
		if m.Offset == n-1 {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}
	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Ordering, cfg.MaxInFlight = framework.OrderKey, 4
	r := startConsumer(t, cfg)
	waitFor(t, 30*time.Second, fmt.Sprintf("offsets 0..%d handled", n-2), func() bool { return rec.count() >= n-1 })
	part := func() framework.PartitionStats {
		for _, p := range r.c.Stats().Partitions {
			if p.Topic == topic {
				return p
			}
		}
		return framework.PartitionStats{}
	}
	// The last call is still blocked: generous limits, since on a
	// completion held back by the next call these never hold.
	waitFor(t, 10*time.Second, fmt.Sprintf("watermark, offset file and commit at %d while offset %d is in its call", n-1, n-1), func() bool {
		p := part()
		return p.Processed == n-1 && p.Durable == n-1 && p.Committed == n-1 && p.InFlight == 1
	})
	unblock()
	waitFor(t, 30*time.Second, "committed at the log end", func() bool {
		return equalOffsets(cl.Committed(t, group, topic, 1), offsets(1, n))
	})
	r.stop(t)
	if lost, dups := rec.check(1, offsets(1, 0), offsets(1, n)); len(lost) > 0 || dups > 0 {
		t.Fatalf("lost %v, %d handled twice", lost, dups)
	}
}
