// Command deadletter-replay shows the dead-letter round trip: a service
// whose Handler has a bug dead-letters the messages it fails on, the bug
// is fixed, a replay reads the dead-letter topic and writes each message
// back to its source topic, and the fixed service handles them. In the
// end every payment is booked exactly once.
//
//	go run ./examples/deadletter-replay                 # on an in-process broker
//	go run ./examples/deadletter-replay -brokers host:9092 -topic payments -dlt payments.dlt
//
// With -brokers, both topics must exist.
//
// The steps:
//
//  1. The payments service (Payments, parser v1) consumes the source topic
//     with a FailurePolicy{Action: DeadLetter, MaxAttempts: 3}: a payment
//     whose amount it cannot parse is tried three times, then written to
//     the dead-letter topic with tidemark's failure headers, and the
//     partition moves on. The others are booked.
//  2. The fix is deployed (Payments.Fixed).
//  3. The replay, itself a tidemark Consumer of the dead-letter topic (a
//     group and offset file of its own), writes each dead letter back to
//     the topic in its tidemark-topic header (Replayer), and stops once
//     it has read up to the end the dead-letter topic had when it started.
//  4. The fixed service resumes from its offset file's watermark: it
//     handles only the replayed messages, each once.
//
// Why the replay is a tidemark Consumer rather than a bare franz-go
// client: its position is kept as a service's is, in an offset file and
// committed to the group, so a replay killed half-way and run again goes
// on where it stopped, and running it again later replays only the dead
// letters written since. A bare client would need that logic written out.
//
// Why the dead letters go back to the source topic rather than being
// handled by the replay itself: the replay then needs no knowledge of the
// business logic, the messages go through the deployed service with its
// middleware, metrics and failure policy (one that fails again is
// dead-lettered again), and each lands in its key's partition. The price:
// a replayed message comes after later messages of its key, so a handler
// that depends on per-key order must accept that (a version in the value,
// say).
//
// Caveats: the dead-letter write and the replay's write are at least once
// (a write that timed out after the broker applied it is made again), so
// a replayed message can, rarely, arrive twice. HeaderOriginal names the
// message that failed first: a handler whose effect is not idempotent
// books on it once.
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
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// stepTimeout bounds each step, so that a broken setup fails instead of
// hanging.
const stepTimeout = 30 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "deadletter-replay:", err)
		os.Exit(1)
	}
}

type options struct {
	brokers, topic, dlt, group, dir string
	messages                        int
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("deadletter-replay", flag.ContinueOnError)
	fs.StringVar(&o.brokers, "brokers", "", "a real Kafka cluster `host:port[,host:port]` (default: an in-process broker)")
	fs.StringVar(&o.topic, "topic", "payments", "the source `topic`")
	fs.StringVar(&o.dlt, "dlt", "payments.dlt", "the dead-letter `topic`")
	fs.StringVar(&o.group, "group", "payments", "the service's consumer `group` (the replay's is GROUP-replay)")
	fs.StringVar(&o.dir, "dir", "", "`folder` of the offset files (default: a temporary one, removed)")
	fs.IntVar(&o.messages, "messages", 100, "payments to produce")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.messages < 1:
		return o, fmt.Errorf("-messages %d: at least 1 is needed", o.messages)
	}
	return o, nil
}

// serviceConfig is the payments service's Config: dead letters to dlt
// after three attempts, backoff kept short for the demo.
func serviceConfig(brokers []string, group, topic, dlt, file string, h handler.Handler) framework.Config {
	return framework.Config{
		Brokers:         brokers,
		GroupID:         group,
		Topics:          []string{topic},
		OffsetFile:      file,
		Handler:         h,
		Failure:         framework.FailurePolicy{Action: framework.DeadLetter, MaxAttempts: 3, DeadLetterTopic: dlt},
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		CommitInterval:  100 * time.Millisecond,
	}
}

// replayConfig is the replay's Config: a Consumer of the dead-letter
// topic with the default policy, Retry, so that no dead letter is skipped.
func replayConfig(brokers []string, group, dlt, file string, r *Replayer) framework.Config {
	return framework.Config{
		Brokers:        brokers,
		GroupID:        group,
		Topics:         []string{dlt},
		OffsetFile:     file,
		Handler:        r,
		RetryBackoff:   10 * time.Millisecond,
		CommitInterval: 100 * time.Millisecond,
	}
}

// run is the whole example; main only adds signal handling and the exit
// status. It returns an error if a step fails or if a payment was not
// booked exactly once.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	brokers := strings.Split(o.brokers, ",")
	if o.brokers == "" {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, o.topic, o.dlt))
		if err != nil {
			return fmt.Errorf("starting the in-process broker: %w", err)
		}
		defer fake.Close()
		brokers = fake.ListenAddrs()
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "tidemark-deadletter-replay-"); err != nil {
			return err
		}
		defer os.RemoveAll(o.dir)
	}
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return fmt.Errorf("a client to %v: %w", brokers, err)
	}
	defer kc.Close()

	msgs, legacy := payments(o.messages)
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: o.topic, Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			recs[i].Headers = append(recs[i].Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	pctx, cancel := context.WithTimeout(ctx, stepTimeout)
	err = kc.ProduceSync(pctx, recs...).FirstErr()
	cancel()
	if err != nil {
		return fmt.Errorf("producing %d payments to %s: %w", len(recs), o.topic, err)
	}
	fmt.Fprintf(stdout, "produced %d payments to %s, %d of them with a comma in the amount\n", len(msgs), o.topic, len(legacy))

	// 1. The service with its bug.
	svc := NewPayments()
	cfg := serviceConfig(brokers, o.group, o.topic, o.dlt, filepath.Join(o.dir, "payments.db"), svc)
	st, err := runUntilEnd(ctx, cfg, kc, o.topic)
	if err != nil {
		return fmt.Errorf("step 1, the service: %w", err)
	}
	var dead uint64
	for _, p := range st.Partitions {
		dead += p.DeadLettered
	}
	fmt.Fprintf(stdout, "1. service (parser v1): %d booked, %d dead-lettered to %s\n", len(svc.Booked()), dead, o.dlt)

	// 2. The fix.
	svc.Fixed.Store(true)
	fmt.Fprintf(stdout, "2. fix deployed: amounts with a comma are parsed\n")

	// 3. The replay.
	rp, err := NewReplayer(kc)
	if err != nil {
		return err
	}
	rcfg := replayConfig(brokers, o.group+"-replay", o.dlt, filepath.Join(o.dir, "replay.db"), rp)
	if _, err := runUntilEnd(ctx, rcfg, kc, o.dlt); err != nil {
		return fmt.Errorf("step 3, the replay: %w", err)
	}
	fmt.Fprintf(stdout, "3. replay: %d dead letters read from %s and written back to %s\n", len(rp.Produced()), o.dlt, o.topic)

	// 4. The fixed service, on the same group and offset file.
	before := len(svc.Booked())
	if _, err := runUntilEnd(ctx, cfg, kc, o.topic); err != nil {
		return fmt.Errorf("step 4, the fixed service: %w", err)
	}
	fmt.Fprintf(stdout, "4. service (parser v2): resumed at its watermark, %d replayed payments booked\n", len(svc.Booked())-before)

	var lost, twice []string
	booked := svc.Booked()
	for _, m := range msgs {
		id, _, _ := parsePayment(string(m.Value), true)
		switch n := booked[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			twice = append(twice, id)
		}
	}
	fmt.Fprintf(stdout, "   booked exactly once: %d of %d; lost %d; booked twice %d\n", len(msgs)-len(lost)-len(twice), len(msgs), len(lost), len(twice))
	if len(lost) > 0 || len(twice) > 0 {
		return fmt.Errorf("lost %v, booked twice %v", clip(lost), clip(twice))
	}
	fmt.Fprintln(stdout, "OK")
	return nil
}

// clip shortens a list for an error message.
func clip(ids []string) []string {
	if len(ids) > 10 {
		return append(slices.Clip(ids[:10]), "...")
	}
	return ids
}

// runUntilEnd runs a Consumer of cfg until it has processed topic up to
// the end offsets topic has now, then stops it as SIGTERM would (drain,
// flush, commit) and returns its last Stats.
func runUntilEnd(ctx context.Context, cfg framework.Config, kc *kgo.Client, topic string) (framework.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	ends, err := endOffsets(ctx, kc, topic)
	if err != nil {
		return framework.Stats{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	c, err := framework.New(cfg)
	if err != nil {
		return framework.Stats{}, err
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
			return c.Stats(), fmt.Errorf("Run returned before %s was processed to %v: %v", topic, ends, err)
		case <-ctx.Done():
			stop()
			<-done
			return c.Stats(), fmt.Errorf("%s not processed to %v within %s", topic, ends, stepTimeout)
		case <-tick.C:
		}
	}
	stop()
	if err := <-done; err != nil {
		return c.Stats(), err
	}
	return c.Stats(), nil
}

// caughtUp reports whether every partition of topic with messages has
// been processed up to its end in ends.
func caughtUp(st framework.Stats, topic string, ends map[int]int64) bool {
	done := 0
	for _, p := range st.Partitions {
		if e, ok := ends[p.Partition]; ok && p.Topic == topic && p.Processed >= e {
			done++
		}
	}
	return done == len(ends)
}

// endOffsets returns topic's log end offset per partition, for the
// partitions that have messages.
func endOffsets(ctx context.Context, kc *kgo.Client, topic string) (map[int]int64, error) {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mres, err := meta.RequestWith(ctx, kc)
	if err == nil && len(mres.Topics) != 1 {
		err = fmt.Errorf("%d topics in the metadata", len(mres.Topics))
	}
	if err == nil {
		err = kerr.ErrorForCode(mres.Topics[0].ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range mres.Topics[0].Partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p.Partition, -1 // -1: the log end
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(ctx, kc)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	ends := map[int]int64{}
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p.Partition, err)
			}
			if p.Offset > 0 {
				ends[int(p.Partition)] = p.Offset
			}
		}
	}
	return ends, nil
}
