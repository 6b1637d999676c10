package framework

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// oneGoroutine is an assignee that notes the goroutine of every call: the
// membership's goroutine alone may drive the assignment (member.go).
type oneGoroutine struct {
	*fakeAssignee
	mu     sync.Mutex
	first  string   // the goroutine of the first call
	others []string // calls from any other
}

// goroutineID is the calling goroutine's number, from its stack's header.
func goroutineID() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := bytes.Fields(b)
	if len(f) < 2 {
		return "?"
	}
	return string(f[1])
}

func (o *oneGoroutine) note(call string) {
	id := goroutineID()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.first == "" {
		o.first = id
	}
	if id != o.first {
		o.others = append(o.others, fmt.Sprintf("%s on goroutine %s (the membership's is %s)", call, id, o.first))
	}
}

func (o *oneGoroutine) owned() []topicPartition {
	o.note("owned")
	return o.fakeAssignee.owned()
}

func (o *oneGoroutine) start(ctx context.Context, tps []topicPartition) {
	o.note("start")
	o.fakeAssignee.start(ctx, tps)
}

func (o *oneGoroutine) revoke(tps []topicPartition, commit bool, reason string) {
	o.note("revoke " + reason)
	o.fakeAssignee.revoke(tps, commit, reason)
}

func (o *oneGoroutine) lose(tps []topicPartition, reason string) {
	o.note("lose " + reason)
	o.fakeAssignee.lose(tps, reason)
}

func (o *oneGoroutine) seen(c map[string]int, missing []string) {
	o.note("seen")
	o.fakeAssignee.seen(c, missing)
}

// A join that outlasts the lease (the proxy holds the JoinGroup that a
// refused heartbeat, REBALANCE_IN_PROGRESS, starts, for 8 s; the lease is
// min(SessionTimeout, RebalanceTimeout) less an interval, 4.8 s) gives the
// kept partitions up as lost, and the membership's goroutine does it: the
// lease's end is an event to its loop, not a timer calling the assignment
// from a goroutine of its own. The member then joins again and gets its
// partitions back.
func TestClassicLeaseLapseOnTheMembershipGoroutine(t *testing.T) {
	cl := testsupport.Start(t)
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, "t", 2)
	c, err := New(Config{Brokers: cl.Brokers, GroupID: group, Topics: []string{"t"},
		OffsetFile: filepath.Join(t.TempDir(), "o.db"), InspectSocket: InspectDisabled, Logger: zap.NewNop(),
		Handler:        handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 5 * time.Second,
		JoinGroupBackoff: 100 * time.Millisecond, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := &oneGoroutine{fakeAssignee: &fakeAssignee{name: "a", all: &owners{owner: map[topicPartition]string{}}, parts: map[topicPartition]bool{}}}
	m := newClassicMember(&c.cfg, c.log, a, c.identity, &coordinator{cfg: &c.cfg, cl: c.cl}, c.cl, c.deadLetters, &c.live.group)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.run(ctx) }()
	defer func() {
		cancel()
		<-done
		c.cl.client.Close()
		_ = c.store.Close()
	}()
	testsupport.WaitFor(t, 30*time.Second, "a owning both partitions", func() bool { return len(a.fakeAssignee.owned()) == 2 })

	hold, err := cl.Proxy.Delay(kmsg.JoinGroup, 8*time.Second, kafkaproxy.Times(1))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Remove()
	rebalance, err := cl.Proxy.Fail(kmsg.Heartbeat, 27, kafkaproxy.Times(1)) // REBALANCE_IN_PROGRESS
	if err != nil {
		t.Fatal(err)
	}
	defer rebalance.Remove()
	testsupport.WaitFor(t, 30*time.Second, "the partitions given up at the lease's end", func() bool {
		return slices.ContainsFunc(a.history(), func(e string) bool { return strings.HasPrefix(e, "lose no membership confirmed while joining") })
	})
	if hold.Applied() != 1 {
		t.Fatalf("the held JoinGroup: rule applied %d times", hold.Applied())
	}
	testsupport.WaitFor(t, 30*time.Second, "a owning both partitions again", func() bool { return len(a.fakeAssignee.owned()) == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	done <- nil // for the deferred wait
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.others) > 0 {
		t.Errorf("the assignment was called off the membership's goroutine:\n  %s", strings.Join(a.others, "\n  "))
	}
	t.Logf("history: %v", a.history())
}
