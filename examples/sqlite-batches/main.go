// Command sqlite-batches writes batches of Kafka messages to a database,
// SQLite through a pure-Go driver (modernc.org/sqlite), one transaction
// per batch, with each message's effect in the database exactly once.
//
//	go run .                          # on an in-process broker
//	go run . -brokers host:9092       # on a real cluster (a topic of its own, deleted at the end)
//
// The Store (store.go) is a handler.BatchHandler, set as
// Config.BatchHandler: tidemark calls it with up to Config.BatchSize
// consecutive messages of one partition, and it writes them in one SQLite
// transaction: a row per message in events, each order's (the message
// key's) last status and update count in orders.
//
// What tidemark guarantees, and what it does not: a batch's offsets are
// recorded in tidemark's offset file only after HandleBatch returned nil,
// and reach Kafka's committed offset only from there. No message is lost:
// one whose batch failed, or was in a call when the process died, is
// handled again. But the SQLite commit and the offset file's write are two
// transactions in two files, and nothing makes them one: a crash after the
// SQLite commit and before tidemark's next flush (within
// Config.FlushInterval, 5 ms by default), a restart that lost the offset
// file, or a partition's move to a member that resumes from an older
// committed offset hands the same messages to HandleBatch again. That is
// at-least-once delivery, and it is all a consumer can promise about a
// database it does not own.
//
// Exactly-once effects are the Store's doing: in the same transaction as
// a batch's rows it writes the offset of the batch's last message to
// applied, per partition, and it skips the messages of a batch at or below
// the offset applied already holds. The tables and the guard commit
// together or not at all, so a batch handled again changes nothing, and a
// counter like orders.updates, which a repeat would double, stays exact.
// (An upsert keyed by topic, partition and offset, as events' primary key
// allows, is the other way when every write of a message can be made
// idempotent on its own.) This program shows it: it runs a consumer over
// the messages, then a second one with a fresh offset file and a group of
// its own, which handles every message again, and checks that the second
// run changed nothing.
//
// When the state can live in tidemark's own offset file instead (counters,
// a deduplication table, a view to query), a TxHandler (docs/state.md)
// writes a run's changes and the partition's watermark in one transaction
// of that file, with no guard to write.
//
// Caveats:
//
//   - The guard is one offset per partition, right only if a partition's
//     batches are applied in offset order: framework.OrderPartition, the
//     default. With OrderKey a batch is one key's messages, and a later
//     batch of another key may commit first: keep the guard per key (an
//     orders column) instead.
//   - A commit must be durable before HandleBatch returns (synchronous
//     FULL), or a power cut could undo a batch tidemark has moved past.
//   - The guard skips on purpose what an operator replays by resetting the
//     group's offsets, and everything of a topic deleted and created again
//     (its offsets start over): delete the partition's applied row to
//     apply them again.
//   - A failing batch is retried (split in halves to find the failing
//     message) under the failure policy: the default, Retry, never moves
//     past it; Skip or DeadLetter leave that message out of the tables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/framework"
)

// stepTimeout bounds each step, so that a broken setup fails instead of
// hanging.
const stepTimeout = 60 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "sqlite-batches:", err)
		os.Exit(1)
	}
}

type options struct {
	brokers, topic, group, dir string
	messages, orders           int
	partitions, batchSize      int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("sqlite-batches", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.brokers, "brokers", "", "a real Kafka cluster `host:port[,host:port]` (default: an in-process broker)")
	fs.StringVar(&o.topic, "topic", "orders", "the `topic` (with -brokers, a suffix makes it new; it is deleted at the end)")
	fs.StringVar(&o.group, "group", "sqlite-batches", "the consumer `group` (the second run's is GROUP-again; with -brokers, both get the topic's suffix)")
	fs.StringVar(&o.dir, "dir", "", "`folder` of the database and the offset files (default: a temporary one, removed)")
	fs.IntVar(&o.messages, "messages", 1000, "order events to produce")
	fs.IntVar(&o.orders, "orders", 50, "orders (message keys) they are spread over")
	fs.IntVar(&o.partitions, "partitions", 3, "partitions of the topic")
	fs.IntVar(&o.batchSize, "batch", 100, "Config.BatchSize: the most messages in one transaction")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.messages < 1 || o.orders < 1 || o.partitions < 1 || o.batchSize < 1:
		return o, errors.New("-messages, -orders, -partitions and -batch must be at least 1")
	}
	return o, nil
}

// consumerConfig is the consumer's Config: the Store as its BatchHandler, with the
// default ordering (OrderPartition) that the Store's guard relies on.
func consumerConfig(brokers []string, group, topic, offsetFile string, s *Store, batchSize int, log *zap.Logger) framework.Config {
	return framework.Config{
		Brokers:        brokers,
		GroupID:        group,
		Topics:         []string{topic},
		OffsetFile:     offsetFile,
		BatchHandler:   s,
		BatchSize:      batchSize,
		Logger:         log,
		RetryBackoff:   10 * time.Millisecond,
		CommitInterval: 100 * time.Millisecond,
	}
}

// statuses are an order's events, in order; message i is event i/orders of
// order i%orders.
var statuses = []string{"created", "paid", "packed", "shipped", "delivered"}

// run is the whole example; main only adds signal handling and the exit
// status. It returns an error if a step fails or if the tables do not hold
// each message's effect exactly once.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(stderr), zap.WarnLevel))

	var brokers []string
	if o.brokers == "" {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), o.topic))
		if err != nil {
			return fmt.Errorf("starting the in-process broker: %w", err)
		}
		defer fake.Close()
		brokers = fake.ListenAddrs()
	} else {
		brokers = strings.Split(o.brokers, ",")
		suffix := fmt.Sprintf("-%d", time.Now().UnixNano())
		o.topic += suffix
		o.group += suffix
	}
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return fmt.Errorf("a client to %v: %w", brokers, err)
	}
	defer kc.Close()
	if o.brokers != "" {
		if err := createTopic(ctx, kc, o.topic, o.partitions); err != nil {
			return err
		}
		defer cleanUp(kc, o.topic, o.group, o.group+"-again")
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "tidemark-sqlite-batches-"); err != nil {
			return err
		}
		defer os.RemoveAll(o.dir)
	}
	dbPath := filepath.Join(o.dir, "orders.sqlite")
	s, err := OpenStore(ctx, dbPath, 5*time.Second)
	if err != nil {
		return err
	}
	defer s.Close()
	before, err := s.Count(ctx)
	if err != nil {
		return err
	}

	recs := make([]*kgo.Record, o.messages)
	for i := range recs {
		key := fmt.Sprintf("order-%d", i%o.orders)
		recs[i] = &kgo.Record{Topic: o.topic, Key: []byte(key), Value: []byte(statuses[(i/o.orders)%len(statuses)])}
	}
	pctx, cancel := context.WithTimeout(ctx, stepTimeout)
	err = kc.ProduceSync(pctx, recs...).FirstErr()
	cancel()
	if err != nil {
		return fmt.Errorf("producing %d messages to %s: %w", len(recs), o.topic, err)
	}
	ends := map[int]int64{}
	for _, r := range recs {
		ends[int(r.Partition)] = max(ends[int(r.Partition)], r.Offset+1)
	}
	fmt.Fprintf(stdout, "produced %d events of %d orders to %s (%d partitions); database %s\n", len(recs), o.orders, o.topic, o.partitions, dbPath)

	// 1. The service.
	cfg := consumerConfig(brokers, o.group, o.topic, filepath.Join(o.dir, "first.offsets"), s, o.batchSize, log)
	if err := runUntilEnd(ctx, cfg, o.topic, ends); err != nil {
		return fmt.Errorf("run 1: %w", err)
	}
	st1 := s.Stats()
	after1, err := s.Count(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "run 1: %d transactions, %d messages applied, %d skipped, %d failed tries\n", st1.Batches, st1.Applied, st1.Skipped, st1.Failed)
	fmt.Fprintf(stdout, "       tables: %d events, %d orders, %d updates\n", after1.Events, after1.Orders, after1.Updates)

	// 2. Every message again: a fresh offset file and a group with no
	// committed offset, as after a crash that lost what tidemark recorded.
	cfg = consumerConfig(brokers, o.group+"-again", o.topic, filepath.Join(o.dir, "second.offsets"), s, o.batchSize, log)
	if err := runUntilEnd(ctx, cfg, o.topic, ends); err != nil {
		return fmt.Errorf("run 2: %w", err)
	}
	st2 := s.Stats()
	after2, err := s.Count(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "run 2 (a fresh offset file and group): %d messages handled again, %d applied, %d skipped\n",
		st2.Applied+st2.Skipped-st1.Applied-st1.Skipped, st2.Applied-st1.Applied, st2.Skipped-st1.Skipped)
	fmt.Fprintf(stdout, "       tables: %d events, %d orders, %d updates\n", after2.Events, after2.Orders, after2.Updates)

	n := int64(len(recs))
	switch {
	case after1.Events-before.Events != n || after1.Updates-before.Updates != n:
		return fmt.Errorf("run 1 wrote %d events and %d updates for %d messages", after1.Events-before.Events, after1.Updates-before.Updates, n)
	case st2.Applied+st2.Skipped-st1.Applied-st1.Skipped < n:
		return fmt.Errorf("run 2 handled %d messages, not all %d again", st2.Applied+st2.Skipped-st1.Applied-st1.Skipped, n)
	case after2 != after1:
		return fmt.Errorf("run 2 changed the tables: %+v, then %+v", after1, after2)
	}
	fmt.Fprintln(stdout, "OK: each message's effect is in the database once")
	return nil
}

// runUntilEnd runs a Consumer of cfg until it has processed topic up to
// ends, then stops it as SIGTERM would (drain, flush, commit).
func runUntilEnd(ctx context.Context, cfg framework.Config, topic string, ends map[int]int64) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	c, err := framework.New(cfg)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !caughtUp(c.Stats(), topic, ends) {
		select {
		case err := <-done:
			return fmt.Errorf("Run returned before %s was processed to %v: %v", topic, ends, err)
		case <-ctx.Done():
			stop()
			<-done
			return fmt.Errorf("%s not processed to %v within %s", topic, ends, stepTimeout)
		case <-tick.C:
		}
	}
	stop()
	return <-done
}

// caughtUp reports whether every partition in ends has been processed up
// to its end.
func caughtUp(st framework.Stats, topic string, ends map[int]int64) bool {
	done := 0
	for _, p := range st.Partitions {
		if e, ok := ends[p.Partition]; ok && p.Topic == topic && p.Processed >= e {
			done++
		}
	}
	return done == len(ends)
}

// createTopic creates topic on a real cluster.
func createTopic(ctx context.Context, kc *kgo.Client, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, int32(partitions), -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = int32(stepTimeout.Milliseconds())
	res, err := req.RequestWith(ctx, kc)
	if err == nil && len(res.Topics) != 1 {
		err = fmt.Errorf("%d topics in the answer", len(res.Topics))
	}
	if err == nil {
		err = kerr.ErrorForCode(res.Topics[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	// A new topic's partitions get their leaders a moment later.
	for {
		meta := kmsg.NewPtrMetadataRequest()
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = kmsg.StringPtr(topic)
		meta.Topics = append(meta.Topics, mt)
		mres, err := meta.RequestWith(ctx, kc)
		if err == nil && len(mres.Topics) == 1 && mres.Topics[0].ErrorCode == 0 && len(mres.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range mres.Topics[0].Partitions {
				ready = ready && p.ErrorCode == 0 && p.Leader >= 0
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s created, but its partitions have no leaders after %s", topic, stepTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cleanUp deletes topic and groups from a real cluster, on the way out: a
// failure leaves them behind.
func cleanUp(kc *kgo.Client, topic string, groups ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	greq := kmsg.NewPtrDeleteGroupsRequest()
	greq.Groups = groups
	_, _ = greq.RequestWith(ctx, kc)
	req := kmsg.NewPtrDeleteTopicsRequest()
	rt := kmsg.NewDeleteTopicsRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.TopicNames = append(req.TopicNames, topic)
	req.TimeoutMillis = 10_000
	_, _ = req.RequestWith(ctx, kc)
}
