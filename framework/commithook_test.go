package framework_test

import (
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// commitEvents collects what Config.OnCommit is told.
type commitEvents struct {
	mu     sync.Mutex
	events []framework.CommitEvent
}

func (c *commitEvents) add(ev framework.CommitEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, ev)
}

func (c *commitEvents) list() []framework.CommitEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// TestOnCommit: each commit sent is told to Config.OnCommit with the
// group's identity, the offsets Kafka then holds, sorted, and its timing;
// a refused commit carries Kafka's error; nothing to commit, no event.
func TestOnCommit(t *testing.T) {
	const parts, perPart = 2, 5
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	events := &commitEvents{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), rec)
	cfg.OnCommit = events.add

	// The first commits are refused: COORDINATOR_NOT_AVAILABLE.
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15, kafkaproxy.Times(2))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	r := frameworktest.Start(t, cfg)
	want := []framework.CommitOffset{{Topic: topic, Partition: 0, Offset: perPart}, {Topic: topic, Partition: 1, Offset: perPart}}
	var ok framework.CommitEvent
	testsupport.WaitFor(t, 30*time.Second, "an event of a commit that landed at the end of both partitions", func() bool {
		for _, ev := range events.list() {
			if ev.Err == nil && slices.Equal(ev.Offsets, want) {
				ok = ev
				return true
			}
		}
		return false
	})
	if fail.Applied() != 2 {
		t.Fatalf("the proxy refused %d commits, want 2", fail.Applied())
	}
	if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, perPart)) {
		t.Fatalf("Kafka holds %v after the event of a commit of %v", c, ok.Offsets)
	}
	if ok.GroupID != group || ok.Generation < 0 || ok.MemberID == "" {
		t.Errorf("event's identity: group %q generation %d member %q, want group %q, a generation and a member id",
			ok.GroupID, ok.Generation, ok.MemberID, group)
	}
	if ok.Reason != "interval" && ok.Reason != "reconciliation" {
		t.Errorf("event's reason %q, want interval or reconciliation", ok.Reason)
	}
	if ok.Start.Before(began) || ok.Start.After(time.Now()) || ok.Duration < 0 {
		t.Errorf("event's timing: start %s (test began %s), duration %s", ok.Start, began, ok.Duration)
	}

	// The two refused ones came first, with Kafka's error.
	var refused []framework.CommitEvent
	for _, ev := range events.list() {
		if ev.Err != nil {
			refused = append(refused, ev)
		}
	}
	if len(refused) != 2 {
		t.Fatalf("%d events with an error, want the 2 refused commits: %+v", len(refused), events.list())
	}
	for _, ev := range refused {
		if !errors.Is(ev.Err, kafka.GroupCoordinatorNotAvailable) {
			t.Errorf("refused commit's error %v, want COORDINATOR_NOT_AVAILABLE", ev.Err)
		}
		if ev.Start.After(ok.Start) || len(ev.Offsets) == 0 {
			t.Errorf("refused commit at %s with offsets %v; the one that landed began at %s", ev.Start, ev.Offsets, ok.Start)
		}
	}

	// Everything is committed: the shutdown sends nothing, and says so by
	// no event.
	n := len(events.list())
	time.Sleep(3 * cfg.CommitInterval)
	r.Stop(t)
	if got := events.list(); len(got) != n {
		t.Errorf("%d events after everything was committed, want none: %+v", len(got)-n, got[n:])
	}
}
