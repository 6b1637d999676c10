// Command chaos runs tidemark consumers under faults and checks, with
// numbers, that nothing is lost and that every duplicate has a cause the
// guarantees allow.
//
//	go run ./examples/chaos -duration 2m -seed 42
//
// It starts a broker (the in-process kfake with a fixed port and a data
// directory, or the real one named by -brokers / KAFKA_BROKERS), a
// producer writing per-partition sequence numbers at a steady rate, and
// consumer processes: this program again, as `chaos consume ...`, one
// tidemark Consumer each, whose handler appends every message to the
// process's ledger file. Each instance has its own offset file and its own
// Kafka-aware fault proxy. A seeded schedule, printed at the start (the same
// seed and flags replay it), then SIGKILLs, SIGTERMs and restarts
// instances, adds and retires them, delays and fails their commits, slows,
// resets and blackholes their connections, and restarts the broker. When the
// fault phase ends, faults stop, the consumers drain and stop gracefully,
// and the checker compares the ledgers with the log: lost messages,
// duplicates by cause, and the invariants (see internal/chaos). It prints a
// table and exits with status 1 if a promise was broken, 2 if the run itself
// failed.
//
// Flags:
//
//	-duration D       fault phase (default 2m)
//	-seed N           schedule seed (default: from the clock, printed)
//	-consumers N      instances at the start (default 3); -max-consumers caps joins (default N+2)
//	-partitions N     partitions of the topic (default 8)
//	-rate N           messages per second, all partitions together (default 200)
//	-txn-rate N       records per second of a transactional producer, one transaction in three aborted;
//	                  the consumers read committed (default rate/4; negative: none)
//	-mix LIST         fault weights, e.g. "sigkill=3,blackhole=1" (default: every kind, see internal/chaos.DefaultMix)
//	-static           static group membership: each instance keeps its InstanceID across restarts
//	-ordering O       partition (default) or key: OrderKey, 16 keys per partition, per-key order checked
//	-brokers ADDR     a real broker (default $KAFKA_BROKERS; empty: in-process kfake)
//	-kafka-local P    scripts/kafka-local, to restart the real broker (default $TIDEMARK_KAFKA_LOCAL)
//	-kafka-dir D      the real broker's kafka-local directory (default $TIDEMARK_KAFKA_DIR)
//	-dir D            work directory (default: a temporary one, removed after a passing run)
//	-keep             keep the work directory
//	-q                print only the table
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/chaos"
)

// errBroken is returned when the run completed and broke a promise.
var errBroken = errors.New("promises broken")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errBroken):
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "consume":
			return consume(ctx, args[1:], stderr)
		case "check":
			return recheck(args[1:], stdout, stderr)
		}
	}
	return orchestrate(ctx, args, stdout, stderr)
}

// consume is one consumer process of a run.
func consume(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := chaos.ParseConsumerArgs(args, stderr)
	if err != nil {
		return err
	}
	zc := zap.NewProductionConfig()
	zc.OutputPaths, zc.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	zc.Sampling = nil
	log, err := zc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	cfg.Logger = log.With(zap.String("instance", cfg.Inc.String()))
	return chaos.RunConsumer(ctx, cfg)
}

// recheck checks a finished run again from its work directory.
func recheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "the run's work directory (kept with -keep or -dir, or after a failure)")
	margin := fs.Duration("margin", 0, "how long a fault may explain duplicates after it ended (0: the run's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || fs.NArg() > 0 {
		return errors.New("usage: chaos check -dir DIR [-margin D]")
	}
	rep, err := chaos.Recheck(*dir, *margin)
	if err != nil {
		return err
	}
	rep.WriteTable(stdout)
	if rep.Failed() {
		return errBroken
	}
	return nil
}

func orchestrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg chaos.Config
	fs.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "fault phase")
	seed := fs.Uint64("seed", 0, "schedule seed (0: from the clock)")
	fs.IntVar(&cfg.Consumers, "consumers", 3, "instances at the start")
	fs.IntVar(&cfg.MaxConsumers, "max-consumers", 0, "most instances at once (0: consumers+2)")
	fs.IntVar(&cfg.Partitions, "partitions", 8, "partitions of the topic")
	fs.IntVar(&cfg.Rate, "rate", 200, "messages per second, all partitions together")
	fs.IntVar(&cfg.TxnRate, "txn-rate", 0, "records per second of a transactional producer into the same topic, one transaction in three aborted; the consumers read committed (0: rate/4; negative: none)")
	mix := fs.String("mix", "default", "fault weights, kind=weight,... (kinds: sigkill sigterm join leave latency reset blackhole commit-delay commit-error broker-restart)")
	fs.DurationVar(&cfg.Work, "work", 0, "handler time per message")
	fs.StringVar(&cfg.GroupProtocol, "group-protocol", "classic", "the consumers' group protocol: classic (tidemark's cooperative-sticky membership) or consumer (KIP-848; the group's session and heartbeat interval are set on the broker)")
	fs.BoolVar(&cfg.State, "state", false, "the consumers keep state: a TxHandler counting every message in its partition's state, carried by a changelog; the checker holds every file at a partition's log end to the log's counts")
	fs.BoolVar(&cfg.Static, "static", false, "static group membership: every instance keeps its InstanceID (chaos-<instance>) across its restarts")
	ordering := fs.String("ordering", "partition", "partition, or key: consumers run framework.OrderKey on 16 keys per partition and the checker holds them to per-key order")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 3*time.Minute, "how long the drain may take after the faults stop")
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "a real broker host:port (empty: in-process kfake)")
	script := fs.String("kafka-local", os.Getenv("TIDEMARK_KAFKA_LOCAL"), "scripts/kafka-local, to restart the real broker")
	kdir := fs.String("kafka-dir", os.Getenv("TIDEMARK_KAFKA_DIR"), "the real broker's kafka-local directory")
	dir := fs.String("dir", "", "work directory (default: a temporary one)")
	keep := fs.Bool("keep", false, "keep the work directory")
	quiet := fs.Bool("q", false, "print only the table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch *ordering {
	case "partition":
	case "key":
		cfg.Keys = chaos.DefaultKeys
	default:
		return fmt.Errorf("-ordering %q: partition or key", *ordering)
	}
	m, err := chaos.ParseMix(*mix)
	if err != nil {
		return err
	}
	cfg.Mix = m
	cfg.Seed = *seed
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano() % 1_000_000)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to run consumers: %w", err)
	}
	cfg.ConsumerCommand = []string{self, "consume"}
	if !*quiet {
		cfg.Out = stdout
	}

	cfg.Dir = *dir
	if cfg.Dir == "" {
		if cfg.Dir, err = os.MkdirTemp("", "tidemark-chaos-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return err
	}
	cleanDir := *dir == "" && !*keep
	defer func() {
		if cleanDir {
			_ = os.RemoveAll(cfg.Dir)
		}
	}()

	if *brokers != "" {
		cfg.Broker = chaos.NewReal(*brokers, *script, *kdir, func(format string, args ...any) {
			if !*quiet {
				fmt.Fprintf(stdout, "  "+format+"\n", args...)
			}
		})
	} else {
		b, err := chaos.StartFake(cfg.Dir + "/kfake")
		if err != nil {
			return err
		}
		defer b.Close()
		cfg.Broker = b
	}

	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		cleanDir = false
		return fmt.Errorf("%w (work dir %s)", err, cfg.Dir)
	}
	fmt.Fprintln(stdout)
	rep.WriteTable(stdout)
	if rep.Failed() {
		cleanDir = false
		return errBroken
	}
	return nil
}
