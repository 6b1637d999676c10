package tidemark_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/internal/paced"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// One partition's leader moves 50 times between three brokers under a
// steady producer. Each move's resume time runs from the move to the first
// message handled from the new leader; the last moves cost no more than the
// first (the fetch backoff does not build up across moves), and every
// message is handled exactly once.
func TestLeaderMovesPace(t *testing.T) {
	if testsupport.RealBroker() {
		t.Skip("moves leaders with kfake's controls")
	}
	const brokers, moves = 3, 50
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	fake, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.GroupMinSessionTimeout(time.Second),
		kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	addrs := fake.ListenAddrs()

	p, err := paced.Start(context.Background(), addrs, topic, fake.LeaderFor(topic, 0), 2*time.Millisecond,
		func(o int64) []byte { return testsupport.Value(0, int(o)) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	w := &resumeWatch{}
	rec := &testsupport.Recorder{Before: func(_ context.Context, m kafka.Message) error {
		w.handled(m.Offset)
		return nil
	}}
	cfg := frameworktest.Config(t, addrs, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "200 messages handled before the first move", func() bool { return rec.Count() >= 200 })

	resume := make([]time.Duration, 0, moves)
	for i := 1; i <= moves; i++ {
		next := (fake.LeaderFor(topic, 0) + 1) % brokers
		var from int64
		var movedAt time.Time
		var resumed <-chan time.Time
		// Between two produce requests: every offset from the move's on is
		// written to the new leader.
		var merr error
		p.Between(func(l paced.Locked) {
			if merr = fake.MoveTopicPartition(topic, 0, next); merr != nil {
				return
			}
			movedAt, from = time.Now(), l.Next()
			l.Lead(next)
			resumed = w.wait(from)
		})
		if merr != nil {
			t.Fatalf("move %d of %s/0 to broker %d: %v", i, topic, next, merr)
		}
		var at time.Time
		select {
		case at = <-resumed:
		case err := <-p.Failed():
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatalf("move %d of %s/0 to broker %d: offset %d not handled within 20s of the move", i, topic, next, from)
		}
		resume = append(resume, at.Sub(movedAt))
		// Some steady state at the new leader before the next move.
		testsupport.WaitFor(t, 20*time.Second, fmt.Sprintf("%s/0 offset %d handled after move %d", topic, from+50, i),
			func() bool { return rec.Count() >= int(from+50) })
	}
	end := p.Stop()
	select {
	case err := <-p.Failed():
		t.Fatal(err)
	default:
	}
	testsupport.WaitFor(t, 30*time.Second, fmt.Sprintf("every message of %s/0 handled (log end %d)", topic, end),
		func() bool { return rec.Count() >= int(end) })
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 0), testsupport.Offsets(1, end))
	if bad := rec.BadValues(); len(bad) > 0 {
		t.Fatalf("%d messages with the wrong payload: %v", len(bad), bad[:min(len(bad), 5)])
	}

	first, last := median(resume[:10]), median(resume[moves-10:])
	t.Logf("%d leader moves of %s/0, %d messages: resume after a move: median of the first 10 %s, of the last 10 %s, median %s, max %s; each: %v",
		moves, topic, end, first, last, median(resume), slices.Max(resume), roundAll(resume))
	// "No slower" (docs/guarantees.md), with room for scheduling noise and
	// none for a backoff carried from move to move. Every backoff on this
	// path (a refused partition's, fetchState.bo; the leader lookup's)
	// starts at 50 ms and doubles with each failure in a row, waiting at
	// least half its step; carried across 40 moves, each sits at its cap:
	// the refused partition waits leaderRetryMax, 250 ms, the lookup
	// 250-500 ms. The old bound, 2x the first + 250 ms, let exactly that
	// pass (the first 10 take a few ms). leaderMoveNoise is a fifth of it;
	// in three runs under -race on a shared 2-core machine the medians were
	// 2.0-2.7 ms, less than 1 ms apart.
	if limit := first + leaderMoveNoise; last > limit {
		t.Fatalf("the last 10 leader moves resumed in %s (median), the first 10 in %s: more than %s, the resume time grows with the moves",
			last, first, limit)
	}
	// A refused fetch is retried at once at the new leader
	// (docs/guarantees.md); the kfake leader-move tests hold each move to
	// resumeTarget, and so does this one, that a backoff present from the
	// first move on does not pass as "no slower".
	if slowest := slices.Max(resume); slowest > resumeTarget {
		t.Fatalf("a leader move resumed %s after the move, want within %s", slowest, resumeTarget)
	}
}

// leaderMoveNoise is how much slower the last leader moves' median resume
// may be than the first's (TestLeaderMovesPace, TestClusterLeaderMoves): a
// fifth of the 250 ms a backoff carried from move to move would add by then.
const leaderMoveNoise = 50 * time.Millisecond

// resumeWatch tells when the first message at or above an offset is handled.
type resumeWatch struct {
	mu      sync.Mutex
	from    int64 // -1: not waiting
	resumed chan time.Time
}

// wait returns the channel that gets the time the first message at or
// above from is handled.
func (w *resumeWatch) wait(from int64) <-chan time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.from, w.resumed = from, make(chan time.Time, 1)
	return w.resumed
}

func (w *resumeWatch) handled(offset int64) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.resumed != nil && w.from >= 0 && offset >= w.from {
		w.resumed <- now
		w.from = -1
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
