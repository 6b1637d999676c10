package tidemark_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/offsetstore"
)

// Scenario 3: commits fail with coordinator errors for a while. Handling
// never stops; a restart during the outage resumes at the local watermark
// and handles nothing twice; once commits succeed again, Kafka's committed
// offset catches up within two commit intervals.
func TestCommitOutage(t *testing.T) {
	const parts, perPart = 4, 400
	const interval = 500 * time.Millisecond
	cl, topic := newTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	file := filepath.Join(t.TempDir(), "offsets.db")

	// Coordinator errors on every commit: COORDINATOR_NOT_AVAILABLE and
	// NOT_COORDINATOR, alternating.
	fail15, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	cfg := baseConfig(t, cl, group, topic, file, rec)
	cfg.CommitInterval = interval
	r := startConsumer(t, cfg)
	stopWatch := watchInvariant(t, r, cl, group, topic, parts)
	waitFor(t, time.Minute, "first batch handled during the outage", func() bool { return rec.count() == parts*perPart })
	waitFor(t, 10*time.Second, "some commits refused", func() bool { return fail15.Applied() >= 2 })
	if c := cl.Committed(t, group, topic, parts); !equalOffsets(c, offsets(parts, -1)) {
		t.Fatalf("Kafka committed %v while every commit failed", c)
	}
	st := r.c.Stats()
	checkInvariant(t, st)
	for _, p := range st.Partitions {
		if p.Durable != perPart {
			t.Fatalf("durable watermark %d on %s/%d during the outage, want %d\n%s", p.Durable, p.Topic, p.Partition, perPart, statsString(st))
		}
	}

	// Restart during the outage: the final commit fails too.
	stopWatch()
	r.stop(t)
	fail15.Remove()
	fail16, err := cl.Proxy.Fail(kmsg.OffsetCommit, 16)
	if err != nil {
		t.Fatal(err)
	}
	cl.Produce(t, topic, parts, perPart, perPart)
	r2 := startConsumer(t, cfg)
	waitFor(t, time.Minute, "second batch handled during the outage", func() bool { return rec.count() == 2*parts*perPart })
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, 2*perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("after a restart during the outage: %d lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if fail16.Applied() == 0 {
		t.Fatal("no commit was refused after the restart")
	}

	// Recovery: Kafka catches up within two commit intervals.
	fail16.Remove()
	healed := time.Now()
	end := offsets(parts, 2*perPart)
	for {
		c, err := cl.TryCommitted(group, topic, parts)
		if err == nil && equalOffsets(c, end) {
			break
		}
		if time.Since(healed) > 2*interval {
			t.Fatalf("Kafka committed %v (err %v) %s after the outage ended, want %v within 2 commit intervals (%s)",
				c, err, time.Since(healed).Round(time.Millisecond), end, 2*interval)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("Kafka caught up %s after the outage ended (commit interval %s); %d commits refused with code 15, %d with 16",
		time.Since(healed).Round(time.Millisecond), interval, fail15.Applied(), fail16.Applied())
	checkInvariant(t, r2.c.Stats())
	r2.stop(t)
}

// Scenario 4: members join and leave a group gracefully while messages
// flow: one, two, three members, then back to one. Nothing is lost and,
// thanks to the commit on revoke, nothing is handled twice.
func TestMembersJoinAndLeave(t *testing.T) {
	const parts = 6
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	dir := t.TempDir()
	rec := newRecorder()

	// A producer appends a batch to every partition every 100 ms.
	const perBatch = 20
	var produced int
	stopProducing := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stopProducing:
				return
			case <-tk.C:
				cl.Produce(t, topic, parts, produced, perBatch)
				produced += perBatch
			}
		}
	}()

	member := func(name string) *running {
		cfg := baseConfig(t, cl, group, topic, filepath.Join(dir, name+".db"), rec)
		cfg.ClientID = name
		return startConsumer(t, cfg)
	}
	waitMoving := func(what string) {
		n := rec.count()
		waitFor(t, 45*time.Second, what, func() bool { return rec.count() > n+parts*perBatch })
	}
	a := member("a")
	waitMoving("a consuming")
	b := member("b")
	waitFor(t, 45*time.Second, "b assigned", func() bool { return handledBy(b) > 0 })
	c := member("c")
	waitFor(t, 45*time.Second, "c assigned", func() bool { return handledBy(c) > 0 })
	waitMoving("three members consuming")
	b.stop(t)
	waitMoving("two members consuming after b left")
	c.stop(t)
	waitMoving("a alone after c left")
	close(stopProducing)
	wg.Wait()
	end := offsets(parts, int64(produced))
	waitFor(t, time.Minute, "everything handled", func() bool { return rec.count() == parts*produced })
	a.stop(t)

	lost, dups := rec.check(parts, offsets(parts, 0), end)
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d messages lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if got := cl.Committed(t, group, topic, parts); !equalOffsets(got, end) {
		t.Fatalf("committed %v, want %v", got, end)
	}
	t.Logf("%d messages over 4 rebalances with 1-3 members: 0 lost, 0 handled twice (a %d, b %d, c %d)",
		parts*produced, handledBy(a), handledBy(b), handledBy(c))
}

func handledBy(r *running) uint64 {
	var n uint64
	for _, p := range r.c.Stats().Partitions {
		n += p.Handled
	}
	return n
}

var _ = fmt.Sprint
var _ = framework.StateRunning

// Network faults between the consumer and the broker: every connection
// reset several times, then a blackhole longer than a heartbeat interval.
// A single instance resumes from its own offset file each time its
// generation ends: nothing lost, nothing handled twice.
//
// The faults overlap consumption by construction and the test checks that
// they did: the Handler lets through only a quota of messages, raised
// step by step around the faults, so that each fault finds the consumer
// with messages handled and messages left; each reset must find open
// connections and be followed by new ones, the blackhole must hold
// requests of the consumer, and messages must be handled after the last
// fault.
func TestNetworkFaults(t *testing.T) {
	const parts, perPart = 4, 3000
	const total = parts * perPart
	const step = 1000
	cl, topic := newTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	rec := newRecorder()
	var quota atomic.Int64 // handlings allowed so far
	var admitted atomic.Int64
	quota.Store(step)
	rec.before = func(ctx context.Context, m kafka.Message) error {
		for {
			if n := admitted.Load(); n < quota.Load() {
				if admitted.CompareAndSwap(n, n+1) {
					return nil
				}
				continue
			}
			select {
			case <-ctx.Done():
				return ctx.Err() // not done: handled again later
			case <-time.After(time.Millisecond):
			}
		}
	}
	r := startConsumer(t, baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	stopWatch := watchInvariant(t, r, cl, group, topic, parts)
	waitFor(t, time.Minute, "the first quota handled", func() bool { return rec.count() == step })

	type window struct {
		what                   string
		handledAt, handledEnd  int
		open                   int
		acceptedAt, acceptedTo int64
		seen                   int64
	}
	var windows []window
	for i := 0; i < 3; i++ {
		w := window{what: fmt.Sprintf("reset %d", i+1), handledAt: rec.count()}
		st := cl.Proxy.Stats()
		w.open, w.acceptedAt = st.Open, st.Accepted
		quota.Add(step)
		cl.Proxy.ResetAll()
		// The consumer reconnects and goes on.
		waitFor(t, time.Minute, "new connections after "+w.what, func() bool { return cl.Proxy.Stats().Accepted > w.acceptedAt })
		time.Sleep(300 * time.Millisecond)
		w.handledEnd, w.acceptedTo = rec.count(), cl.Proxy.Stats().Accepted
		windows = append(windows, w)
	}
	bh := window{what: "2s blackhole", handledAt: rec.count()}
	seen0 := cl.Proxy.Counts(kafkaproxy.AnyKey).Seen
	quota.Add(step)
	cl.Proxy.Blackhole(true)
	time.Sleep(2 * time.Second)
	bh.seen = cl.Proxy.Counts(kafkaproxy.AnyKey).Seen - seen0
	bh.handledEnd = rec.count()
	cl.Proxy.Blackhole(false)
	windows = append(windows, bh)
	afterFaults := rec.count()
	quota.Store(total)
	waitFor(t, 2*time.Minute, "everything handled", func() bool { return rec.count() == total })
	stopWatch()
	r.stop(t)

	for _, w := range windows {
		t.Logf("%s: %d handled when it began, %d when it ended; %d connections open, accepted %d -> %d; %d requests into the blackhole",
			w.what, w.handledAt, w.handledEnd, w.open, w.acceptedAt, w.acceptedTo, w.seen)
		if w.handledAt == 0 || w.handledAt >= total {
			t.Errorf("%s began with %d of %d messages handled: it did not overlap consumption", w.what, w.handledAt, total)
		}
	}
	for _, w := range windows[:3] {
		if w.open == 0 {
			t.Errorf("%s found no connection of the consumer open", w.what)
		}
	}
	if bh.seen == 0 {
		t.Errorf("the blackhole held no request of the consumer")
	}
	if afterFaults >= total {
		t.Errorf("everything was handled by the end of the faults (%d): nothing handled after them", afterFaults)
	}
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
	if got := cl.Committed(t, group, topic, parts); !equalOffsets(got, offsets(parts, perPart)) {
		t.Fatalf("committed %v, want %d everywhere", got, perPart)
	}
	st := cl.Proxy.Stats()
	t.Logf("%d messages through 3 resets of every connection and a 2s blackhole, %d handled after them: 0 lost, 0 handled twice (%d connections accepted)",
		total, total-afterFaults, st.Accepted)
}

// Revoke and shutdown let the Handler call in flight finish, up to
// DrainTimeout: a call that finishes in time is recorded and committed; one
// that does not gets its context cancelled, is not marked done, and is
// handled again by the next run.
func TestDrain(t *testing.T) {
	const perPart = 20
	setup := func(t *testing.T) (*testsupport.Cluster, string, string, string) {
		cl, topic := newTopic(t, 1, perPart)
		return cl, topic, testsupport.Name(t, "g"), filepath.Join(t.TempDir(), "o.db")
	}
	t.Run("in-flight call finishes", func(t *testing.T) {
		cl, topic, group, file := setup(t)
		rec := newRecorder()
		entered := make(chan struct{})
		rec.before = func(ctx context.Context, m kafka.Message) error {
			if m.Offset == 5 {
				close(entered)
				time.Sleep(300 * time.Millisecond) // ignores ctx, finishes within DrainTimeout
			}
			return nil
		}
		r := startConsumer(t, baseConfig(t, cl, group, topic, file, rec))
		<-entered
		r.stop(t)
		if got := cl.Committed(t, group, topic, 1)[0]; got != 6 {
			t.Fatalf("committed %d after the drain, want 6 (the in-flight message done)", got)
		}
	})
	t.Run("DrainTimeout cancels", func(t *testing.T) {
		cl, topic, group, file := setup(t)
		rec := newRecorder()
		entered := make(chan struct{})
		var waited time.Duration
		var stopAt time.Time
		var mu sync.Mutex
		rec.before = func(ctx context.Context, m kafka.Message) error {
			if m.Offset != 5 {
				return nil
			}
			close(entered)
			<-ctx.Done() // a call that only ends when cancelled
			mu.Lock()
			waited = time.Since(stopAt)
			mu.Unlock()
			return ctx.Err()
		}
		cfg := baseConfig(t, cl, group, topic, file, rec)
		cfg.DrainTimeout = 500 * time.Millisecond
		r := startConsumer(t, cfg)
		<-entered
		mu.Lock()
		stopAt = time.Now()
		mu.Unlock()
		r.stop(t)
		mu.Lock()
		defer mu.Unlock()
		if waited < cfg.DrainTimeout {
			t.Fatalf("the Handler's context was cancelled %s after the stop, before DrainTimeout %s", waited, cfg.DrainTimeout)
		}
		if got := cl.Committed(t, group, topic, 1)[0]; got != 5 {
			t.Fatalf("committed %d, want 5 (the cancelled message not done)", got)
		}
		rec.before = nil
		r = startConsumer(t, baseConfig(t, cl, group, topic, file, rec))
		waitFor(t, time.Minute, "the rest handled", func() bool { return rec.count() == perPart })
		r.stop(t)
		lost, dups := rec.check(1, offsets(1, 0), offsets(1, perPart))
		if len(lost) > 0 || dups > 0 {
			t.Fatalf("%d lost, %d handled twice", len(lost), dups)
		}
	})
}

// A message whose Handler keeps failing stalls its partition visibly
// (Stats: retrying, attempts, the error) while other partitions move on;
// once it succeeds, nothing was skipped.
func TestFailingMessageStallsOnlyItsPartition(t *testing.T) {
	const parts, perPart = 3, 200
	cl, topic := newTopic(t, parts, perPart)
	var healed atomic.Bool
	rec := newRecorder()
	rec.before = func(_ context.Context, m kafka.Message) error {
		if m.Partition == 1 && m.Offset == 42 && !healed.Load() {
			return errors.New("downstream unavailable")
		}
		return nil
	}
	r := startConsumer(t, baseConfig(t, cl, testsupport.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), rec))
	waitFor(t, time.Minute, "other partitions done, partition 1 retrying", func() bool {
		ps := r.c.Stats().Partitions
		return len(ps) == parts && ps[0].Processed == perPart && ps[2].Processed == perPart &&
			ps[1].State == framework.StateRetrying && ps[1].Attempts >= 3
	})
	p1 := r.c.Stats().Partitions[1]
	if p1.Processed != 42 || p1.Lag != perPart-42 || !strings.Contains(p1.LastError, "downstream unavailable") {
		t.Fatalf("stalled partition stats: %+v", p1)
	}
	healed.Store(true)
	waitFor(t, time.Minute, "everything handled", func() bool { return rec.count() == parts*perPart })
	if st := r.c.Stats().Partitions[1].State; st != framework.StateRunning {
		t.Fatalf("state %s after the message succeeded", st)
	}
	r.stop(t)
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d lost, %d handled twice", len(lost), dups)
	}
}

// A Handler that ignores its context cannot hold Run forever: after
// DrainTimeout plus the grace period, Run returns an error naming the
// partition and offset still in a call; that message is not marked done
// (the offset file and Kafka stay before it, so it is handled again), and
// the offset file is closed cleanly.
func TestShutdownAbandonsStuckHandler(t *testing.T) {
	cl, topic := newTopic(t, 1, 20)
	group := testsupport.Name(t, "g")
	file := filepath.Join(t.TempDir(), "o.db")
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec := newRecorder()
	rec.before = func(_ context.Context, m kafka.Message) error {
		if m.Offset == 5 {
			once.Do(func() { close(entered) })
			<-release // ignores its context
		}
		return nil
	}
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	cfg := baseConfig(t, cl, group, topic, file, rec)
	cfg.DrainTimeout = 500 * time.Millisecond
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the Handler was never called on offset 5")
	}
	start := time.Now()
	cancel()
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30 s after its context was cancelled, with a Handler call stuck")
	}
	took := time.Since(start)
	want := fmt.Sprintf("%s/0 offset 5", topic)
	if runErr == nil || !strings.Contains(runErr.Error(), want) {
		t.Fatalf("Run returned %v after %s, want an error naming %q", runErr, took, want)
	}
	t.Logf("Run returned after %s: %v", took, runErr)
	close(release) // the abandoned call returns now: nothing may record it
	time.Sleep(200 * time.Millisecond)

	s, err := offsetstore.Open(file, &offsetstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("reopening the offset file: %v", err)
	}
	defer s.Close()
	if r, _ := s.Durable(offsetstore.Key{Group: group, Topic: topic}); r.Watermark != 5 {
		t.Fatalf("offset file watermark %d, want 5: the abandoned message is not done", r.Watermark)
	}
	if got := cl.Committed(t, group, topic, 1); got[0] != 5 {
		t.Fatalf("Kafka committed %d, want 5", got[0])
	}
}

// A drain close to DrainTimeout does not cost the member its session:
// heartbeats run on their own schedule through the drain. Member a owns
// every partition; when b joins, the partitions that move to b are revoked
// by a while each is in a Handler call taking 7 s, longer than the 6 s
// session timeout. a keeps its membership, its final commits land, and b
// starts exactly after them: nothing is handled twice.
func TestLongDrainKeepsSession(t *testing.T) {
	const parts = 4
	cl, topic := newTopic(t, parts, 20)
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	var slow atomic.Bool
	var slowOnce sync.Map
	rec := newRecorder()
	rec.before = func(ctx context.Context, m kafka.Message) error {
		if slow.Load() {
			if _, seen := slowOnce.LoadOrStore(m.Partition, true); !seen {
				select { // a long call that still honours its context
				case <-time.After(7 * time.Second):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	}
	member := func(name string) *running {
		cfg := baseConfig(t, cl, group, topic, filepath.Join(dir, name+".db"), rec)
		cfg.ClientID = name
		cfg.DrainTimeout = 8 * time.Second
		cfg.RebalanceTimeout = 20 * time.Second
		return startConsumer(t, cfg)
	}
	a := member("a")
	waitFor(t, time.Minute, "a consuming", func() bool { return rec.count() == parts*20 })
	memberA := a.c.Stats().Member
	slow.Store(true)
	cl.Produce(t, topic, parts, 20, 20)
	time.Sleep(500 * time.Millisecond) // a's calls on the new messages are under way
	b := member("b")
	waitFor(t, time.Minute, "b assigned and consuming", func() bool { return handledBy(b) > 0 })
	waitFor(t, time.Minute, "everything handled", func() bool { return rec.count() >= parts*40 })
	if got := a.c.Stats().Member; got != memberA {
		t.Errorf("a's member id changed from %s to %s: it lost its membership during the drain", memberA, got)
	}
	b.stop(t)
	a.stop(t)
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, 40))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d lost (%v), %d handled twice", len(lost), head(lost), dups)
	}
}
