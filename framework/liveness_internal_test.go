package framework

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
)

// Healthy's phases and its stuck-loop check, without a broker: a loop
// whose step lasts past stuckAfter makes the consumer unhealthy, and an
// idle loop never does, however long it waits.
func TestHealthyLiveness(t *testing.T) {
	c, err := New(Config{Brokers: []string{"127.0.0.1:9"}, GroupID: "g", Topics: []string{"t"},
		OffsetFile: filepath.Join(t.TempDir(), "offsets.db"),
		Handler:    handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Healthy(); err == nil || !strings.Contains(err.Error(), "Run has not been called") {
		t.Fatalf("before Run: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.live.ctx.Store(&ctx)
	c.live.phase.Store(phaseRunning)
	if err := c.Healthy(); err != nil {
		t.Fatalf("running, loops idle: %v", err)
	}
	limit := stuckAfter(&c.cfg)
	if limit < 2*time.Minute || limit > 5*time.Minute {
		t.Errorf("stuckAfter with the defaults is %s, want about three minutes", limit)
	}
	c.live.committer.since.Store(time.Now().Add(-limit / 2).UnixNano())
	if err := c.Healthy(); err != nil {
		t.Fatalf("a commit within the bound: %v", err)
	}
	c.live.committer.since.Store(time.Now().Add(-limit - time.Second).UnixNano())
	if err := c.Healthy(); err == nil || !strings.Contains(err.Error(), "the committer has been in one step") {
		t.Fatalf("a commit stuck past %s: %v", limit, err)
	}
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "not a member") {
		t.Errorf("Ready, not a member: %v", err)
	}
	c.live.committer.idle()
	c.live.group.busy()
	if err := c.Healthy(); err != nil {
		t.Fatalf("the group loop just started a step: %v", err)
	}
	cancel()
	c.live.group.since.Store(time.Now().Add(-time.Hour).UnixNano())
	if err := c.Healthy(); err != nil {
		t.Errorf("stopping: %v, want nil (draining is alive)", err)
	}
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "stopping") {
		t.Errorf("Ready while stopping: %v", err)
	}
	c.live.phase.Store(phaseReturned)
	if err := c.Healthy(); err == nil || !strings.Contains(err.Error(), "Run returned") {
		t.Errorf("after Run: %v", err)
	}
}

// The page's order: troubles first, in their order, then by lag time.
func TestStatusRowOrder(t *testing.T) {
	ps := []PartitionStats{
		{Topic: "a", Partition: 0, State: StateRunning, Lag: 5, LagTime: time.Second},
		{Topic: "a", Partition: 1, State: StateRevoked},
		{Topic: "a", Partition: 2, State: StateRunning, Careful: true},
		{Topic: "a", Partition: 3, State: StateRunning, DurableWait: true},
		{Topic: "a", Partition: 4, State: StateRunning, WindowFull: true},
		{Topic: "a", Partition: 5, State: StateRunning, LastCommit: "error", CommitError: "boom"},
		{Topic: "a", Partition: 6, State: StateDeadLettering},
		{Topic: "a", Partition: 7, State: StateRetrying},
		{Topic: "a", Partition: 8, State: StatePaused, Paused: true},
		{Topic: "a", Partition: 9, State: StateStopped},
		{Topic: "a", Partition: 10, State: StateStalled},
		{Topic: "a", Partition: 11, State: StateRunning, Lag: 50, LagTime: time.Minute},
		{Topic: "a", Partition: 12, State: StateRunning},
	}
	var v statusView
	v.fill(&inspectSnapshot{Pid: 1, Stats: Stats{Partitions: ps}})
	var got []int
	for _, r := range v.Partitions {
		got = append(got, r.Partition)
	}
	want := []int{10, 9, 8, 7, 6, 5, 4, 3, 2, 11, 0, 12, 1}
	if len(got) != len(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
	if v.Troubled != 9 {
		t.Errorf("%d troubled, want 9", v.Troubled)
	}
}
