package tidemark_test

// Hand-offs while Kafka refuses commits: the final commit of a revoked
// partition is retried within the hand-off's budget, and what cannot land
// in it is counted (Stats.RevokedUncommitted).

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

const handOffParts, handOffPerPart, handOffUncommitted = 4, 50, 100

// handOffRig is member a owning every partition, having handled 100
// messages per partition since its last commit while Kafka answers every
// OffsetCommit with COORDINATOR_NOT_AVAILABLE (retriable), and member b
// just started: the rebalance moves half of a's partitions to b.
type handOffRig struct {
	cl         *testsupport.Cluster
	topic      string
	group      string
	recA, recB *testsupport.Recorder
	a, b       *frameworktest.Running
	restore    func()
}

func startHandOff(t *testing.T, tune func(*framework.Config)) *handOffRig {
	cl, topic := testsupport.NewTopic(t, handOffParts, handOffPerPart)
	h := &handOffRig{cl: cl, topic: topic, group: testsupport.Name(t, "g"), recA: &testsupport.Recorder{}, recB: &testsupport.Recorder{}}
	member := func(name string, rec *testsupport.Recorder) *frameworktest.Running {
		cfg := frameworktest.Config(t, cl.Brokers, h.group, topic, filepath.Join(t.TempDir(), name+".db"), rec)
		if tune != nil {
			tune(&cfg)
		}
		return frameworktest.Start(t, cfg)
	}
	h.a = member("a", h.recA)
	testsupport.WaitFor(t, time.Minute, "a owning every partition, committed", func() bool {
		return frameworktest.CommittedAt(handOffPerPart, h.a) == handOffParts
	})
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15) // COORDINATOR_NOT_AVAILABLE
	if err != nil {
		t.Fatal(err)
	}
	h.restore = fail.Remove
	cl.Produce(t, topic, handOffParts, handOffPerPart, handOffUncommitted)
	testsupport.WaitFor(t, time.Minute, "a handling the messages after its last commit", func() bool {
		return h.recA.Count() == handOffParts*(handOffPerPart+handOffUncommitted)
	})
	h.b = member("b", h.recB)
	return h
}

// finish restores the commits, produces 10 more messages per partition,
// waits until every partition is committed at the log end, stops both members, and returns what b handled that a had
// handled too, checking that nothing was lost.
func (h *handOffRig) finish(t *testing.T) (again int) {
	h.restore()
	// Then more messages: both members handle their own.
	const more = 10
	h.cl.Produce(t, h.topic, handOffParts, handOffPerPart+handOffUncommitted, more)
	end := int64(handOffPerPart + handOffUncommitted + more)
	testsupport.WaitFor(t, time.Minute, "both members running, every partition committed at the end", func() bool {
		return frameworktest.CommittedAt(end, h.a, h.b) == handOffParts && frameworktest.CommittedAt(end, h.b) > 0
	})
	h.b.Stop(t)
	h.a.Stop(t)
	both := testsupport.HandledFunc(func(p int, o int64) int { return h.recA.Times(p, o) + h.recB.Times(p, o) })
	d := testsupport.NoneLost(t, both, testsupport.Offsets(handOffParts, 0), testsupport.Offsets(handOffParts, end))
	for p := range handOffParts {
		for o := range end {
			if h.recA.Times(p, o) > 0 && h.recB.Times(p, o) > 0 {
				again++
			}
		}
	}
	t.Logf("a handled %d, b %d; %s; b handled %d that a had handled", h.recA.Count(), h.recB.Count(), d, again)
	return again
}

// A graceful hand-off while every commit fails for 3 s: the member giving
// its partitions up retries their final commit until Kafka takes it, so the
// next owner starts where it stopped and handles nothing it handled. Before,
// the one final commit failed, the partitions were dropped, and the next
// owner started at Kafka's older commit: 200 messages (100 on each of the
// two partitions that moved) handled twice.
func TestHandOffRetriesTheFinalCommit(t *testing.T) {
	h := startHandOff(t, nil)
	// The rebalance, a's drain and its first tries of the final commit
	// take about a second on kfake; the outage lasts well into the retries
	// and ends within the budget (RebalanceTimeout - HeartbeatInterval,
	// 9.7 s with frameworktest.Fast).
	time.Sleep(3 * time.Second)
	if again := h.finish(t); again != 0 {
		t.Errorf("b handled %d messages a had handled, want 0", again)
	}
	if st := h.a.C.Stats(); st.RevokedUncommitted != 0 {
		t.Errorf("Stats.RevokedUncommitted = %d, want 0: every final commit landed", st.RevokedUncommitted)
	}
}

// An outage that outlasts the hand-off's budget (RebalanceTimeout 3 s less a
// 300 ms HeartbeatInterval): the member stops retrying, hands the
// partitions on, and counts what it could not commit; the next owner
// handles exactly that again.
func TestHandOffCountsWhatItCouldNotCommit(t *testing.T) {
	h := startHandOff(t, func(cfg *framework.Config) {
		cfg.RebalanceTimeout, cfg.DrainTimeout = 3*time.Second, time.Second
	})
	testsupport.WaitFor(t, time.Minute, "b handling a's old messages again", func() bool { return h.recB.Count() > 0 })
	counted := h.a.C.Stats().RevokedUncommitted
	again := h.finish(t)
	t.Logf("a counted %d messages revoked uncommitted", counted)
	if counted == 0 || uint64(again) != counted {
		t.Errorf("Stats.RevokedUncommitted = %d, b handled %d that a had handled: want them equal and above 0", counted, again)
	}
}

// A graceful stop while commits fail for 1 s: the final commit is retried
// within DrainTimeout (2 s with frameworktest.Fast) and lands, so Kafka's
// committed offset is the file's watermark when Run returns, and Run
// returns within DrainTimeout and a try.
func TestStopRetriesTheFinalCommit(t *testing.T) {
	const parts, perPart = 2, 50
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	testsupport.WaitFor(t, time.Minute, "committed at the end", func() bool { return frameworktest.CommittedAt(perPart, r) == parts })
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15) // COORDINATOR_NOT_AVAILABLE
	if err != nil {
		t.Fatal(err)
	}
	cl.Produce(t, topic, parts, perPart, perPart)
	testsupport.WaitFor(t, time.Minute, "the messages after the last commit handled", func() bool { return rec.Count() == 2*parts*perPart })
	restored := time.AfterFunc(time.Second, fail.Remove)
	defer restored.Stop()
	began := time.Now()
	r.Stop(t)
	took := time.Since(began)
	if got := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(got, testsupport.Offsets(parts, 2*perPart)) {
		t.Errorf("Kafka committed %v after the stop, want %d on every partition", got, 2*perPart)
	}
	if st := r.C.Stats(); st.RevokedUncommitted != 0 {
		t.Errorf("Stats.RevokedUncommitted = %d, want 0", st.RevokedUncommitted)
	}
	t.Logf("Run returned %s after the stop; %d commits refused", took.Round(time.Millisecond), fail.Applied())
	if took > 2*time.Second+10*time.Second {
		t.Errorf("Run took %s to return, want at most DrainTimeout (2 s) and a try", took)
	}
}

// A graceful hand-off with OrderKey carries the ranges completed above the
// watermark to the next owner in the final commit's metadata: with offset 0
// of each partition held in a call and 1-299 completed above it, the next
// owner of a moved partition handles offset 0 and none of 1-299 again.
func TestHandOffCarriesCompletedRanges(t *testing.T) {
	const parts, perPart = 2, 300
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	release := make(chan struct{})
	hold := func(ctx context.Context, m kafka.Message) error {
		if m.Offset == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-release:
			}
		}
		return nil
	}
	recA, recB := &testsupport.Recorder{Before: hold}, &testsupport.Recorder{}
	member := func(name string, rec *testsupport.Recorder) *frameworktest.Running {
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), name+".db"), rec)
		cfg.Ordering, cfg.MaxInFlight = framework.OrderKey, 8
		return frameworktest.Start(t, cfg)
	}
	a := member("a", recA)
	testsupport.WaitFor(t, time.Minute, "a holding offset 0 of each partition with 1-299 completed", func() bool {
		ps := a.C.Stats().Partitions
		return recA.Count() == parts*(perPart-1) && len(ps) == parts && ps[0].Durable == 0 && ps[1].Durable == 0
	})
	b := member("b", recB)
	moved := -1
	testsupport.WaitFor(t, time.Minute, "b owning a partition and handling its offset 0", func() bool {
		for _, p := range b.C.Stats().Partitions {
			if p.State == framework.StateRunning || p.State == framework.StateRetrying {
				moved = p.Partition
			}
		}
		return moved >= 0 && recB.Times(moved, 0) == 1
	})
	close(release)
	testsupport.WaitFor(t, time.Minute, "every offset handled", func() bool {
		return recA.Count()+recB.Count() >= parts*perPart
	})
	b.Stop(t)
	a.Stop(t)
	both := testsupport.HandledFunc(func(p int, o int64) int { return recA.Times(p, o) + recB.Times(p, o) })
	testsupport.NoneLost(t, both, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
	again := 0
	for o := range int64(perPart) {
		if recA.Times(moved, o) > 0 && recB.Times(moved, o) > 0 {
			again++
		}
	}
	if again > 0 || a.C.Stats().HandoffOmitted != 0 {
		t.Fatalf("the next owner of partition %d handled %d offsets again (HandoffOmitted %d), want 0", moved, again, a.C.Stats().HandoffOmitted)
	}
}

// A run abandoned at a revoke (its Handler ignored the cancelled context)
// writes nothing when its call finally returns: the partition came back to
// this consumer meanwhile, and the newer run's open run state, which the
// crash-loop breaker reads after a crash, must stay.
func TestAbandonedRunKeepsTheNewerRunState(t *testing.T) {
	if testing.Short() {
		t.Skip("drain grace and rebalances: skipped in -short mode")
	}
	const parts, perPart = 2, 50
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	release := make(chan struct{})
	recA := &testsupport.Recorder{Before: func(_ context.Context, m kafka.Message) error {
		if m.Offset == 5 {
			<-release // ignores its context: abandoned at the revoke
		}
		return nil
	}}
	fileA := filepath.Join(t.TempDir(), "a.db")
	cfgA := frameworktest.Config(t, cl.Brokers, group, topic, fileA, recA)
	cfgA.DrainTimeout = 200 * time.Millisecond
	a := frameworktest.Start(t, cfgA)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	testsupport.WaitFor(t, time.Minute, "a held at offset 5 of both partitions", func() bool {
		return recA.Count() == parts*5
	})
	recB := &testsupport.Recorder{}
	b := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "b.db"), recB))
	moved := -1
	testsupport.WaitFor(t, time.Minute, "b handling the partition a's revoke abandoned", func() bool {
		for p := range parts {
			if recB.Times(p, perPart-1) == 1 {
				moved = p
				return true
			}
		}
		return false
	})
	b.Stop(t) // the partition goes back to a: a newer run there
	openRun := func() bool {
		for _, e := range liveSnapshot(t, fileA).Records {
			if e.Key.Partition == int32(moved) {
				return e.Record.Run != nil && e.Record.Run.Open
			}
		}
		return false
	}
	testsupport.WaitFor(t, time.Minute, "a running the partition again, its run state open", func() bool {
		for _, p := range a.C.Stats().Partitions {
			if p.Partition == moved && p.State == framework.StateRunning {
				return openRun()
			}
		}
		return false
	})
	close(release) // the abandoned call returns, and its run ends
	testsupport.WaitFor(t, time.Minute, "a's other partition done and durable", func() bool {
		for _, p := range a.C.Stats().Partitions {
			if p.Partition != moved && p.Durable == perPart {
				return true
			}
		}
		return false
	})
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !openRun() {
			t.Fatalf("partition %d: the abandoned run closed the newer run's run state", moved)
		}
	}
	if err := a.StopErr(t); err == nil || !strings.Contains(err.Error(), "abandoned") {
		t.Fatalf("Run returned %v, want the abandoned call reported", err)
	}
}
