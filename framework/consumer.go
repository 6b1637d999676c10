package framework

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/wire"
	"github.com/tidemark/tidemark/offsetstore"
)

// ErrConsumerUsed is returned by Run when the Consumer already ran or was
// closed: a Consumer runs once.
var ErrConsumerUsed = errors.New("tidemark: Consumer already ran or was closed; create a new one with New")

// Consumer consumes the configured topics as a member of a Kafka consumer
// group, handing each message to the Handler and recording processed offsets
// in the local offset file. Create it with New, then call Run.
type Consumer struct {
	cfg Config
	log *zap.Logger
	// handler or batch, whichever Config set, wrapped in Recover.
	handler handler.Handler
	batch   handler.BatchHandler
	store   *offsetstore.Store

	// kafka sends the requests that need no connection of their own
	// (cluster.go).
	kafka *wire.Client

	used atomic.Bool
	// handlerCtx is the parent of every Handler call's context: Run's ctx
	// without its cancellation, cancelled by the partitions themselves once
	// DrainTimeout has passed.
	handlerCtx context.Context

	// carefulMu lets one careful-mode Handler call run at a time, so that
	// a crash leaves exactly one message recorded in flight.
	carefulMu sync.Mutex

	// fetcher fetches every owned partition while Run runs.
	fetcher *fetcher

	// The consumer's part in its group: the membership (member.go, one
	// implementation per group protocol), the partitions it owns
	// (assign.go), the commits (committer.go) and the group's coordinator
	// (coordinator.go).
	member      membership
	assignment  *assignment
	committer   *committer
	coordinator *coordinator

	// Counted for Stats: flush latencies, commit requests by
	// offsetstore.CommitOutcome; timeCalls is set by
	// MeasureHandlerLatency (each partition keeps its Handler latencies).
	timeCalls    atomic.Bool
	flushLatency latency
	commits      [offsetstore.CommitUnknown + 1]atomic.Uint64

	// live is what Healthy reads (liveness.go); metricsHandler is
	// Config.MetricsHandler's, made once (status.go).
	live           liveness
	metricsOnce    sync.Once
	metricsHandler http.Handler

	// deadLetters writes to the dead-letter topics (deadletter.go).
	deadLetters *deadLetters

	mu    sync.Mutex
	parts map[topicPartition]*partitionStats
	// pending holds the paused partitions never assigned to this consumer:
	// kept out of Stats (the partition may not even exist) until assigned.
	pending map[topicPartition]*partitionStats
}

// topicPartition is a partition's identity in the engine, the offset file
// (with the group: Consumer.storeKey) and Stats.
type topicPartition struct {
	topic     string
	partition int32
}

// New validates cfg and opens the offset file. It starts no goroutine and
// makes no network call; Run does. Every invalid field is reported, each as a
// *ConfigError; a bad offset file is reported with its path and cause. The
// offset file is checked whole before New returns (every page, record and
// failure entry, as `tidemark check` does): a damaged file, a truncated one
// or a 0-byte one is refused with an error wrapping offsetstore.ErrDamaged
// that names the first finding and how to recover, rather than met midway
// by the running consumer. The file stays locked until Run returns or Close
// is called.
func New(cfg Config) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.Named("tidemark").With(zap.String("group", cfg.GroupID))
	c := &Consumer{}
	store, err := offsetstore.Open(cfg.OffsetFile, &offsetstore.Options{
		NoSync:        cfg.NoSync,
		FlushInterval: cfg.FlushInterval,
		Logger:        log,
		OnFlush:       func(d time.Duration, _ int, _ error) { c.flushLatency.observe(d) },
	})
	if err != nil {
		return nil, fmt.Errorf("tidemark: %w", err)
	}
	h, bh := cfg.Handler, cfg.BatchHandler
	if !cfg.DisableRecover {
		if h != nil {
			h = handler.Recover(h)
		} else {
			bh = handler.RecoverBatch(bh)
		}
	}
	c.cfg, c.log, c.handler, c.batch, c.store = cfg, log, h, bh, store
	c.parts, c.pending = map[topicPartition]*partitionStats{}, map[topicPartition]*partitionStats{}
	c.deadLetters = newDeadLetters(c)
	c.fetcher = newFetcher(c)
	c.kafka = wire.NewClient(cfg.Brokers, wireOptions(&cfg))
	c.coordinator = &coordinator{c: c}
	c.assignment = newAssignment(c)
	c.committer = newCommitter(c)
	c.member = newClassicMember(c, c.assignment)
	return c, nil
}

// Run joins the group and consumes until ctx is cancelled. Then every
// partition drains (the Handler call in flight finishes, bounded by
// DrainTimeout), the offset file is flushed, the final watermarks are
// committed to Kafka, the member leaves the group (a static member stays,
// see Config.InstanceID), and Run returns nil once every goroutine it
// started has exited. Errors talking to Kafka are logged and retried, not
// returned: Run keeps the partitions it can reach moving (Stats.JoinError
// and Ready say what fails). Run returns an error only for a problem that
// stops the whole consumer: ErrFencedInstance when another process took its
// InstanceID; a dead-letter topic of the failure policy that Kafka does not
// know, checked before the first join (while Kafka cannot be reached, before
// each join, Stats.DeadLetterError and Ready saying so). A Handler call that ignores its
// cancelled context is waited for DrainTimeout plus 2 s, then abandoned: its
// message is not marked done, Run closes the offset file and returns an
// error naming the partition and offset, and that call's goroutine is the
// one Run leaves behind. With Config.StatusAddr set, Run serves
// StatusHandler there until it returns; if it cannot listen there, Run
// returns that error at once, having started nothing.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.used.CompareAndSwap(false, true) {
		return ErrConsumerUsed
	}
	c.live.ctx.Store(&ctx)
	c.live.started.Store(time.Now().UnixNano())
	c.live.phase.Store(phaseRunning)
	defer c.live.phase.Store(phaseReturned)
	stopStatus, err := c.serveStatus() // the status page and health checks (status.go)
	if err != nil {
		if cerr := c.store.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("tidemark: closing offset file: %w", cerr))
		}
		return err
	}
	c.handlerCtx = context.WithoutCancel(ctx)
	defer c.kafka.Close()

	fctx, stopFetching := context.WithCancel(context.WithoutCancel(ctx))
	c.fetcher.ctx = fctx
	fetchDone := make(chan struct{})
	go func() {
		defer close(fetchDone)
		c.fetcher.run()
	}()
	stopInspect := c.serveInspect() // live snapshot for tidemark inspect (inspect.go)
	c.log.Info("consumer starting", zap.Strings("topics", c.cfg.Topics), zap.Strings("brokers", c.cfg.Brokers),
		zap.String("offset_file", c.store.Path()), zap.String("instance_id", c.cfg.InstanceID))

	cctx, stopCommitting := context.WithCancel(context.WithoutCancel(ctx))
	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		c.committer.run(cctx)
	}()
	err = c.member.run(ctx) // returns after every partition was revoked
	stopCommitting()
	<-commitDone
	stopFetching()
	<-fetchDone
	stuck := c.assignment.stuckCalls()
	if len(stuck) > 0 && err == nil {
		err = fmt.Errorf("tidemark: %d Handler call(s) ignored their cancelled context for DrainTimeout (%s) plus %s and were abandoned, their messages not marked done: %s",
			len(stuck), c.cfg.DrainTimeout, drainGrace, strings.Join(stuck, ", "))
	}

	stopInspect() // before the file closes: the snapshot reads it (inspect.go)
	stopStatus()  // likewise (status.go)
	if cerr := c.store.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("tidemark: closing offset file: %w", cerr)
	}
	c.log.Info("consumer stopped", zap.Error(err))
	return err
}

// MeasureHandlerLatency makes Stats().HandlerLatency count from now on.
// A timed call costs two clock reads, about 70 ns: every call of a
// partition whose calls take 100 µs or more is timed, and one in 16 of
// quicker ones (at offsets that are multiples of 16), counted 16 times, so that no-op work
// does not pay the clock twice its own cost. Without it the histogram
// stays empty.
// metrics.NewCollector calls it. It is safe to call at any time, more than
// once.
func (c *Consumer) MeasureHandlerLatency() { c.timeCalls.Store(true) }

// Close releases the offset file of a Consumer whose Run was never called.
// After Run has been called, Run releases everything itself and Close does
// nothing.
func (c *Consumer) Close() error {
	if !c.used.CompareAndSwap(false, true) {
		return nil
	}
	return c.store.Close()
}

// partitionStats returns the long-lived state of a partition, created on
// first assignment and kept across generations for Stats.
func (c *Consumer) partitionStats(tp topicPartition) *partitionStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.parts[tp]
	if p == nil {
		if p = c.pending[tp]; p != nil {
			delete(c.pending, tp) // paused before its first assignment
		} else {
			p = newPartitionState(tp)
		}
		c.parts[tp] = p
	}
	return p
}

// storeKey is the offset file's key of a partition of this group.
func (c *Consumer) storeKey(tp topicPartition) offsetstore.Key {
	return offsetstore.Key{Group: c.cfg.GroupID, Topic: tp.topic, Partition: tp.partition}
}

// Pause stops handling topic's partition after the Handler call in flight,
// until Resume. Fetching stops too (what was fetched stays buffered), so
// Stats shows the lag and log end of its last fetch. The pause lasts
// across rebalances while this consumer is a member; a partition not
// assigned now is paused when it is, and shows in Stats only from then on
// (Pause cannot tell a partition not assigned yet from one that does not
// exist). Pause is safe to call from any goroutine, including a Handler;
// it returns an error for a topic that is not consumed or a negative
// partition.
func (c *Consumer) Pause(topic string, partition int) error {
	st, err := c.pausable(topic, partition)
	if err != nil {
		return err
	}
	st.setPaused(true)
	c.log.Info("partition paused", zap.String("topic", topic), zap.Int("partition", partition))
	return nil
}

// Resume ends a Pause, and releases the messages the Stop failure policy
// holds in the partition: each is tried again from its first attempt.
func (c *Consumer) Resume(topic string, partition int) error {
	st, err := c.pausable(topic, partition)
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.pending, topicPartition{topic, int32(partition)}) // a pause never assigned: forget it
	c.mu.Unlock()
	st.setPaused(false)
	c.fetcher.wakeAll()
	c.log.Info("partition resumed", zap.String("topic", topic), zap.Int("partition", partition))
	return nil
}

func (c *Consumer) pausable(topic string, partition int) (*partitionStats, error) {
	if !slices.Contains(c.cfg.Topics, topic) {
		return nil, fmt.Errorf("tidemark: topic %q is not consumed by this Consumer (Topics %q)", topic, c.cfg.Topics)
	}
	if partition < 0 || partition > math.MaxInt32 {
		return nil, fmt.Errorf("tidemark: %s: partition %d out of range", topic, partition)
	}
	tp := topicPartition{topic, int32(partition)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.parts[tp]; st != nil {
		return st, nil
	}
	st := c.pending[tp]
	if st == nil {
		st = newPartitionState(tp)
		st.state = StateRevoked // not assigned yet
		c.pending[tp] = st
	}
	return st, nil
}
