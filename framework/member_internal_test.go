package framework

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// owners is who owns each partition across the members of a test: a
// membership must revoke a partition before the group hands it on.
type owners struct {
	mu    sync.Mutex
	owner map[topicPartition]string
	bad   []string
}

// fakeAssignee is an assignee that records what its membership tells it.
type fakeAssignee struct {
	name string
	all  *owners

	mu     sync.Mutex
	parts  map[topicPartition]bool
	events []string
}

func (f *fakeAssignee) owned() []topicPartition {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []topicPartition
	for tp := range f.parts {
		out = append(out, tp)
	}
	slices.SortFunc(out, compareTP)
	return out
}

func (f *fakeAssignee) start(_ context.Context, tps []topicPartition) {
	f.all.mu.Lock()
	for _, tp := range tps {
		if o := f.all.owner[tp]; o != "" {
			f.all.bad = append(f.all.bad, fmt.Sprintf("%s/%d assigned to %s while %s owns it", tp.topic, tp.partition, f.name, o))
		}
		f.all.owner[tp] = f.name
	}
	f.all.mu.Unlock()
	f.record("start", tps, func(tp topicPartition) { f.parts[tp] = true })
}

func (f *fakeAssignee) revoke(tps []topicPartition, commit bool, reason string) {
	f.release(tps)
	f.record(fmt.Sprintf("revoke commit=%v %s", commit, reason), tps, func(tp topicPartition) { delete(f.parts, tp) })
}

func (f *fakeAssignee) lose(tps []topicPartition, reason string) {
	f.release(tps)
	f.record("lose "+reason, tps, func(tp topicPartition) { delete(f.parts, tp) })
}

func (f *fakeAssignee) seen(map[string]int, []string) {}

func (f *fakeAssignee) release(tps []topicPartition) {
	f.all.mu.Lock()
	defer f.all.mu.Unlock()
	for _, tp := range tps {
		if f.all.owner[tp] == f.name {
			delete(f.all.owner, tp)
		}
	}
}

func (f *fakeAssignee) record(what string, tps []topicPartition, apply func(topicPartition)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tp := range tps {
		apply(tp)
	}
	if len(tps) > 0 {
		f.events = append(f.events, fmt.Sprintf("%s %v", what, tps))
	}
}

func (f *fakeAssignee) history() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

// runningMember is a classicMember of a Consumer that is not running,
// driving a fakeAssignee.
type runningMember struct {
	a      *fakeAssignee
	m      *classicMember
	cancel context.CancelFunc
	done   chan error
}

func startMember(t *testing.T, brokers []string, group, name, instance string, all *owners) *runningMember {
	t.Helper()
	c, err := New(Config{Brokers: brokers, GroupID: group, Topics: []string{"t"}, InstanceID: instance,
		OffsetFile: filepath.Join(t.TempDir(), "o.db"), InspectSocket: InspectDisabled, Logger: zap.NewNop(),
		Handler:        handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 5 * time.Second,
		JoinGroupBackoff: 100 * time.Millisecond, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAssignee{name: name, all: all, parts: map[topicPartition]bool{}}
	m := newClassicMember(&c.cfg, c.log, a, c.identity, &coordinator{cfg: &c.cfg, cl: c.cl}, c.cl, c.deadLetters, &c.live.group)
	c.member = m
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningMember{a: a, m: m, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- m.run(ctx)
		c.cl.client.Close()
		_ = c.store.Close()
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *runningMember) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the membership did not end within 30s of its context")
		return nil
	}
}

// The classic membership's state machine, against kfake: the first member
// gets every partition; a second one joining takes half, which the first
// revokes (with a final commit) before the group hands them on, keeping
// the rest running (cooperative-sticky); a member that stops revokes with a
// commit and leaves, and the other gets its partitions back. A static
// member whose InstanceID another member takes is fenced: it gives its
// partitions up without a commit and run returns ErrFencedInstance.
func TestClassicMemberLifecycle(t *testing.T) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "t"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	brokers := fake.ListenAddrs()
	all := &owners{owner: map[topicPartition]string{}}
	n := func(r *runningMember) int { return len(r.a.owned()) }

	a := startMember(t, brokers, "g", "a", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions", func() bool { return n(a) == 4 })
	if gen, id := a.m.ident.get(); gen <= 0 || id == "" {
		t.Fatalf("a's identity (%d, %q) after joining", gen, id)
	}
	b := startMember(t, brokers, "g", "b", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a and b own 2 partitions each", func() bool { return n(a) == 2 && n(b) == 2 })
	hist := a.a.history()
	if len(hist) != 2 || hist[1] != fmt.Sprintf("revoke commit=true rebalance %v", b.a.owned()) {
		t.Fatalf("a's history when b joined: %q; want a start of all 4, then a revoke (with a commit) of b's 2", hist)
	}
	if err := b.stop(t); err != nil {
		t.Fatalf("b's run: %v", err)
	}
	if h := b.a.history(); len(h) != 2 || h[1][:len("revoke commit=true shutdown")] != "revoke commit=true shutdown" {
		t.Fatalf("b's history: %q; want its start, then a revoke with a commit at shutdown", h)
	}
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions again", func() bool { return n(a) == 4 })
	if st := a.m.status(); st.rebalances < 3 || st.joinErr != "" || st.settling {
		t.Fatalf("a's status %+v: want 3 generations joined or more, no join error, settled", st)
	}

	// Static members: d takes c's InstanceID.
	all2 := &owners{owner: map[topicPartition]string{}}
	c := startMember(t, brokers, "g2", "c", "same", all2)
	testsupport.WaitFor(t, 30*time.Second, "c owns the 4 partitions", func() bool { return n(c) == 4 })
	d := startMember(t, brokers, "g2", "d", "same", all2)
	var cerr error
	select {
	case cerr = <-c.done:
		close(c.done)
	case <-time.After(30 * time.Second):
		t.Fatal("c still runs 30s after d took its InstanceID")
	}
	if !errors.Is(cerr, ErrFencedInstance) {
		t.Fatalf("c's run: %v, want ErrFencedInstance", cerr)
	}
	if h := c.a.history(); len(h) < 2 || h[len(h)-1][:len("lose fenced")] != "lose fenced" {
		t.Fatalf("c's history: %q; want its partitions lost (no commit) when fenced", h)
	}
	testsupport.WaitFor(t, 30*time.Second, "d owns the 4 partitions", func() bool { return n(d) == 4 })

	// (c and d overlap: Kafka hands a static member's partitions to the
	// member that takes its InstanceID at once, and the old one learns it
	// is fenced at its next heartbeat; its commits are refused meanwhile.)
	if len(all.bad) > 0 {
		t.Fatalf("a partition owned by two members at once: %v", all.bad)
	}
	_ = a.stop(t)
	if h := a.a.history(); h[len(h)-1] != "revoke commit=true shutdown [{t 0} {t 1} {t 2} {t 3}]" {
		t.Fatalf("a's last event %q, want a revoke of all 4 with a commit at shutdown", h[len(h)-1])
	}
}
