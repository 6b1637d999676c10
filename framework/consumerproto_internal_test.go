package framework

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
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

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/wire"
)

// runningConsumerMember is a consumerMember of a Consumer that is not
// running, driving a fakeAssignee.
type runningConsumerMember struct {
	runningMember
	cm *consumerMember
}

func startConsumerMember(t *testing.T, brokers []string, group, name, instance, assignor string, all *owners) *runningConsumerMember {
	t.Helper()
	c, err := New(Config{Brokers: brokers, GroupID: group, Topics: []string{"t"}, InstanceID: instance,
		GroupProtocol: GroupProtocolConsumer, GroupRemoteAssignor: assignor,
		OffsetFile: filepath.Join(t.TempDir(), "o.db"), InspectSocket: InspectDisabled, Logger: zap.NewNop(),
		Handler:          handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
		RebalanceTimeout: 5 * time.Second, JoinGroupBackoff: 100 * time.Millisecond, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAssignee{name: name, all: all, parts: map[topicPartition]bool{}}
	coord := &coordinator{cfg: &c.cfg, cl: c.cl, versions: consumerProtocolVersions, ident: c.identity}
	m := newConsumerMember(&c.cfg, c.log, a, c.identity, coord, c.cl, c.deadLetters, &c.live.group)
	c.member = m
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningConsumerMember{runningMember: runningMember{a: a, cancel: cancel, done: make(chan error, 1)}, cm: m}
	go func() {
		r.done <- m.run(ctx)
		c.cl.client.Close()
		_ = c.store.Close()
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// newConsumerCluster is a kfake cluster whose consumer-protocol members
// heartbeat every 100 ms.
func newConsumerCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "t"),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "100"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return fake
}

// The consumer protocol's membership against kfake, with a fake assignee:
// the first member gets every partition at an epoch above 0 with a member
// id it generated; a second one joining gets half, which the first revokes
// (with a final commit) before the coordinator gives them on, keeping the
// rest; a member that stops revokes with a commit and leaves, and the
// other gets every partition back. No partition is ever started by one
// member while another owns it.
func TestConsumerMemberLifecycle(t *testing.T) {
	fake := newConsumerCluster(t)
	brokers := fake.ListenAddrs()
	all := &owners{owner: map[topicPartition]string{}}
	n := func(r *runningConsumerMember) int { return len(r.a.owned()) }

	a := startConsumerMember(t, brokers, "g", "a", "", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions", func() bool { return n(a) == 4 })
	epoch, id := a.cm.ident.get()
	if epoch <= 0 || len(id) != 22 {
		t.Fatalf("a's identity (%d, %q) after joining: want an epoch above 0 and a 22-character generated id", epoch, id)
	}
	b := startConsumerMember(t, brokers, "g", "b", "", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a and b own 2 partitions each", func() bool { return n(a) == 2 && n(b) == 2 })
	hist := a.a.history()
	if len(hist) != 2 || !strings.HasPrefix(hist[0], "start ") || hist[1] != fmt.Sprintf("revoke commit=true rebalance %v", b.a.owned()) {
		t.Fatalf("a's history when b joined: %q; want a start of all 4, then a revoke (with a commit) of b's 2", hist)
	}
	if e, _ := a.cm.ident.get(); e <= epoch {
		t.Fatalf("a's member epoch %d after its assignment changed, want above %d", e, epoch)
	}
	if err := b.stop(t); err != nil {
		t.Fatalf("b's run: %v", err)
	}
	if h := b.a.history(); len(h) != 2 || !strings.HasPrefix(h[1], "revoke commit=true shutdown") {
		t.Fatalf("b's history: %q; want its start, then a revoke with a commit at shutdown", h)
	}
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions again", func() bool { return n(a) == 4 })
	if st := a.cm.status(); st.rebalances < 3 || st.joinErr != "" || st.settling || st.rebalancing {
		t.Fatalf("a's status %+v: want 3 assignments reconciled or more, no join error, settled", st)
	}
	if len(all.bad) > 0 {
		t.Fatalf("a partition owned by two members at once: %v", all.bad)
	}
	_ = a.stop(t)
	if h := a.a.history(); h[len(h)-1] != "revoke commit=true shutdown [{t 0} {t 1} {t 2} {t 3}]" {
		t.Fatalf("a's last event %q, want a revoke of all 4 with a commit at shutdown", h[len(h)-1])
	}
}

// failHeartbeats makes kfake answer the next n consumer group heartbeats
// with code, and counts them.
func failHeartbeats(fake *kfake.Cluster, n int32, code int16, seen *atomic.Int32) {
	fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if seen.Add(1) == n {
			fake.DropControl() // kept until now
		}
		res := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		res.ErrorCode = code
		res.HeartbeatIntervalMillis = 100
		return res, nil, true
	})
}

// FENCED_MEMBER_EPOCH: the partitions are given up without a commit and
// the member rejoins at epoch 0 with the same id, and gets them again;
// UNKNOWN_MEMBER_ID: the same, with a new id.
func TestConsumerMemberFencedEpochAndUnknownMember(t *testing.T) {
	fake := newConsumerCluster(t)
	all := &owners{owner: map[topicPartition]string{}}
	a := startConsumerMember(t, fake.ListenAddrs(), "g", "a", "", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions", func() bool { return len(a.a.owned()) == 4 })
	_, id := a.cm.ident.get()

	var seen atomic.Int32
	failHeartbeats(fake, 1, int16(errFencedMemberEpoch), &seen)
	testsupport.WaitFor(t, 30*time.Second, "a fenced, then owning the 4 again", func() bool {
		h := a.a.history()
		return seen.Load() == 1 && len(h) == 3 && len(a.a.owned()) == 4
	})
	h := a.a.history()
	if h[1] != "lose member epoch fenced [{t 0} {t 1} {t 2} {t 3}]" || !strings.HasPrefix(h[2], "start ") {
		t.Fatalf("a's history: %q; want its partitions lost (no commit) when fenced, then started again", h)
	}
	if _, again := a.cm.ident.get(); again != id {
		t.Fatalf("member id after a fenced epoch %q, want the same %q", again, id)
	}

	var seen2 atomic.Int32
	failHeartbeats(fake, 1, int16(kafka.UnknownMemberId), &seen2)
	testsupport.WaitFor(t, 30*time.Second, "a told it is unknown", func() bool { return seen2.Load() == 1 })
	// What a coordinator that answers UNKNOWN_MEMBER_ID has done: the old
	// member is gone (kfake still has it; it leaves here).
	conn, err := wire.Dial(context.Background(), fake.ListenAddrs()[0], &wire.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leave := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	leave.Group, leave.MemberID, leave.MemberEpoch = "g", id, -1
	if _, err := conn.DoVersion(context.Background(), leave, consumerHeartbeatVersion, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 30*time.Second, "a unknown, then owning the 4 again", func() bool {
		return seen2.Load() == 1 && len(a.a.history()) == 5 && len(a.a.owned()) == 4
	})
	h = a.a.history()
	if h[3] != "lose membership lost [{t 0} {t 1} {t 2} {t 3}]" {
		t.Fatalf("a's history: %q; want its partitions lost when the member was unknown", h)
	}
	if _, again := a.cm.ident.get(); again == id || len(again) != 22 {
		t.Fatalf("member id after UNKNOWN_MEMBER_ID %q, want a new one (was %q)", again, id)
	}
}

// The coordinator's refusals end run with an error that names the setting
// to change: an assignor the broker does not have (Config.GroupRemoteAssignor),
// a full group (group.consumer.max.size), an InstanceID held by another
// live member after a few tries (ErrInstanceIDInUse).
func TestConsumerMemberRefusals(t *testing.T) {
	fake := newConsumerCluster(t)
	brokers := fake.ListenAddrs()
	all := &owners{owner: map[topicPartition]string{}}
	wait := func(r *runningConsumerMember) error {
		t.Helper()
		select {
		case err := <-r.done:
			close(r.done)
			return err
		case <-time.After(30 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("%s: run did not end within 30s of the refusal (history %q, status %+v); goroutines:\n%s", r.a.name, r.a.history(), r.cm.status(), buf[:runtime.Stack(buf, true)])
			return nil
		}
	}

	a := startConsumerMember(t, brokers, "g1", "a", "", "no-such-assignor", all)
	if err := wait(a); err == nil || !strings.Contains(err.Error(), "Config.GroupRemoteAssignor \"no-such-assignor\"") || !errors.Is(err, errUnsupportedAssignor) {
		t.Fatalf("run with an unknown assignor: %v; want UNSUPPORTED_ASSIGNOR naming Config.GroupRemoteAssignor", err)
	}

	var seen atomic.Int32
	failHeartbeats(fake, 1, int16(kafka.GroupMaxSizeReached), &seen)
	b := startConsumerMember(t, brokers, "g2", "b", "", "", all)
	if err := wait(b); err == nil || !strings.Contains(err.Error(), "group.consumer.max.size") || !errors.Is(err, kafka.GroupMaxSizeReached) {
		t.Fatalf("run in a full group: %v; want GROUP_MAX_SIZE_REACHED naming group.consumer.max.size", err)
	}

	c := startConsumerMember(t, brokers, "g3", "c", "same", "", all)
	testsupport.WaitFor(t, 30*time.Second, "c owns the 4 partitions", func() bool { return len(c.a.owned()) == 4 })
	d := startConsumerMember(t, brokers, "g3", "d", "same", "", all)
	if err := wait(d); !errors.Is(err, ErrInstanceIDInUse) || !strings.Contains(err.Error(), `"same"`) {
		t.Fatalf("run of a second member with c's InstanceID: %v; want ErrInstanceIDInUse naming it", err)
	}
	if len(d.a.history()) != 0 || len(c.a.owned()) != 4 {
		t.Fatalf("d's history %q, c owns %v: want d never assigned, c keeping all 4", d.a.history(), c.a.owned())
	}

	// c's heartbeat answered FENCED_INSTANCE_ID (another member took its
	// InstanceID over): its partitions given up uncommitted, run ends.
	var fenced atomic.Int32
	failHeartbeats(fake, 1, int16(kafka.FencedInstanceID), &fenced)
	if err := wait(c); !errors.Is(err, ErrFencedInstance) || !strings.Contains(err.Error(), `"same"`) || !strings.Contains(err.Error(), "g3") {
		t.Fatalf("c's run, its heartbeat answered FENCED_INSTANCE_ID: %v; want ErrFencedInstance naming the InstanceID and the group", err)
	}
	if h := c.a.history(); h[len(h)-1] != "lose fenced [{t 0} {t 1} {t 2} {t 3}]" {
		t.Fatalf("c's history %q: want its 4 partitions lost (no commit) when fenced", h)
	}
}

// New refuses the consumer protocol's settings where they do not apply.
func TestGroupProtocolConfig(t *testing.T) {
	base := func() Config {
		return Config{Brokers: []string{"localhost:9092"}, GroupID: "g", Topics: []string{"t"},
			OffsetFile: filepath.Join(t.TempDir(), "o.db"), InspectSocket: InspectDisabled,
			Handler: handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string // "" = valid
	}{
		{"default classic", func(*Config) {}, ""},
		{"consumer", func(c *Config) { c.GroupProtocol = GroupProtocolConsumer }, ""},
		{"consumer with an assignor", func(c *Config) { c.GroupProtocol, c.GroupRemoteAssignor = GroupProtocolConsumer, "range" }, ""},
		{"unknown protocol", func(c *Config) { c.GroupProtocol = "eager" }, "GroupProtocol"},
		{"assignor with classic", func(c *Config) { c.GroupRemoteAssignor = "uniform" }, "GroupRemoteAssignor"},
		{"consumer with a session timeout", func(c *Config) { c.GroupProtocol, c.SessionTimeout = GroupProtocolConsumer, time.Minute }, "SessionTimeout"},
		{"consumer with a heartbeat interval", func(c *Config) { c.GroupProtocol, c.HeartbeatInterval = GroupProtocolConsumer, time.Second }, "HeartbeatInterval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.edit(&cfg)
			c, err := New(cfg)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if want := cfg.GroupProtocol; want != "" && c.Stats().GroupProtocol != want || want == "" && c.Stats().GroupProtocol != GroupProtocolClassic {
					t.Fatalf("Stats().GroupProtocol %q with Config.GroupProtocol %q", c.Stats().GroupProtocol, want)
				}
				_ = c.Close()
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("New: %v; want a ConfigError naming %s", err, tc.field)
			}
		})
	}
}

// A stale member epoch on the offset read of newly assigned partitions is
// retried, never taken for "no committed offset": a second consumer (with
// an offset file of its own, so Kafka's commits decide) whose first
// OffsetFetch answers are STALE_MEMBER_EPOCH resumes at what the first one
// committed, handling none of its messages again.
func TestConsumerMemberStaleEpochOnOffsetFetch(t *testing.T) {
	const parts, n = 4, 10
	fake := newConsumerCluster(t)
	brokers := fake.ListenAddrs()
	produce := func(first int) {
		t.Helper()
		kc := testsupport.NewProducer(t, brokers)
		defer kc.Close()
		var recs []*kgo.Record
		for p := range parts {
			recs = append(recs, testsupport.ValueRecords("t", p, first, n)...)
		}
		if err := testsupport.ProduceSync(kc, recs); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	handled := map[string][]int64{} // consumer -> offsets handled
	run := func(name string) (stop func()) {
		c, err := New(Config{Brokers: brokers, GroupID: "g", Topics: []string{"t"}, GroupProtocol: GroupProtocolConsumer,
			OffsetFile: filepath.Join(t.TempDir(), name+".db"), InspectSocket: InspectDisabled, Logger: zap.NewNop(),
			CommitInterval: 50 * time.Millisecond, JoinGroupBackoff: 100 * time.Millisecond,
			Handler: handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
				mu.Lock()
				handled[name] = append(handled[name], m.Offset)
				mu.Unlock()
				return nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s's Run: %v", name, err)
			}
		}
	}
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled[name])
	}

	produce(0)
	stop := run("first")
	testsupport.WaitFor(t, 30*time.Second, "the first consumer handling the first messages", func() bool { return count("first") == parts*n })
	stop() // a graceful stop commits the log end

	var stale atomic.Int32
	fake.ControlKey(int16(kmsg.OffsetFetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if stale.Add(1) == 3 {
			fake.DropControl() // kept until now
		}
		res := req.ResponseKind().(*kmsg.OffsetFetchResponse)
		for _, g := range req.(*kmsg.OffsetFetchRequest).Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group, rg.ErrorCode = g.Group, int16(errStaleMemberEpoch)
			res.Groups = append(res.Groups, rg)
		}
		return res, nil, true
	})
	produce(n)
	stop = run("second")
	testsupport.WaitFor(t, 30*time.Second, "the second consumer handling the new messages", func() bool { return count("second") >= parts*n })
	stop()
	mu.Lock()
	defer mu.Unlock()
	for _, o := range handled["second"] {
		if o < n {
			t.Fatalf("the second consumer handled offset %d again (handled %v): a stale epoch on the offset read reset the position", o, handled["second"])
		}
	}
	if got := stale.Load(); got != 3 {
		t.Fatalf("%d OffsetFetch answered STALE_MEMBER_EPOCH, want 3", got)
	}
	if len(handled["second"]) != parts*n {
		t.Fatalf("the second consumer handled %d messages, want %d", len(handled["second"]), parts*n)
	}
}

// The lease is the broker's session timeout, not Kafka's default of 45 s
// (a heartbeat's answer does not carry it): the group's own config where
// it has one (2 s here), else the broker's (3 s). The broker's heartbeat
// interval, 1.5 s, is close to the session: heartbeats answered in time
// keep the partitions (a lease of the session less an interval would
// end before each next heartbeat). A member whose heartbeats all fail
// gives its partitions up uncommitted within the session, before the
// coordinator would give them on, and joins again once the coordinator
// answers.
func TestConsumerMemberLeaseIsTheBrokersSession(t *testing.T) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "t"),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "1500", "group.consumer.session.timeout.ms": "3000"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.SetGroupConfigs("g", map[string]string{"consumer.session.timeout.ms": "2000"})
	all := &owners{owner: map[topicPartition]string{}}
	a := startConsumerMember(t, fake.ListenAddrs(), "g", "a", "", "", all)
	b := startConsumerMember(t, fake.ListenAddrs(), "g2", "b", "", "", &owners{owner: map[topicPartition]string{}})
	testsupport.WaitFor(t, 30*time.Second, "a and b own the 4 partitions of their groups", func() bool {
		return len(a.a.owned()) == 4 && len(b.a.owned()) == 4
	})
	for _, c := range []struct {
		r    *runningConsumerMember
		want time.Duration
	}{{a, 2 * time.Second}, {b, 3 * time.Second}} {
		if got, err := c.r.cm.brokerSession(context.Background()); err != nil || got != c.want {
			t.Fatalf("%s's session as the broker has it: %s, %v; want %s", c.r.a.name, got, err, c.want)
		}
	}
	time.Sleep(4 * time.Second) // two heartbeats or more, each 1.5 s after the last
	if h := a.a.history(); len(h) != 1 {
		t.Fatalf("a's history %q with its heartbeats answered: want its one start", h)
	}

	var refused atomic.Int32
	var answer atomic.Bool // the coordinator answers again
	fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if answer.Load() || req.(*kmsg.ConsumerGroupHeartbeatRequest).Group != "g" {
			return nil, nil, false
		}
		refused.Add(1)
		res := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		res.ErrorCode = int16(kafka.GroupCoordinatorNotAvailable)
		return res, nil, true
	})
	cut := time.Now()
	testsupport.WaitFor(t, 10*time.Second, "a gives its partitions up, its heartbeats refused", func() bool {
		h := a.a.history()
		return len(h) >= 2 && strings.HasPrefix(h[len(h)-1], "lose ")
	})
	took := time.Since(cut)
	answer.Store(true)
	if h := a.a.history(); h[len(h)-1] != "lose no heartbeat answered for a session timeout [{t 0} {t 1} {t 2} {t 3}]" {
		t.Fatalf("a's history: %q; want the 4 partitions lost when no heartbeat was answered for the session", h)
	}
	if took > 3*time.Second {
		t.Fatalf("a gave its partitions up %s after its heartbeats began to fail; want within the group's session of 2 s (and a little)", took)
	}
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions again", func() bool { return len(a.a.owned()) == 4 })
	if len(b.a.history()) != 1 {
		t.Fatalf("b's history %q: want its one start (its group was untouched)", b.a.history())
	}
	t.Logf("heartbeats of group g refused %d times; a gave its partitions up %s after the first", refused.Load(), took.Round(time.Millisecond))
}

// A member that joins heartbeats at a tenth of the broker's interval for an
// interval (settleBeat): the partitions its owner releases reach it at
// once, not at its next heartbeat at the broker's pace. b joins 300 ms
// before a's next heartbeat (interval 2 s): a learns of b then, revokes
// half and says so; b owns them well within the interval (at the broker's
// pace it would be 2 s after its join).
func TestConsumerMemberSettlesFast(t *testing.T) {
	const interval = 2 * time.Second
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "t"),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": fmt.Sprint(interval.Milliseconds())}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	all := &owners{owner: map[topicPartition]string{}}
	a := startConsumerMember(t, fake.ListenAddrs(), "g", "a", "", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a owns the 4 partitions", func() bool { return len(a.a.owned()) == 4 })
	time.Sleep(2 * interval) // past a's own settling
	_, aid := a.cm.ident.get()
	beats := make(chan time.Time, 100)
	fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if req.(*kmsg.ConsumerGroupHeartbeatRequest).MemberID == aid {
			select {
			case beats <- time.Now():
			default:
			}
		}
		return nil, nil, false
	})
	<-beats
	time.Sleep(interval - 300*time.Millisecond)
	start := time.Now()
	b := startConsumerMember(t, fake.ListenAddrs(), "g", "b", "", "", all)
	testsupport.WaitFor(t, 30*time.Second, "a and b own 2 partitions each", func() bool { return len(a.a.owned()) == 2 && len(b.a.owned()) == 2 })
	took := time.Since(start)
	if took > interval/2 {
		t.Fatalf("b owned its 2 partitions %s after it started; want within %s (a released them about 300 ms after b joined)", took, interval/2)
	}
	if len(all.bad) > 0 {
		t.Fatalf("a partition owned by two members at once: %v", all.bad)
	}
	t.Logf("b owned its 2 partitions %s after it started (broker interval %s)", took.Round(time.Millisecond), interval)
}
