package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// Timings of the consumers under test: short, so that rebalances, commits
// and session expiries happen many times in a run. The session timeout is
// the smallest a default Kafka broker accepts. Timeout is short so that a
// commit held by the proxy for longer (commit-delay) times out in the
// client.
const (
	CommitInterval    = 200 * time.Millisecond
	HeartbeatInterval = 500 * time.Millisecond
	SessionTimeout    = 6 * time.Second
	RebalanceTimeout  = 12 * time.Second
	DrainTimeout      = 3 * time.Second
	RequestTimeout    = 2 * time.Second
)

// ConsumerConfig is one consumer process: a tidemark Consumer whose
// handler appends every message to the process's ledger.
type ConsumerConfig struct {
	Brokers    []string
	Group      string
	Topic      string
	OffsetFile string
	Ledger     string
	Inc        Inc
	// InstanceID, if set, makes the consumer a static member
	// (framework.Config.InstanceID).
	InstanceID string
	// Work is how long the handler sleeps per message (0: none).
	Work time.Duration
	// Keys > 0 runs with framework.OrderKey, KeyInFlight calls at once per
	// partition (Config.Keys).
	Keys int
	// ReadCommitted reads at kafka.ReadCommitted: the run has a
	// transactional producer.
	ReadCommitted bool
	// Protocol is framework.Config.GroupProtocol (empty: classic). With
	// "consumer" the broker's group config times the session.
	Protocol string
	// State runs a TxHandler instead of the Handler: each message also
	// adds one to the counter of its StateKey in the partition's state,
	// which follows the partition through the changelog (StateChangelog).
	State  bool
	Logger *zap.Logger
}

// StateChangelog is framework.Config.StateChangelog with Config.State: the
// changelog of topic T is T-state.
const StateChangelog = "-state"

// StateKeys is how many counters a partition's state holds with
// Config.State: message offset o counts under StateKey(o).
const StateKeys = 16

// StateKey is the state key offset o counts under: o mod StateKeys, 8
// bytes big-endian.
func StateKey(o int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(o%StateKeys)) }

// countInState adds one to offset o's counter in st.
func countInState(st handler.State, o int64) error {
	key := StateKey(o)
	v, err := st.Get(key)
	if err != nil {
		return err
	}
	var n uint64
	if len(v) == 8 {
		n = binary.BigEndian.Uint64(v)
	} else if v != nil {
		return fmt.Errorf("chaos: state key %x holds %d bytes, not a counter", key, len(v))
	}
	return st.Put(key, binary.BigEndian.AppendUint64(nil, n+1))
}

// KeyInFlight is MaxInFlight with Config.Keys.
const KeyInFlight = 8

// genSample is how often the consumer samples its Stats for G lines.
const genSample = 10 * time.Millisecond

// RunConsumer runs the consumer until ctx is cancelled, then lets tidemark
// drain, flush, commit and leave the group, and closes the ledger. It
// returns an error if the consumer or the ledger failed.
func RunConsumer(ctx context.Context, cfg ConsumerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	ledger, err := OpenLedger(cfg.Ledger, cfg.Inc)
	if err != nil {
		return err
	}
	var consumer atomic.Pointer[framework.Consumer]
	handle := func(ctx context.Context, m kafka.Message) error {
		start := time.Now()
		var gen int32
		if c := consumer.Load(); c != nil {
			// The Stats generation is the one this call runs in: the next
			// one starts only after every call of this one returned.
			gen = c.Stats().Generation
		}
		if cfg.Work > 0 && !sleepCtx(ctx, cfg.Work) {
			return ctx.Err()
		}
		return ledger.Handled(start, m.Topic, m.Partition, m.Offset, m.Value, gen)
	}
	fc := framework.Config{
		Brokers:           cfg.Brokers,
		GroupID:           cfg.Group,
		InstanceID:        cfg.InstanceID,
		Topics:            []string{cfg.Topic},
		OffsetFile:        cfg.OffsetFile,
		Handler:           handler.HandlerFunc(handle),
		Logger:            log,
		ClientID:          "tidemark-chaos-" + cfg.Inc.String(),
		CommitInterval:    CommitInterval,
		HeartbeatInterval: HeartbeatInterval,
		SessionTimeout:    SessionTimeout,
		RebalanceTimeout:  RebalanceTimeout,
		JoinGroupBackoff:  250 * time.Millisecond,
		DrainTimeout:      DrainTimeout,
		FetchMaxWait:      250 * time.Millisecond,
		Timeout:           RequestTimeout,
		RetryBackoff:      10 * time.Millisecond,
		MaxRetryBackoff:   time.Second,
	}
	if cfg.Keys > 0 {
		fc.Ordering, fc.MaxInFlight = framework.OrderKey, KeyInFlight
	}
	if cfg.State {
		// The ledger is written as each message is handled, the state in
		// the run's transaction: a run cut short appears in the ledger
		// only, and is handled again as any message above the durable
		// watermark is.
		fc.Handler, fc.StateChangelog = nil, StateChangelog
		fc.TxHandler = handler.TxHandlerFunc(func(ctx context.Context, st handler.State, msgs []kafka.Message) error {
			for _, m := range msgs {
				if err := handle(ctx, m); err != nil {
					return err
				}
				if err := countInState(st, m.Offset); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if cfg.Protocol == framework.GroupProtocolConsumer {
		// The broker's: Run.setGroupSession set them for the group.
		fc.GroupProtocol, fc.SessionTimeout, fc.HeartbeatInterval = cfg.Protocol, 0, 0
	}
	if cfg.ReadCommitted {
		fc.IsolationLevel = kafka.ReadCommitted
	}
	c, err := framework.New(fc)
	if err != nil {
		return errors.Join(err, ledger.Close())
	}
	consumer.Store(c)

	// Sample the generation for G lines, and partitions lost for L lines,
	// until Run returns.
	sampleDone := make(chan struct{})
	var wg sync.WaitGroup
	var sampleErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last int32 = -1
		var lost uint64
		t := time.NewTicker(genSample)
		defer t.Stop()
		for {
			st := c.Stats()
			if st.Generation != last {
				last = st.Generation
				if err := ledger.Generation(time.Now(), st.Generation, st.Member); err != nil && sampleErr == nil {
					sampleErr = err
				}
			}
			if st.PartitionsLost != lost {
				if err := ledger.Lost(time.Now(), st.PartitionsLost-lost); err != nil && sampleErr == nil {
					sampleErr = err
				}
				lost = st.PartitionsLost
			}
			select {
			case <-sampleDone:
				return
			case <-t.C:
			}
		}
	}()
	runErr := c.Run(ctx)
	close(sampleDone)
	wg.Wait()
	if runErr != nil {
		runErr = fmt.Errorf("chaos: consumer %s: %w", cfg.Inc, runErr)
	}
	return errors.Join(runErr, sampleErr, ledger.Close())
}

// Args are the command-line arguments ParseConsumerArgs reads back: how
// the harness tells a consumer process what to run.
func (c ConsumerConfig) Args() []string {
	return []string{
		"-brokers", strings.Join(c.Brokers, ","),
		"-group", c.Group,
		"-topic", c.Topic,
		"-offsets", c.OffsetFile,
		"-ledger", c.Ledger,
		"-instance", c.Inc.Instance,
		"-run", strconv.Itoa(c.Inc.Run),
		"-work", c.Work.String(),
		"-instance-id", c.InstanceID,
		"-keys", strconv.Itoa(c.Keys),
		"-read-committed=" + strconv.FormatBool(c.ReadCommitted),
		"-group-protocol", c.Protocol,
		"-state=" + strconv.FormatBool(c.State),
	}
}

// ParseConsumerArgs parses the arguments Args produced; Logger is left
// nil.
func ParseConsumerArgs(args []string, output io.Writer) (ConsumerConfig, error) {
	var c ConsumerConfig
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	fs.SetOutput(output)
	brokers := fs.String("brokers", "", "broker addresses, comma-separated (the instance's fault proxy)")
	fs.StringVar(&c.Group, "group", "", "consumer group")
	fs.StringVar(&c.Topic, "topic", "", "topic")
	fs.StringVar(&c.OffsetFile, "offsets", "", "the instance's offset file")
	fs.StringVar(&c.Ledger, "ledger", "", "this process's ledger file")
	fs.StringVar(&c.Inc.Instance, "instance", "", "instance name")
	fs.IntVar(&c.Inc.Run, "run", 1, "run number of the instance (1 for its first process)")
	fs.DurationVar(&c.Work, "work", 0, "time the handler spends per message")
	fs.StringVar(&c.InstanceID, "instance-id", "", "static group membership id (empty: a dynamic member)")
	fs.IntVar(&c.Keys, "keys", 0, "keys per partition: > 0 handles with OrderKey")
	fs.BoolVar(&c.ReadCommitted, "read-committed", false, "read at kafka.ReadCommitted (the run has a transactional producer)")
	fs.StringVar(&c.Protocol, "group-protocol", "", "framework.Config.GroupProtocol: classic (empty) or consumer")
	fs.BoolVar(&c.State, "state", false, "a TxHandler counting each message under its StateKey, with a changelog")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("chaos: consume: unexpected arguments %q", fs.Args())
	}
	if *brokers != "" {
		c.Brokers = strings.Split(*brokers, ",")
	}
	var missing []string
	for name, v := range map[string]string{"brokers": *brokers, "group": c.Group, "topic": c.Topic, "offsets": c.OffsetFile, "ledger": c.Ledger, "instance": c.Inc.Instance} {
		if v == "" {
			missing = append(missing, "-"+name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return c, fmt.Errorf("chaos: consume: missing %s", strings.Join(missing, ", "))
	}
	return c, nil
}
