package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"path/filepath"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/metrics"
)

// The consumers compared. Each runs in a child process of its own.
const (
	consTidemark       = "tidemark"
	consTidemarkNoSync = "tidemark-nosync"
	consTidemarkBatch  = "tidemark-batch"
	consTidemarkTx     = "tidemark-tx"
	consTidemarkTxLog  = "tidemark-txlog"
	consReaderSync     = "kafka-go-sync"
	consReader1s       = "kafka-go-1s"
	consSarama         = "sarama"
	consFranz          = "franz-go"
	consKafkaPerf      = "kafka-perf" // Apache Kafka's ConsumerPerformance; real broker only, run by the orchestrator
)

// consumerOrder is the order of the table rows.
var consumerOrder = []string{consTidemark, consTidemarkNoSync, consTidemarkBatch, consTidemarkTx, consTidemarkTxLog, consReader1s, consReaderSync, consSarama, consFranz, consKafkaPerf}

// consumerDesc says, in BENCHMARKS.md, how each consumer is set up.
var consumerDesc = map[string]string{
	consTidemark:       "tidemark `framework.Consumer`, Config defaults: offsets fsync-ed in the bbolt file (group commit), committed to Kafka every 1 s, one fetch loop per broker (multi-partition fetches of up to 1 MiB per partition), at most 16 MiB fetched and not yet handled across all partitions (`MaxBufferedBytes`), one goroutine per partition",
	consTidemarkNoSync: "the same with `Config.NoSync` (offset file not fsync-ed): the cost of durability",
	consTidemarkBatch:  "the same with a `BatchHandler` (runs of up to `BatchSize` 100 messages per call) instead of a Handler",
	consTidemarkTx:     "the same with a `TxHandler`: runs of up to 100 messages, each message one `Get` and one `Put` of a counter under one of 1,000 keys (its offset modulo 1,000) in the partition's state, each run's changes and watermark one fsync-ed transaction (group commit across partitions)",
	consTidemarkTxLog:  "the same `TxHandler` with `Config.StateChangelog` \"-state-\" and the run's group: every change also written, after its transaction, to the run's own compacted changelog topic (created at its start, before the measured window), and Kafka's commits held to what the changelog acknowledged",
	consReader1s:       "kafka-go group `Reader`, `FetchMessage` + `CommitMessages` per message, `CommitInterval: 1s` (commits queued, sent once a second), `MaxWait: 500ms`, `ReadLagInterval: -1`, other fields default",
	consReaderSync:     "the same `Reader` with `CommitInterval: 0`: `CommitMessages` waits for its OffsetCommit, one per message",
	consSarama:         "IBM/sarama `ConsumerGroup`, `ConsumeClaim` per partition, `MarkMessage` per message, auto-commit every 1 s, `Version: V4_0_0_0`, `Offsets.Initial: OffsetOldest`, other fields default",
	consFranz:          "franz-go `kgo` group consumer, `AutoCommitMarks`, `PollFetches`, each partition's records handled in order and its last one passed to `MarkCommitRecords` (with the 1 ms handler, the partitions of one poll on their own goroutines), other options default",
	consKafkaPerf:      "Apache Kafka's `kafka-consumer-perf-test` (`org.apache.kafka.tools.ConsumerPerformance`, the Java consumer from the same jars as the broker), no handler: the broker's ceiling; its `fetch.nMsg.sec` (join excluded) is the msgs/s; its CPU and RSS are the whole JVM's, startup included",
}

// consumerFunc runs a consumer, calling s.see for every message, until ctx
// is cancelled; then it closes the client and returns nil.
type consumerFunc func(ctx context.Context, sp *childSpec, s *sink) error

var consumers = map[string]consumerFunc{
	consTidemark:       func(ctx context.Context, sp *childSpec, s *sink) error { return runTidemark(ctx, sp, s, false) },
	consTidemarkNoSync: func(ctx context.Context, sp *childSpec, s *sink) error { return runTidemark(ctx, sp, s, true) },
	consTidemarkBatch:  func(ctx context.Context, sp *childSpec, s *sink) error { return runTidemark(ctx, sp, s, false) },
	consTidemarkTx:     func(ctx context.Context, sp *childSpec, s *sink) error { return runTidemark(ctx, sp, s, false) },
	consTidemarkTxLog:  func(ctx context.Context, sp *childSpec, s *sink) error { return runTidemark(ctx, sp, s, false) },
	consReader1s:       func(ctx context.Context, sp *childSpec, s *sink) error { return runReader(ctx, sp, s, time.Second) },
	consReaderSync:     func(ctx context.Context, sp *childSpec, s *sink) error { return runReader(ctx, sp, s, 0) },
	consSarama:         runSarama,
	consFranz:          runFranz,
}

func offsetFile(sp *childSpec) string {
	if sp.OffsetFile != "" {
		return sp.OffsetFile
	}
	return filepath.Join(sp.Dir, "offsets.db")
}

func tidemarkConfig(sp *childSpec, s *sink, noSync bool) (framework.Config, func(), error) {
	logger, closeLog := zap.NewNop(), func() {}
	if sp.LogFile != "" {
		zc := zap.NewProductionConfig()
		zc.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
		zc.OutputPaths = []string{sp.LogFile}
		zc.Sampling = nil
		l, err := zc.Build()
		if err != nil {
			return framework.Config{}, nil, fmt.Errorf("log file: %w", err)
		}
		logger, closeLog = l, func() { _ = l.Sync() }
	}
	h := handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		s.see(m.Partition, m.Offset, m.Value)
		return nil
	})
	if sp.Keys > 0 {
		h = func(ctx context.Context, m kafka.Message) error {
			s.seeKeyed(ctx, &m)
			return nil
		}
	}
	cfg := framework.Config{
		Logger:           logger,
		MaxBufferedBytes: sp.MaxBufferedBytes,
		FlushInterval:    sp.FlushInterval,
		Brokers:          sp.Brokers,
		GroupID:          sp.Group,
		Topics:           []string{sp.Topic},
		OffsetFile:       offsetFile(sp),
		NoSync:           noSync,
		Handler:          h,
		Ordering:         sp.Ordering,
		MaxInFlight:      sp.MaxInFlight,
		MaxWindow:        sp.ConfigMaxWindow,
		MaxUndurable:     sp.MaxUndurable,
		IsolationLevel:   isolation(sp),
	}
	switch sp.Consumer {
	case consTidemarkBatch:
		cfg.Handler = nil
		cfg.BatchHandler = handler.BatchHandlerFunc(func(ctx context.Context, msgs []kafka.Message) error {
			for _, m := range msgs {
				_ = h.Handle(ctx, m)
			}
			return nil
		})
	case consTidemarkTx, consTidemarkTxLog:
		if sp.Consumer == consTidemarkTxLog {
			// A changelog of this run's own: one holds one group's
			// changes, and a round's new group on an earlier round's
			// changelog would first read it all, then tombstone it.
			cfg.StateChangelog = "-state-" + sp.Group
		}
		cfg.Handler = nil
		cfg.TxHandler = handler.TxHandlerFunc(func(ctx context.Context, st handler.State, msgs []kafka.Message) error {
			var key [8]byte
			for _, m := range msgs {
				binary.BigEndian.PutUint64(key[:], uint64(m.Offset%1000))
				v, err := st.Get(key[:])
				if err != nil {
					return err
				}
				var n uint64
				if len(v) == 8 {
					n = binary.BigEndian.Uint64(v)
				}
				if err := st.Put(key[:], binary.BigEndian.AppendUint64(nil, n+1)); err != nil {
					return err
				}
				_ = h.Handle(ctx, m)
			}
			return nil
		})
	}
	return cfg, closeLog, nil
}

// isolation is tidemark's Config.IsolationLevel for sp.
func isolation(sp *childSpec) kafka.IsolationLevel {
	if sp.ReadCommitted {
		return kafka.ReadCommitted
	}
	return kafka.ReadUncommitted
}

func runTidemark(ctx context.Context, sp *childSpec, s *sink, noSync bool) error {
	cfg, closeLog, err := tidemarkConfig(sp, s, noSync)
	if err != nil {
		return err
	}
	defer closeLog()
	c, err := framework.New(cfg)
	if err != nil {
		return err
	}
	if sp.CountWrites {
		s.flushes = func() int64 { return int64(c.Stats().FlushLatency.Count) }
	}
	// tidemark has no assignment callback: Stats shows the generation as
	// soon as the group assigned the partitions, before reconciliation.
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if !awaitGeneration(wctx, c) {
			return
		}
		s.assigned()
		if sp.Keys > 0 {
			watchKeyed(wctx, c, sp, s)
		}
	}()
	scraped := make(chan error, 1)
	if sp.Metrics {
		h := metrics.Handler(c) // before Run: every Handler call timed
		go func() {
			n, err := scrapeEverySecond(wctx, h, s.first)
			s.scrapes.Store(int64(n))
			scraped <- err
		}()
	} else {
		scraped <- nil
	}
	err = c.Run(ctx)
	stop()
	<-watched
	if serr := <-scraped; serr != nil && err == nil {
		err = fmt.Errorf("scraping metrics: %w", serr)
	}
	return err
}

// runReader is the loop kafka-go documents for at-least-once processing:
// FetchMessage, handle, CommitMessages.
func runReader(ctx context.Context, sp *childSpec, s *sink, commitInterval time.Duration) (err error) {
	rd := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         sp.Brokers,
		GroupID:         sp.Group,
		Topic:           sp.Topic,
		CommitInterval:  commitInterval,
		MaxWait:         500 * time.Millisecond,
		ReadLagInterval: -1,
		StartOffset:     kafka.FirstOffset,
	})
	defer func() {
		if cerr := rd.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the Reader: %w", cerr)
		}
	}()
	for {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("FetchMessage: %w", err)
		}
		s.see(m.Partition, m.Offset, m.Value)
		if err := rd.CommitMessages(ctx, m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("CommitMessages: %w", err)
		}
	}
}

func init() {
	// sarama logs nothing by default; make sure of it.
	sarama.Logger = log.New(io.Discard, "", 0)
}

type saramaHandler struct{ s *sink }

func (h saramaHandler) Setup(sarama.ConsumerGroupSession) error {
	h.s.assigned()
	return nil
}
func (saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h saramaHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.s.see(int(m.Partition), m.Offset, m.Value)
			sess.MarkMessage(m, "")
		case <-sess.Context().Done():
			return nil
		}
	}
}

func runSarama(ctx context.Context, sp *childSpec, s *sink) (err error) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_0_0_0
	cfg.ClientID = "bench-sarama"
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = true
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Second
	cg, err := sarama.NewConsumerGroup(sp.Brokers, sp.Group, cfg)
	if err != nil {
		return fmt.Errorf("sarama.NewConsumerGroup: %w", err)
	}
	defer func() {
		if cerr := cg.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the sarama ConsumerGroup: %w", cerr)
		}
	}()
	h := saramaHandler{s: s}
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, []string{sp.Topic}, h); err != nil {
			if ctx.Err() != nil || errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return nil
			}
			return fmt.Errorf("sarama Consume: %w", err)
		}
	}
	return nil
}

func runFranz(ctx context.Context, sp *childSpec, s *sink) error {
	opts := []kgo.Opt{
		kgo.SeedBrokers(sp.Brokers...),
		kgo.ClientID("bench-franz-go"),
		kgo.ConsumerGroup(sp.Group),
		kgo.ConsumeTopics(sp.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitMarks(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { s.assigned() }),
	}
	if sp.ReadCommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kgo.NewClient: %w", err)
	}
	defer cl.Close()
	handle := func(p kgo.FetchTopicPartition) {
		for _, r := range p.Records {
			s.see(int(r.Partition), r.Offset, r.Value)
		}
		if n := len(p.Records); n > 0 {
			cl.MarkCommitRecords(p.Records[n-1])
		}
	}
	var wg sync.WaitGroup
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fs.Err(); err != nil {
			return fmt.Errorf("PollFetches: %w", err)
		}
		if !s.sleep {
			fs.EachPartition(handle)
			continue
		}
		// I/O-bound handling: the partitions of this poll concurrently, each
		// in order, as franz-go's examples do it.
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(p)
			}()
		})
		wg.Wait()
	}
}

// awaitGeneration waits until c's Stats show a generation (the group has
// assigned the partitions, before reconciliation: tidemark has no
// assignment callback), polling every millisecond. It reports false if ctx
// ended first.
func awaitGeneration(ctx context.Context, c *framework.Consumer) bool {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for c.Stats().Generation == 0 {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}
