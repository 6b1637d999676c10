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
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// ErrConsumerUsed is returned by Run when the Consumer already ran or was
// closed: a Consumer runs once.
var ErrConsumerUsed = errors.New("tidemark: Consumer already ran or was closed; create a new one with New")

// Consumer consumes the configured topics as a member of a Kafka consumer
// group, handing each message to the Handler and recording processed offsets
// in the local offset file. Create it with New, then call Run.
//
// Consumer is the facade: New builds each component with the collaborators
// it needs (see New) and the Consumer keeps only what its public methods
// read.
type Consumer struct {
	cfg   Config
	log   *zap.Logger
	store *offsetfile.Store
	cl    *cluster

	used atomic.Bool

	// The data path: the fetcher fetches every owned partition while Run
	// runs; env is what each partition shares (its Handler calls among
	// it).
	fetcher *fetcher
	env     *partitionEnv

	// The consumer's part in its group: the membership (member.go, one
	// implementation per group protocol) and the identity it keeps, the
	// partitions it owns (assign.go), the commits (committer.go).
	member     membership
	identity   *identity
	assignment *assignment
	committer  *committer
	positions  *positions

	// Stats: every partition this consumer owned or paused (stats.go) and
	// the flush latencies.
	board        *partitionBoard
	flushLatency latency

	// live is what Healthy reads (liveness.go); metricsHandler is
	// Config.MetricsHandler's, made once (status.go).
	live           liveness
	metricsOnce    sync.Once
	metricsHandler http.Handler
	// trend is the status page's history of lag and handled rate (trend.go).
	trend trend

	// deadLetters writes to the dead-letter topics (deadletter.go).
	deadLetters *deadLetters
	// changelog writes the TxHandler's changes to Config.StateChangelog's
	// topics (changelog.go); nil without one.
	changelog *changelog
}

// topicPartition is a partition's identity in the engine, the offset file
// (with the group: Consumer.storeKey) and Stats.
type topicPartition struct {
	topic     string
	partition int32
}

// storeKey is the offset file's key of a partition of group.
func storeKey(group string, tp topicPartition) offsetfile.Key {
	return offsetfile.Key{Group: group, Topic: tp.topic, Partition: tp.partition}
}

// New validates cfg and opens the offset file. It starts no goroutine and
// makes no network call; Run does. Every invalid field is reported, each as a
// *ConfigError; a bad offset file is reported with its path and cause. The
// offset file is checked whole before New returns (every page, record and
// failure entry, as `tidemark check` does): a damaged file, a truncated one
// or a 0-byte one is refused with an error wrapping offsetfile.ErrDamaged
// that names the first finding and how to recover, rather than met midway
// by the running consumer. The file stays locked until Run returns or Close
// is called.
func New(cfg Config) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.Named("tidemark").With(zap.String("group", cfg.GroupID))
	c := &Consumer{identity: newIdentity()}
	store, err := offsetfile.Open(cfg.OffsetFile, &offsetfile.Options{
		NoSync:        cfg.NoSync,
		FlushInterval: cfg.FlushInterval,
		SyncInterval:  cfg.SyncInterval,
		MmapSize:      stateMmapSize(cfg),
		Logger:        log,
		OnFlush:       func(d time.Duration, _ int, _ error) { c.flushLatency.observe(d) },
	})
	if err != nil {
		return nil, fmt.Errorf("tidemark: %w", err)
	}
	h, bh := cfg.Handler, cfg.BatchHandler
	if cfg.TxHandler != nil {
		bh = &txRuns{h: cfg.TxHandler, store: store, group: cfg.GroupID, ident: c.identity, logged: cfg.StateChangelog != ""}
	}
	if !cfg.DisableRecover {
		if h != nil {
			h = handler.Recover(h)
		} else {
			bh = handler.RecoverBatch(bh)
		}
	}
	c.cfg, c.log, c.store = cfg, log, store
	c.wire(h, bh)
	return c, nil
}

// wire builds the components, each with the narrow collaborators it
// needs, in the order they need each other: Kafka (the cluster, the
// coordinator, the leaders and log positions), then the data path (the
// fetcher, what every partition shares), then the group (the identity, the
// owned partitions, the committer, the assignment, the membership).
func (c *Consumer) wire(h handler.Handler, bh handler.BatchHandler) {
	cfg, log := &c.cfg, c.log
	c.cl = newCluster(cfg)
	coord := &coordinator{cfg: cfg, cl: c.cl}
	leaders := newLeaderTable(c.cl, cfg.Topics)
	c.positions = newPositions(cfg, log, c.cl, leaders)
	c.deadLetters = newDeadLetters(cfg, c.cl)
	c.fetcher = newFetcher(cfg, log, c.cl, leaders, c.positions, &c.live.fetcher)
	c.env = &partitionEnv{cfg: cfg, log: log, store: c.store, fetcher: c.fetcher, handle: handleFunc(h), batch: bh, deadLetters: c.deadLetters}

	c.board = newPartitionBoard()
	owned := &ownedPartitions{parts: map[topicPartition]*partition{}}
	c.committer = newCommitter(cfg, log, c.identity, owned, coord, c.store, &c.live.committer)
	c.assignment = &assignment{cfg: cfg, log: log, store: c.store, committer: c.committer, coordinator: coord,
		positions: c.positions, identity: c.identity, parts: owned, board: c.board, watch: &c.live.group, env: c.env}
	if cfg.StateChangelog != "" {
		c.changelog = newChangelog(cfg, log, c.cl, c.store)
		c.committer.capped, c.assignment.changelog = c.changelog.capFor, c.changelog
	}
	if cfg.GroupProtocol == GroupProtocolConsumer {
		// Its commits and offset reads carry the member epoch.
		coord.versions, coord.ident = consumerProtocolVersions, c.identity
		c.member = newConsumerMember(cfg, log, c.assignment, c.identity, coord, c.cl, c.deadLetters, &c.live.group)
		return
	}
	c.member = newClassicMember(cfg, log, c.assignment, c.identity, coord, c.cl, c.deadLetters, &c.live.group)
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
	c.env.handlerCtx = context.WithoutCancel(ctx)
	defer c.cl.client.Close()

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
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		if c.changelog != nil {
			c.changelog.run(cctx) // until the revokes' final commits are done
		}
	}()
	if c.changelog != nil {
		err = c.changelog.check(ctx) // the changelog topics, before the first join
	}
	if err == nil {
		c.assignment.runCtx = ctx
		err = c.member.run(ctx) // returns after every partition was revoked
	}
	stopCommitting()
	<-commitDone
	<-logDone
	stopFetching()
	<-fetchDone
	c.positions.close()
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
func (c *Consumer) MeasureHandlerLatency() { c.env.timeCalls.Store(true) }

// Close releases the offset file of a Consumer whose Run was never called.
// After Run has been called, Run releases everything itself and Close does
// nothing.
func (c *Consumer) Close() error {
	if !c.used.CompareAndSwap(false, true) {
		return nil
	}
	return c.store.Close()
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
	if st.gate.setPaused(true) {
		c.fetcher.paused.Add(1)
	}
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
	c.board.forgetPending(topicPartition{topic, int32(partition)}) // a pause never assigned: forget it
	if st.gate.setPaused(false) {
		c.fetcher.paused.Add(-1)
	}
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
	return c.board.pausable(topicPartition{topic, int32(partition)}), nil
}
