package framework

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/handler"
	recon "github.com/tidemark/tidemark/internal/reconcile"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// Reconciliation shows its positions in Stats only once they are durable:
// resuming at Kafka's committed offset (ahead of an empty offset file) must
// never show Committed above Synced, Synced above Durable, nor Durable
// above Processed.
func TestReconcileStatsOrder(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)
	cl.Produce(t, topic, 1, 0, 100)
	cl.Commit(t, group, topic, 0, 50)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, stop, err := handDriven(Config{Brokers: cl.Brokers, GroupID: group, Topics: []string{topic},
		FlushInterval: 500 * time.Millisecond, // the flush after the one below waits
		Logger:        zaptest.NewLogger(t)}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	other := storeKey(group, topicPartition{topic, 9})
	if err := c.store.SetWatermark(other, 1, 1, "m"); err != nil {
		t.Fatal(err)
	}
	if err := c.store.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	p := handPartition(c, topic, 50, -1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var bad []PartitionStats
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, s := range c.Stats().Partitions {
				if s.Partition == 0 && ((s.Committed >= 0 && s.Committed > s.Synced) || s.Synced > s.Durable || s.Durable > s.Processed) {
					bad = append(bad, s)
				}
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	bounds := c.assignment.positions.bounds(ctx, []topicPartition{p.tp}, c.assignment.watch)
	starts, commit, back := c.assignment.reconcile(ctx, []*partition{p}, bounds)
	c.assignment.persist(ctx, []*partition{p}, starts, back)
	if s := c.Stats().Partitions[0]; s.Committed != -1 || s.Synced != -1 || s.Durable != 50 || s.Processed != 50 {
		t.Errorf("after reconcile and persist: %+v, want Kafka's 50 durable and processed, nothing synced, so committed unknown", s)
	}
	// The committer's round (which the assignment asks for once the
	// partitions run) checkpoints, then shows Kafka's offset: it holds it.
	c.identity.setGen(1)
	c.committer.sync(ctx)
	if err := c.committer.commit([]*partition{p}, "test"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	close(done)
	wg.Wait()
	if starts[0] != 50 || commit {
		t.Fatalf("reconcile started at %v, commit %v; want Kafka's 50 and nothing to commit", starts, commit)
	}
	if len(bad) > 0 {
		t.Fatalf("%d Stats snapshots broke committed <= synced <= durable <= processed, the first: %+v", len(bad), bad[0])
	}
	if s := c.Stats().Partitions[0]; s.Committed != 50 || s.Synced != 50 || s.Durable != 50 || s.Processed != 50 {
		t.Fatalf("after the committer's round: %+v, want 50 everywhere", s)
	}
}

// Reconciliation logs a line per partition for a few partitions of a case,
// one line per case for many (a 10,000-partition topic logged 10,000).
func TestReconcileCaseLog(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	c := newCaseLog(zap.New(core))
	for p := range int32(3) {
		c.add(recon.KafkaAhead, topicPartition{"a", p}, 5, 9, 9)
	}
	for _, p := range []int32{0, 1, 2, 3, 7, 9, 10} {
		c.add(recon.NoPosition, topicPartition{"b", p}, -1, -1, 0)
		c.add(recon.NoPosition, topicPartition{"a", p}, -1, -1, int64(p))
	}
	c.write()
	if n := logs.FilterMessageSnippet("Kafka ahead").Len(); n != 3 {
		t.Errorf("%d lines for 3 partitions of a case, want 3", n)
	}
	many := logs.FilterMessageSnippet("no position in the offset file or Kafka").All()
	if len(many) != 1 {
		t.Fatalf("%d lines for 14 partitions of a case, want 1", len(many))
	}
	f := many[0].ContextMap()
	if f["partitions"] != int64(14) || f["which"] != "a: 0-3, 7, 9-10; b: 0-3, 7, 9-10" || f["resume_min"] != int64(0) || f["resume_max"] != int64(10) {
		t.Errorf("the line for 14 partitions: %v", f)
	}
	quiet := newCaseLog(zap.NewNop())
	infoCore, _ := observer.New(zapcore.InfoLevel)
	info := newCaseLog(zap.New(infoCore))
	for p := range int32(3) {
		quiet.add(recon.NoPosition, topicPartition{"a", p}, -1, -1, 0)
		info.add(recon.Agree, topicPartition{"a", p}, 5, 5, 5)
		info.add(recon.KafkaAhead, topicPartition{"a", p}, 5, 9, 9)
	}
	if len(quiet.by) != 0 || len(info.by) != 1 || len(info.by[recon.KafkaAhead]) != 3 {
		t.Errorf("gathered %v by a logger that writes nothing and %v at Info, want only the Info case at Info", quiet.by, info.by)
	}
	if got := partitionList([]topicPartition{{"t", 1}, {"t", 2}, {"t", 4}}, 3); got != "t: 1-2, 4" {
		t.Errorf("partitionList: %q", got)
	}
}

// handDriven makes a consumer of cfg (its Brokers, GroupID and Topics
// set; a no-op Handler and an offset file in dir by default) whose
// assignment a test drives by hand, with its fetcher running; stop ends it.
func handDriven(cfg Config, dir string) (c *Consumer, stop func() error, err error) {
	if cfg.Handler == nil {
		cfg.Handler = handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })
	}
	if cfg.OffsetFile == "" {
		cfg.OffsetFile = filepath.Join(dir, "o.db")
	}
	cfg.InspectSocket = InspectDisabled
	if c, err = New(cfg); err != nil {
		return nil, nil, err
	}
	return c, runFetcher(c), nil
}

// handPartition is partition 0 of topic as the assignment makes it, with
// Kafka's committed offset kafka, for a test that drives it by hand.
func handPartition(c *Consumer, topic string, kafka int64, gen int32) *partition {
	tp := topicPartition{topic, 0}
	p := &partition{env: c.env, key: storeKey(c.cfg.GroupID, tp), tp: tp, q: newInbox[*chunk](), st: c.board.get(tp),
		kafkaOffset: kafka, committed: kafka, gen: gen, done: make(chan struct{})}
	p.iv = invoker{p: p, policy: c.cfg.policy(topic)}
	return p
}

// runFetcher runs c's fetcher, as Run would, for a test that drives the
// assignment by hand; stop ends it and closes c's client and offset file.
func runFetcher(c *Consumer) (stop func() error) {
	fctx, stopFetching := context.WithCancel(context.Background())
	c.fetcher.ctx = fctx
	fetchDone := make(chan struct{})
	go func() {
		defer close(fetchDone)
		c.fetcher.run()
	}()
	return func() error {
		stopFetching()
		<-fetchDone
		c.positions.close()
		c.cl.client.Close()
		return c.store.Close()
	}
}
