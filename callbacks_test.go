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

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// The partition callbacks (Config.OnAssigned, Config.OnRevoked): when they
// are called, around which Handler calls and which commits, what an error
// does, and a lapse.

// lifeEvent is what a consumer's callbacks and Handler saw, in the order
// they happened across the consumers of a test.
type lifeEvent struct {
	member string
	kind   string // "assigned", "handled" or "revoked"
	part   int
	// offset: the message's, handled; Kafka's committed offset of the
	// partition seen from the callback, assigned and revoked.
	offset int64
	lost   bool
}

func (e lifeEvent) String() string {
	s := fmt.Sprintf("%s %s %d@%d", e.member, e.kind, e.part, e.offset)
	if e.lost {
		s += " (lost)"
	}
	return s
}

// lifecycle records the events of a test's consumers.
type lifecycle struct {
	cl           *testsupport.Cluster
	group, topic string
	parts        int

	mu     sync.Mutex
	events []lifeEvent
}

func (l *lifecycle) add(e lifeEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *lifecycle) list() []lifeEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lifeEvent(nil), l.events...)
}

// of returns the events of kind, of member ("" any).
func (l *lifecycle) of(member, kind string) []lifeEvent {
	var out []lifeEvent
	for _, e := range l.list() {
		if e.kind == kind && (member == "" || e.member == member) {
			out = append(out, e)
		}
	}
	return out
}

// committed is Kafka's committed offset of partition, read from the
// broker (not through the proxy); -2 if it could not be read.
func (l *lifecycle) committed(partition int) int64 {
	c, err := l.cl.TryCommitted(l.group, l.topic, l.parts)
	if err != nil {
		return -2
	}
	return c[partition]
}

// wire sets cfg's callbacks and wraps its Handler to record member's
// events. onRevoked, when set, runs in OnRevoked after the event is
// recorded.
func (l *lifecycle) wire(t *testing.T, cfg *framework.Config, member string, onRevoked func(partition int)) {
	cfg.OnAssigned = func(ctx context.Context, topic string, partition int) error {
		if topic != l.topic {
			t.Errorf("OnAssigned of topic %q, want %q", topic, l.topic)
		}
		if ctx.Err() != nil {
			t.Errorf("OnAssigned of %d: ctx already done: %v", partition, ctx.Err())
		}
		l.add(lifeEvent{member: member, kind: "assigned", part: partition, offset: l.committed(partition)})
		return nil
	}
	cfg.OnRevoked = func(ctx context.Context, topic string, partition int, lost bool) {
		if _, ok := ctx.Deadline(); !ok {
			t.Errorf("OnRevoked of %d: ctx without a deadline, want DrainTimeout's", partition)
		}
		l.add(lifeEvent{member: member, kind: "revoked", part: partition, offset: l.committed(partition), lost: lost})
		if onRevoked != nil {
			onRevoked(partition)
		}
	}
	next := cfg.Handler
	cfg.Handler = handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		l.add(lifeEvent{member: member, kind: "handled", part: m.Partition, offset: m.Offset})
		return next.Handle(ctx, m)
	})
}

// checkWindows fails the test unless, for each partition, the events
// nest: OnAssigned, then Handler calls of that member only, then
// OnRevoked, before the next member's OnAssigned.
func (l *lifecycle) checkWindows(t *testing.T) {
	t.Helper()
	owner := map[int]string{}
	for i, e := range l.list() {
		switch e.kind {
		case "assigned":
			if o := owner[e.part]; o != "" {
				t.Errorf("event %d, %v: partition %d still owned by %s (no OnRevoked yet)", i, e, e.part, o)
			}
			owner[e.part] = e.member
		case "handled":
			if owner[e.part] != e.member {
				t.Errorf("event %d, %v: a Handler call outside %s's OnAssigned..OnRevoked of partition %d (owner %q)", i, e, e.member, e.part, owner[e.part])
			}
		case "revoked":
			if owner[e.part] != e.member {
				t.Errorf("event %d, %v: OnRevoked without its OnAssigned (owner %q)", i, e, owner[e.part])
			}
			owner[e.part] = ""
		}
	}
}

// OnAssigned comes before the first Handler call of its partition, and
// OnRevoked after the last one and before the final commit: from
// OnRevoked Kafka still holds what it held before the messages were
// handled, no offset (no commit in between: CommitInterval is an hour),
// and once Run returned the final watermark.
func TestPartitionCallbacksOrder(t *testing.T) {
	const parts, perPart = 2, 50
	cl, topic := testsupport.NewTopic(t, parts, 0)
	group := testsupport.Name(t, "g")
	l := &lifecycle{cl: cl, group: group, topic: topic, parts: parts}
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.CommitInterval = time.Hour
	l.wire(t, &cfg, "a", nil)
	r := frameworktest.Start(t, cfg)
	frameworktest.WaitRunning(t, r, parts, 30*time.Second)
	// A first start at the log's start is not committed at once (any
	// member decides it too, and CommitInterval is an hour): Kafka holds
	// none until the final commit.
	if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, -1)) {
		t.Fatalf("committed once the partitions run: %v, want none", c)
	}
	cl.Produce(t, topic, parts, 0, perPart)
	testsupport.WaitFor(t, time.Minute, "everything handled", func() bool { return rec.Count() == parts*perPart })
	r.Stop(t)

	events := l.list()
	t.Logf("%d events; callbacks: %v %v", len(events), l.of("", "assigned"), l.of("", "revoked"))
	l.checkWindows(t)
	for p := range parts {
		var seq []string
		handled := 0
		for _, e := range events {
			if e.part != p {
				continue
			}
			if e.kind == "handled" {
				handled++
				if len(seq) > 0 && seq[len(seq)-1] == "handled" {
					continue
				}
			}
			seq = append(seq, e.kind)
		}
		if got := strings.Join(seq, " "); got != "assigned handled revoked" {
			t.Errorf("partition %d: events %q, want %q", p, got, "assigned handled revoked")
		}
		if handled != perPart {
			t.Errorf("partition %d: %d Handler calls, want %d", p, handled, perPart)
		}
	}
	for _, e := range l.of("", "revoked") {
		if e.lost {
			t.Errorf("%v: lost at a graceful stop, want false", e)
		}
		if e.offset != -1 {
			t.Errorf("%v: Kafka's committed offset seen from OnRevoked is %d, want none, as before the messages: the final commit comes after", e, e.offset)
		}
	}
	if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, perPart)) {
		t.Errorf("committed after Run returned: %v, want %d on each partition (the final commit after OnRevoked)", c, perPart)
	}
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
}

// While OnRevoked runs, no background commit round sends the drained
// partition's final watermark: the consumer handles without pause and
// commits every 100 ms, OnRevoked waits five rounds and reads Kafka's
// committed offset before and after, and the two are the same; the final
// commit then lands the watermark the drain left.
func TestOnRevokedHoldsTheFinalCommit(t *testing.T) {
	const parts, perPart = 2, 2000
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	l := &lifecycle{cl: cl, group: group, topic: topic, parts: parts}
	rec := &testsupport.Recorder{Before: func(context.Context, kafka.Message) error {
		time.Sleep(time.Millisecond) // still handling at the stop
		return nil
	}}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	type reads struct{ before, after int64 }
	var mu sync.Mutex
	seen := map[int]reads{}
	l.wire(t, &cfg, "a", func(p int) {
		before := l.committed(p)
		time.Sleep(5 * cfg.CommitInterval)
		mu.Lock()
		seen[p] = reads{before, l.committed(p)}
		mu.Unlock()
	})
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "a few hundred handled and committed", func() bool {
		c, err := cl.TryCommitted(group, topic, parts)
		return err == nil && rec.Count() > 400 && c[0] > 100 && c[1] > 100
	})
	r.Stop(t)
	final := cl.Committed(t, group, topic, parts)
	st := r.C.Stats()
	for p := range parts {
		s, ok := seen[p]
		if !ok {
			t.Fatalf("no OnRevoked for partition %d", p)
		}
		t.Logf("partition %d: committed %d when OnRevoked began, %d after it waited, %d after Run returned", p, s.before, s.after, final[p])
		if s.after != s.before {
			t.Errorf("partition %d: Kafka's committed offset moved from %d to %d while OnRevoked ran, want no commit before the final one", p, s.before, s.after)
		}
		var processed int64 = -1
		for _, ps := range st.Partitions {
			if ps.Partition == p {
				processed = ps.Processed
			}
		}
		if final[p] != processed {
			t.Errorf("partition %d: committed %d after Run returned, want the drained watermark %d", p, final[p], processed)
		}
	}
	l.checkWindows(t)
}

// A failing OnAssigned holds its partition: not fetched, reconciling in
// Stats with the error (a panic recovered into one), called again until
// it returns nil; the other partitions run meanwhile. A partition whose
// OnAssigned never returned nil gets no OnRevoked.
func TestOnAssignedError(t *testing.T) {
	const parts, perPart = 3, 20
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.RetryBackoff, cfg.MaxRetryBackoff = 5*time.Millisecond, 20*time.Millisecond
	var calls [parts]atomic.Int64
	var release atomic.Bool
	errLoad := errors.New("loading the partition's cache failed")
	cfg.OnAssigned = func(ctx context.Context, _ string, p int) error {
		n := calls[p].Add(1)
		switch {
		case p == 0 && n == 1:
			panic("cache not configured")
		case p == 0 && !release.Load():
			return errLoad
		case p == 2:
			return fmt.Errorf("never: %w", errLoad)
		}
		return nil
	}
	var mu sync.Mutex
	revoked := map[int]int{}
	cfg.OnRevoked = func(_ context.Context, _ string, p int, lost bool) {
		mu.Lock()
		revoked[p]++
		mu.Unlock()
	}
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "partition 1 handled", func() bool { return rec.Times(1, perPart-1) == 1 })
	testsupport.WaitFor(t, 10*time.Second, "OnAssigned of partition 0 called again after the panic and an error", func() bool { return calls[0].Load() >= 3 })
	st := r.C.Stats()
	for _, ps := range st.Partitions {
		if ps.Partition == 1 {
			continue
		}
		if ps.State != framework.StateReconciling || ps.Handled != 0 {
			t.Errorf("partition %d while OnAssigned fails: state %s, handled %d; want reconciling, 0", ps.Partition, ps.State, ps.Handled)
		}
		for _, want := range []string{"OnAssigned", fmt.Sprintf("%s/%d", topic, ps.Partition), errLoad.Error()} {
			if !strings.Contains(ps.LastError, want) {
				t.Errorf("partition %d: LastError %q does not say %q", ps.Partition, ps.LastError, want)
			}
		}
	}
	if err := r.C.Ready(); err == nil {
		t.Errorf("Ready() = nil while two partitions cannot start, want an error naming them")
	}
	release.Store(true)
	testsupport.WaitFor(t, time.Minute, "partition 0 handled once OnAssigned returns nil", func() bool { return rec.Times(0, perPart-1) == 1 })
	r.Stop(t)
	if rec.Times(2, 0) != 0 {
		t.Errorf("partition 2 was handled, want none: its OnAssigned never returned nil")
	}
	mu.Lock()
	defer mu.Unlock()
	if revoked[0] != 1 || revoked[1] != 1 || revoked[2] != 0 {
		t.Errorf("OnRevoked calls by partition %v, want 0 and 1 once, 2 never", revoked)
	}
	t.Logf("OnAssigned calls: %d, %d, %d", calls[0].Load(), calls[1].Load(), calls[2].Load())
}

// A membership that lapses (the consumer cut off from every broker) gives
// its partitions up without a final commit: OnRevoked says lost, and
// Kafka's committed offset stays what it was. Back in the group, the
// partitions are assigned again (OnAssigned) and a graceful stop revokes
// them, not lost.
func TestOnRevokedLostOnLapse(t *testing.T) {
	const parts, perPart = 2, 50
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	l := &lifecycle{cl: cl, group: group, topic: topic, parts: parts}
	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.SessionTimeout, cfg.HeartbeatInterval, cfg.Timeout = 3*time.Second, 500*time.Millisecond, 10*time.Second
	l.wire(t, &cfg, "a", nil)
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "everything handled and committed", func() bool {
		c, err := cl.TryCommitted(group, topic, parts)
		return err == nil && testsupport.EqualOffsets(c, testsupport.Offsets(parts, perPart))
	})
	cl.Proxy.Blackhole(true)
	cl.Proxy.ResetAll()
	testsupport.WaitFor(t, 30*time.Second, "the partitions given up", func() bool { return len(l.of("a", "revoked")) == parts })
	cl.Proxy.Blackhole(false)
	for _, e := range l.of("a", "revoked") {
		if !e.lost {
			t.Errorf("%v: at a lapse, want lost", e)
		}
		if e.offset != perPart {
			t.Errorf("%v: Kafka's committed offset %d, want %d", e, e.offset, perPart)
		}
	}
	if st := r.C.Stats(); st.PartitionsLost != parts {
		t.Errorf("Stats.PartitionsLost = %d, want %d", st.PartitionsLost, parts)
	}
	testsupport.WaitFor(t, time.Minute, "the partitions assigned again", func() bool { return len(l.of("a", "assigned")) == 2*parts })
	cl.Produce(t, topic, parts, perPart, perPart)
	testsupport.WaitFor(t, time.Minute, "the messages after the lapse handled", func() bool { return rec.Count() == 2*parts*perPart })
	r.Stop(t)
	revs := l.of("a", "revoked")
	if len(revs) != 2*parts {
		t.Fatalf("OnRevoked calls %v, want %d", revs, 2*parts)
	}
	for _, e := range revs[parts:] {
		if e.lost {
			t.Errorf("%v: at a graceful stop, want not lost", e)
		}
	}
	l.checkWindows(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, 2*perPart))
}

// Two consumers: b joins while a consumes, and later a stops. Every move of
// a partition is a's OnRevoked (not lost, after a's last Handler call of
// it) before b's OnAssigned, and b's OnAssigned sees the offset a's final
// commit left.
func TestPartitionCallbacksRebalance(t *testing.T) {
	const parts, perPart = 4, 300
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	l := &lifecycle{cl: cl, group: group, topic: topic, parts: parts}
	rec := &testsupport.Recorder{Before: func(context.Context, kafka.Message) error {
		time.Sleep(time.Millisecond) // spread the backlog over the rebalances
		return nil
	}}
	dir := t.TempDir()
	member := func(name string) *frameworktest.Running {
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(dir, name+".db"), rec)
		cfg.ClientID = name
		l.wire(t, &cfg, name, nil)
		return frameworktest.Start(t, cfg)
	}
	a := member("a")
	testsupport.WaitFor(t, 30*time.Second, "a assigned every partition", func() bool { return len(l.of("a", "assigned")) == parts })
	b := member("b")
	testsupport.WaitFor(t, time.Minute, "b assigned some", func() bool { return len(l.of("b", "assigned")) > 0 })
	a.Stop(t)
	testsupport.WaitFor(t, time.Minute, "b assigned every partition a had", func() bool { return len(l.of("b", "assigned")) >= parts })
	testsupport.WaitFor(t, time.Minute, "everything handled", func() bool { return rec.Count() == parts*perPart })
	b.Stop(t)

	t.Logf("callbacks: a %v %v; b %v %v", l.of("a", "assigned"), l.of("a", "revoked"), l.of("b", "assigned"), l.of("b", "revoked"))
	l.checkWindows(t)
	revokedAt := map[int]int64{} // a's last handled offset + 1, by partition, at its revoke
	lastHandled := map[int]int64{}
	for _, e := range l.list() {
		switch {
		case e.kind == "handled" && e.member == "a":
			lastHandled[e.part] = e.offset + 1
		case e.kind == "revoked" && e.member == "a":
			if e.lost {
				t.Errorf("%v: lost at a rebalance, want a final commit", e)
			}
			revokedAt[e.part] = lastHandled[e.part]
		case e.kind == "assigned" && e.member == "b":
			if at, ok := revokedAt[e.part]; ok && e.offset != at {
				t.Errorf("%v: b's OnAssigned saw Kafka's committed offset %d, want %d, where a's final commit left it", e, e.offset, at)
			}
		}
	}
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
}
