package tidemark_test

// Consumer processes killed and restarted: children of this test binary
// (frameworktest.StartChild) write what they handle to a ledger file that
// a SIGKILL cannot undo. SIGKILL mid-stream, bounded replay with
// MaxUndurable, a message that makes the process exit hard (the crash-loop
// breaker), and a SIGKILL with a key stuck in a call.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// Scenario 2: a consumer process is killed with SIGKILL mid-stream and
// restarted, several times. Nothing is lost, and no message whose offset
// was durable in the local file at the kill is handled again.
func TestSIGKILLAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("several session timeouts: skipped in -short mode")
	}
	const parts, perPart, kills = 4, 1500, 3
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	child := frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: file, Ledger: ledgerPath, Work: time.Millisecond}

	type killPoint struct {
		lines   int           // ledger lines written before the kill
		durable map[int]int64 // durable watermarks in the file after the kill
	}
	var points []killPoint
	for k := 0; k < kills; k++ {
		c := frameworktest.StartChild(t, child)
		before := testsupport.ReadLedger(t, ledgerPath).Len()
		// Kill once this run has handled a few hundred messages.
		testsupport.WaitFor(t, 2*time.Minute, fmt.Sprintf("run %d handling", k+1), func() bool {
			return testsupport.ReadLedger(t, ledgerPath).Len() > before+300+k*150
		})
		c.Kill(t)
		kp := killPoint{lines: testsupport.ReadLedger(t, ledgerPath).Len(), durable: durableWatermarks(t, file)}
		points = append(points, kp)
		t.Logf("kill %d: %d messages handled so far, durable watermarks %v", k+1, kp.lines, kp.durable)
	}

	// The last run consumes everything and stops gracefully.
	c := frameworktest.StartChild(t, child)
	testsupport.WaitFor(t, 2*time.Minute, "everything handled after the last restart", func() bool {
		return testsupport.ReadLedger(t, ledgerPath).Distinct() == parts*perPart
	})
	if err := c.Stop(t); err != nil {
		t.Fatalf("graceful stop of the last run: %v", err)
	}

	ledger := testsupport.ReadLedger(t, ledgerPath)
	// Offsets below the durable watermark at a kill that were handled
	// again after it.
	durableAgain := 0
	for i, kp := range points {
		end := ledger.Len()
		if i+1 < len(points) {
			end = points[i+1].lines
		}
		for _, e := range ledger.Entries[kp.lines:end] {
			if e.Offset < kp.durable[e.Partition] {
				durableAgain++
			}
		}
	}
	d := testsupport.NoneLost(t, ledger, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	t.Logf("%d messages, %d SIGKILLs: 0 lost, %d durable offsets handled again, %d handled twice in all (handled after the last durable flush before a kill)",
		parts*perPart, kills, durableAgain, d.Extra)
	if durableAgain > 0 {
		t.Fatalf("%d durable offsets handled again", durableAgain)
	}
	if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, perPart)) {
		t.Fatalf("committed %v after the graceful stop, want %d everywhere", c, perPart)
	}
}

// durableWatermarks reads the watermark of every partition in the offset
// file of a consumer that is not running.
func durableWatermarks(t *testing.T, file string) map[int]int64 {
	t.Helper()
	s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("reading the offset file after the kill: %v", err)
	}
	defer s.Close()
	out := map[int]int64{}
	for _, e := range s.Records() {
		out[int(e.Partition)] = e.Watermark
	}
	return out
}

// Bounded replay: with MaxUndurable 1 each message is durable in the
// offset file before the next one of its partition is handled, so a
// SIGKILL makes the restart handle again at most one message per
// partition.
func TestBoundedReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("several session timeouts: skipped in -short mode")
	}
	const parts, perPart, kills = 4, 600, 3
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	child := frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: file, Ledger: ledgerPath, MaxUndurable: 1}
	for k := 0; k < kills; k++ {
		c := frameworktest.StartChild(t, child)
		before := testsupport.ReadLedger(t, ledgerPath).Len()
		testsupport.WaitFor(t, 2*time.Minute, fmt.Sprintf("run %d handling", k+1), func() bool {
			return testsupport.ReadLedger(t, ledgerPath).Len() > before+200
		})
		c.Kill(t)
	}
	c := frameworktest.StartChild(t, child)
	testsupport.WaitFor(t, 2*time.Minute, "everything handled after the last restart", func() bool {
		return testsupport.ReadLedger(t, ledgerPath).Distinct() == parts*perPart
	})
	if err := c.Stop(t); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	ledger := testsupport.ReadLedger(t, ledgerPath)
	again := ledger.Len() - ledger.Distinct()
	t.Logf("MaxUndurable 1, %d SIGKILLs of a consumer of %d partitions: %d messages handled again (at most %d)", kills, parts, again, kills*parts)
	if again > kills*parts {
		t.Fatalf("%d messages handled again after %d SIGKILLs, want at most one per partition per kill (%d)", again, kills, kills*parts)
	}
}

// Issue 3: a message that makes the process exit hard (os.Exit, no
// deferred call, no flush) puts a consumer into a crash loop that no
// in-memory counter sees. The offset file's run state does: after
// CrashLoopRestarts unclean restarts in a row with that message in flight,
// the breaker hands it to the failure policy (Skip here) without calling the
// Handler, logs it by topic, partition and offset, and the consumer
// proceeds. The other partition and every other message are handled. With
// OrderKey the first run handles concurrently; careful mode then handles
// one message at a time, so the breaker still names the exact message.
func TestCrashLoopBreaker(t *testing.T) {
	if testing.Short() {
		t.Skip("several session timeouts: skipped in -short mode")
	}
	for _, ordering := range []framework.Ordering{framework.OrderPartition, framework.OrderKey} {
		t.Run(ordering.String(), func(t *testing.T) { testCrashLoopBreaker(t, ordering) })
	}
}

func testCrashLoopBreaker(t *testing.T, ordering framework.Ordering) {
	const parts, perPart, limit = 2, 60, 2
	crash := testsupport.Offset{Partition: 0, Offset: 20}
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	child := frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: file, Ledger: ledgerPath,
		Ordering: ordering, CrashAt: &crash, CrashLimit: limit}

	crashes := 0
	for {
		c := frameworktest.StartChild(t, child)
		var crashed bool
		deadline := time.Now().Add(2 * time.Minute)
		for !crashed {
			select {
			case <-c.Exited():
				if code := c.ExitCode(); code != 3 || !strings.Contains(c.Stderr(), fmt.Sprintf("exiting hard on %s", crash)) {
					t.Fatalf("run %d exited %d:\n%s", crashes+1, code, testsupport.Tail(c.Stderr(), 3000))
				}
				crashed = true
				continue
			case <-time.After(50 * time.Millisecond):
			}
			// Everything but the poison message is in the ledger, and Kafka
			// has the end of every partition committed: the consumer
			// proceeded. The ledger alone is not enough: it keeps what
			// earlier runs handled before a hard exit, which this run may
			// still be handling again from the durable watermark.
			if testsupport.ReadLedger(t, ledgerPath).Distinct() == parts*perPart-1 {
				if committed, _ := cl.TryCommitted(group, topic, parts); testsupport.EqualOffsets(committed, testsupport.Offsets(parts, perPart)) {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d neither crashed nor finished in 2 minutes:\n%s", crashes+1, testsupport.Tail(c.Stderr(), 3000))
			}
		}
		if crashed {
			crashes++
			if crashes > limit+3 {
				t.Fatalf("%d crashes and the breaker never tripped", crashes)
			}
			continue
		}
		// The consumer proceeded past the poison message: stop it.
		if err := c.Stop(t); err != nil {
			t.Fatalf("graceful stop: %v", err)
		}
		logs := c.Stderr()
		want := fmt.Sprintf(`"topic": "%s", "partition": %d, "offset": %d`, topic, crash.Partition, crash.Offset)
		if !strings.Contains(logs, "crash-loop breaker tripped") || !strings.Contains(logs, want) {
			t.Fatalf("the breaker's log line does not name %s:\n%s", want, testsupport.Tail(logs, 4000))
		}
		break
	}
	// Runs: 1 crashes in normal mode; 2 crashes in careful mode, with the
	// message durably in flight; 3..limit+1 crash again on it; the next
	// starts with limit unclean restarts counted and trips.
	if crashes != limit+1 {
		t.Errorf("%d crashes before the breaker tripped, want %d (limit %d)", crashes, limit+1, limit)
	}
	ledger := testsupport.ReadLedger(t, ledgerPath)
	if n := ledger.Times(crash.Partition, crash.Offset); n != 0 {
		t.Errorf("the poison message completed %d times", n)
	}
	// Every other message handled (some again, after a hard exit); the
	// poison one, skipped, counted as handled.
	testsupport.NoneLost(t, testsupport.HandledFunc(func(p int, o int64) int {
		if (testsupport.Offset{Partition: p, Offset: o}) == crash {
			return 1
		}
		return ledger.Times(p, o)
	}), testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := offsetfile.Key{Group: group, Topic: topic, Partition: int32(crash.Partition)}
	fs, err := s.Failures(k)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Offset != crash.Offset || fs[0].Action != offsetfile.FailureSkip || fs[0].Attempts != 0 ||
		!strings.Contains(fs[0].Reason, "crash-loop breaker: 2 unclean restarts in a row") {
		t.Fatalf("failure entries %+v", fs)
	}
	for p := 0; p < parts; p++ {
		rec, _ := s.Durable(offsetfile.Key{Group: group, Topic: topic, Partition: int32(p)})
		if rec.Watermark != perPart || rec.Run == nil || rec.Run.Open {
			t.Errorf("partition %d after the graceful stop: watermark %d, run %+v (want %d, released cleanly)", p, rec.Watermark, rec.Run, perPart)
		}
	}
	t.Logf("%d hard exits on %s; the breaker then skipped it (recorded in the offset file) and the consumer handled the other %d messages (%d handlings; the extra ones were handled again after a hard exit)",
		crashes, crash, ledger.Distinct(), ledger.Len())
}

// A SIGKILL while one message is stuck in a call and 100,000 completed
// above it: the restart handles the stuck message and none of the 100,000
// again. The test kills only once every completed offset is durable in the
// file, so nothing the killed process handled is missing from it: the
// promise (docs/guarantees.md, "A crash loses nothing") is 0 handled again.
func TestSIGKILLWithStuckKey(t *testing.T) {
	const perPart, inFlight = 100_001, 64
	cl, topic := testsupport.NewTopic(t, 1, perPart) // a key of its own per message
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	child := frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: file, Ledger: ledgerPath,
		Ordering: framework.OrderKey, MaxInFlight: inFlight, MaxWindow: 200_000}
	stuck := child
	stuck.StuckAt = &testsupport.Offset{Partition: 0, Offset: 5}
	c := frameworktest.StartChild(t, stuck)
	testsupport.WaitFor(t, 3*time.Minute, "everything but the stuck message handled and durable", func() bool {
		if testsupport.ReadLedger(t, ledgerPath).Len() < perPart-1 {
			return false
		}
		for _, e := range liveSnapshot(t, file).Records {
			if e.Watermark == 5 && completedCount(e.Completed) == perPart-6 {
				return true
			}
		}
		return false
	})
	c.Kill(t)
	before := testsupport.ReadLedger(t, ledgerPath).Len()
	c = frameworktest.StartChild(t, child)
	// The restart handles the stuck message, then skips the completed ones
	// as it fetches them; its watermark, and so the commit, reach the end.
	testsupport.WaitFor(t, 2*time.Minute, "the stuck message handled and the commit at the log end after the restart", func() bool {
		committed, _ := cl.TryCommitted(group, topic, 1)
		return testsupport.ReadLedger(t, ledgerPath).Distinct() == perPart && committed[0] == perPart
	})
	if err := c.Stop(t); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	ledger := testsupport.ReadLedger(t, ledgerPath)
	again := ledger.Len() - ledger.Distinct()
	t.Logf("SIGKILL with 1 message stuck and %d completed above it: the restart handled %d messages, %d of them again",
		perPart-1, ledger.Len()-before, again)
	if again != 0 {
		t.Fatalf("%d messages handled again after the restart, want 0: every completed offset was durable at the kill", again)
	}
	if n := ledger.Times(0, 5); n != 1 {
		t.Fatalf("the stuck message handled %d times, want once (by the restart)", n)
	}
	if c := cl.Committed(t, group, topic, 1); c[0] != perPart {
		t.Fatalf("committed %v, want %d", c, perPart)
	}
}

// MaxUndurable bounds what a SIGKILL repeats with OrderKey and OrderNone
// too, where offsets complete out of order above a watermark that one
// stuck call holds: the messages the offset file does not prove done (in
// a call, waiting, or done since the last flush) never exceed it.
func TestBoundedReplayOutOfOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("session timeouts: skipped in -short mode")
	}
	const parts, perPart, bound = 2, 1500, 8
	for _, ordering := range []framework.Ordering{framework.OrderKey, framework.OrderNone} {
		t.Run(ordering.String(), func(t *testing.T) {
			cl, topic := testsupport.NewTopic(t, parts, perPart)
			group := testsupport.Name(t, "g")
			dir := t.TempDir()
			file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
			child := frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: file, Ledger: ledgerPath,
				Ordering: ordering, MaxInFlight: 4, MaxUndurable: bound, StuckAt: &testsupport.Offset{Partition: 0, Offset: 10}}
			c := frameworktest.StartChild(t, child)
			testsupport.WaitFor(t, 2*time.Minute, "the first run handling past the stuck call", func() bool {
				return testsupport.ReadLedger(t, ledgerPath).Len() > perPart
			})
			c.Kill(t)
			child.StuckAt = nil
			c = frameworktest.StartChild(t, child)
			testsupport.WaitFor(t, 2*time.Minute, "everything handled after the restart", func() bool {
				return testsupport.ReadLedger(t, ledgerPath).Distinct() == parts*perPart
			})
			if err := c.Stop(t); err != nil {
				t.Fatalf("graceful stop: %v", err)
			}
			ledger := testsupport.ReadLedger(t, ledgerPath)
			again := ledger.Len() - ledger.Distinct()
			t.Logf("%s, MaxUndurable %d, a stuck call, one SIGKILL of %d partitions: %d messages handled again (at most %d)", ordering, bound, parts, again, parts*bound)
			if again > parts*bound {
				t.Fatalf("%d messages handled again after a SIGKILL, want at most MaxUndurable per partition (%d)", again, parts*bound)
			}
		})
	}
}
