// Command bench runs tidemark and the Go Kafka consumers users would pick
// instead side by side, on the same broker and the same data, and writes the
// figures to BENCHMARKS.md.
//
//	cd bench && go run .                      # in-process kfake broker
//	KAFKA_BROKERS=127.0.0.1:9092 go run .     # a real broker (scripts/kafka-local start)
//	go run . -h                               # flags: sizes, messages, rounds, consumers, handlers, ...
//
// Every consumer runs in a child process of its own (this binary,
// re-executed), one after another, with a fresh consumer group, so its CPU
// time, peak RSS and allocations are its own; the broker (kfake) and the
// producers stay in this process. See BENCHMARKS.md for the method.
//
// It is a module of its own so that sarama and franz-go's client never enter
// the library's go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/twmb/franz-go/pkg/kgo"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if spec := os.Getenv(envChild); spec != "" {
		if err := runChild(spec, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	args        []string
	summaryOnly bool // -summary: write BENCHMARKS.md's summary from its tables, run nothing
	messages    int64
	sizes       []int
	partitions  int
	rounds      int
	consumers   []string
	handlers    []string
	maxWindow   time.Duration
	sleepWindow time.Duration
	batchBytes  int

	latencyDuration time.Duration
	latencyRounds   int
	latencyRate     float64

	startupPartitions  int
	startupMessages    int64
	startupBufferBytes int
	startupIdleWindow  time.Duration
	flushInterval      time.Duration
	codec              kgo.CompressionCodec // of the preloaded topics' batches (-compression)

	sections []string

	concHandlers   []string
	concRounds     int
	concMessages   int64
	concKeys       int
	concKeyPick    string
	concInFlight   int
	concWindows    map[string]time.Duration
	concStuckAhead int

	replayRounds   int
	replayHandlers []string
	replayValues   []int
	replayWindow   time.Duration

	metricsPartitions int
	metricsPerPart    int64
	metricsScrapes    int
	metricsIdleWindow time.Duration
	metricsRounds     int
	metricsMessages   int64

	txn txnOptions // the transactions section (transactions.go)

	wide wideOptions // the wide section (wide.go)

	restore restoreOptions // the restore section (restore.go)

	moves       int // the leader-move section (leadermoves.go)
	movesRounds int

	rebalanceMembers []int // the rebalance section (rebalance.go)
	rebalanceRounds  int
	rebalanceSettle  time.Duration

	brokers    []string
	out        string
	kafkaLocal string
	profileDir string
	logDir     string
	timeout    time.Duration
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{args: args}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Int64Var(&o.messages, "messages", 1_000_000, "messages preloaded per value size (spread evenly over the partitions)")
	sizes := fs.String("sizes", "100,1024", "value sizes in bytes, comma-separated: one preloaded topic each; empty: no throughput or latency runs (the startup phase alone)")
	fs.IntVar(&o.partitions, "partitions", 8, "partitions of the preloaded topics")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; each runs every consumer once per size and handler, in a rotated order; tables show medians")
	cons := fs.String("consumers", "all", "consumers to run, comma-separated, of: "+strings.Join(consumerOrder, ",")+
		" (all: every one; kafka-perf only with a real broker)")
	handlers := fs.String("handlers", handlerNoop+","+handlerSleep, "handler modes, comma-separated: noop (returns at once), sleep1ms (sleeps 1 ms: I/O-bound work)")
	fs.DurationVar(&o.maxWindow, "max-window", 6*time.Second, "a throughput run ends this long after its first message even if the topic is not consumed yet (slow consumers); 0: no limit")
	fs.DurationVar(&o.sleepWindow, "sleep-window", 3*time.Second, "-max-window for the 1 ms sleep handler, whose msgs/s the handler bounds")
	fs.IntVar(&o.batchBytes, "batch-bytes", 16384, "producer batch size per partition in bytes (16384: the Java producer's default batch.size)")
	fs.DurationVar(&o.latencyDuration, "latency-duration", 3*time.Second, "how long the paced producer of each latency run writes; 0: no latency runs")
	fs.IntVar(&o.latencyRounds, "latency-rounds", 3, "rounds of latency runs (at most -rounds)")
	fs.Float64Var(&o.latencyRate, "latency-rate", 0, "messages/s of the latency runs; 0: half the slowest peer's median msgs/s with the same handler")
	fs.IntVar(&o.startupPartitions, "startup-partitions", 1000, "partitions of the startup phase (tidemark: join + reconciliation with an offset file holding a record per partition); 0: skip it")
	fs.Int64Var(&o.startupMessages, "startup-messages", 2000, "messages of 100 B per partition in the startup phase, produced anew before each start (the backlog it then consumes)")
	fs.IntVar(&o.startupBufferBytes, "startup-buffer-bytes", 8<<20, "the startup phase restarts once more with this Config.MaxBufferedBytes (the budget of fetched but not handled bytes, default 16 MiB); 0: no such run")
	fs.DurationVar(&o.startupIdleWindow, "startup-idle-window", 3*time.Second, "after each startup run consumed its backlog, count tidemark's fetch requests over this long with every partition idle; 0: no idle measurement")
	compression := fs.String("compression", "none", "the codec of the preloaded topics' batches: none, gzip, snappy, lz4 or zstd")
	fs.DurationVar(&o.flushInterval, "tidemark-flush-interval", 0, "tidemark's Config.FlushInterval in the throughput, latency, concurrency and wide runs; 0: its default")
	sections := fs.String("sections", "all", "parts of the benchmark to run, comma-separated, of: "+strings.Join(sectionOrder, ",")+
		" (all: every one; latency needs throughput, or -latency-rate)")
	concHandlers := fs.String("concurrency-handlers", "all", "handler modes of the concurrency section, comma-separated, of: "+strings.Join(concHandlerOrder, ","))
	fs.IntVar(&o.concRounds, "concurrency-rounds", 3, "rounds of the concurrency section")
	fs.Int64Var(&o.concMessages, "concurrency-messages", 2_000_000, "messages of 100 B with keys preloaded for the concurrency section (spread evenly over the partitions); "+
		"its no-op runs handle as many as the main tables' (-messages), the others run until their window ends")
	fs.IntVar(&o.concKeys, "concurrency-keys", 1000, "distinct keys of the concurrency section's topic: key k in partition k % partitions")
	fs.StringVar(&o.concKeyPick, "concurrency-key-pick", keyPickRandom, "how each message of a partition takes one of its partition's keys: "+keyPickRandom+" (pseudo-random, fixed seed) or "+keyPickRoundRobin)
	fs.IntVar(&o.concInFlight, "concurrency-in-flight", 256, "Config.MaxInFlight of the OrderKey and OrderNone runs of the concurrency section (beside OrderKey at its default, with the 100 ms handler)")
	concWindows := fs.String("concurrency-windows", "", "per handler mode, how long after its first message a concurrency run ends, e.g. "+
		"'sleep100ms=8s,sleep20ms=4s'; unnamed modes keep their default: noop -max-window, sleep1ms 3s, sleep20ms 4s, sleep100ms 8s")
	fs.IntVar(&o.concStuckAhead, "concurrency-stuck-ahead", 10000, "the stuck runs of the concurrency section hold this many messages per partition completed above a stuck one; 0: no stuck runs")
	fs.IntVar(&o.replayRounds, "replay-rounds", 2, "rounds of the bounded replay section")
	replayHandlers := fs.String("replay-handlers", "all", "handler modes of the bounded replay section, comma-separated, of: "+strings.Join(replayHandlerOrder, ","))
	replayValues := fs.String("replay-max-undurable", "1,10,100,1000,0", "tidemark's Config.MaxUndurable values of the bounded replay section, comma-separated; 0: its default (100000)")
	fs.DurationVar(&o.replayWindow, "replay-window", 2*time.Second, "a bounded replay run ends this long after its window started, or when it handled the whole topic")
	fs.IntVar(&o.metricsPartitions, "metrics-partitions", 1000, "partitions of the metrics section's scrape run (the cost of scraping metrics.Handler); 0: no scrape run")
	fs.Int64Var(&o.metricsPerPart, "metrics-partition-messages", 10, "messages of 100 B per partition the scrape run consumes before it measures (every position known, lightly loaded)")
	fs.IntVar(&o.metricsScrapes, "metrics-scrapes", 60, "scrapes of metrics.Handler measured in the scrape run, served back to back")
	fs.DurationVar(&o.metricsIdleWindow, "metrics-idle-window", 2*time.Second, "the scrape run's idle window before the scrapes: the consumer's own CPU, subtracted from the scrapes'")
	fs.IntVar(&o.metricsRounds, "metrics-rounds", 3, "rounds of the metrics section's no-op throughput runs, each with and without metrics; 0: none")
	fs.Int64Var(&o.metricsMessages, "metrics-messages", 2_000_000, "messages of 100 B the metrics section preloads for its throughput runs when the main tables' 100 B topic is not there (-sections without throughput)")
	registerTxnFlags(fs, &o.txn)
	registerWideFlags(fs, &o.wide)
	registerRestoreFlags(fs, &o.restore)
	rebalanceMembers := fs.String("rebalance-members", "3,10", "group sizes of the rebalance section, comma-separated")
	fs.IntVar(&o.rebalanceRounds, "rebalance-rounds", 4, "joins and leaves per group size in the rebalance section (each at a random phase of the heartbeats: the medians need several)")
	// Longer than the broker's default consumer-protocol heartbeat interval
	// (5 s), so that each event is measured as an isolated one: no member
	// still heartbeats at its faster pace after the event before.
	fs.DurationVar(&o.rebalanceSettle, "rebalance-settle", 6*time.Second, "how long no partition may change owner for a join or leave of the rebalance section to be done (above the broker's heartbeat interval: each event isolated)")
	fs.IntVar(&o.moves, "leadermoves-moves", 50, "leader moves per run of the leader-move section (kfake only)")
	fs.IntVar(&o.movesRounds, "leadermoves-rounds", 3, "rounds of the leader-move section, each running every consumer once")
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "a real broker, host:port[,host:port] (default $KAFKA_BROKERS); empty: in-process kfake")
	fs.StringVar(&o.out, "out", "../BENCHMARKS.md", "markdown file to update (this broker kind's section only); empty: print only")
	fs.StringVar(&o.kafkaLocal, "kafka-local", "../scripts/kafka-local", "scripts/kafka-local, to run Kafka's ConsumerPerformance tool (kafka-perf)")
	fs.StringVar(&o.profileDir, "profile", "", "write a CPU profile of every child's measured window into this folder, and its heap (live objects at the window's end) beside it (.heap); with kfake, also one of this process (the broker) over each wide run")
	fs.StringVar(&o.logDir, "log", "", "write tidemark's debug log of every tidemark child into this folder")
	fs.DurationVar(&o.timeout, "child-timeout", 3*time.Minute, "bound on one child process, join and shutdown included")
	fs.BoolVar(&o.summaryOnly, "summary", false, "run nothing: write the summary of -out's Targets tables (targets met and missed per broker) again, from the file itself")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if strings.TrimSpace(*sizes) != "" {
		if o.sizes, err = parseInts(*sizes); err != nil {
			return nil, fmt.Errorf("-sizes: %w", err)
		}
	}
	if *brokers != "" {
		o.brokers = strings.Split(*brokers, ",")
	}
	if o.consumers, err = parseList(*cons, consumerOrder, "all"); err != nil {
		return nil, fmt.Errorf("-consumers: %w", err)
	}
	if len(o.brokers) == 0 {
		o.consumers = remove(o.consumers, consKafkaPerf)
	}
	if o.handlers, err = parseList(*handlers, []string{handlerNoop, handlerSleep}, "all"); err != nil {
		return nil, fmt.Errorf("-handlers: %w", err)
	}
	if o.sections, err = parseList(*sections, sectionOrder, "all"); err != nil {
		return nil, fmt.Errorf("-sections: %w", err)
	}
	if o.concHandlers, err = parseList(*concHandlers, concHandlerOrder, "all"); err != nil {
		return nil, fmt.Errorf("-concurrency-handlers: %w", err)
	}
	if o.replayHandlers, err = parseList(*replayHandlers, replayHandlerOrder, "all"); err != nil {
		return nil, fmt.Errorf("-replay-handlers: %w", err)
	}
	if o.replayValues, err = parseReplayValues(*replayValues); err != nil {
		return nil, fmt.Errorf("-replay-max-undurable: %w", err)
	}
	if o.concWindows, err = parseWindows(*concWindows, o.maxWindow); err != nil {
		return nil, fmt.Errorf("-concurrency-windows: %w", err)
	}
	if err := o.txn.validate(o.partitions); err != nil {
		return nil, err
	}
	switch *compression {
	case "none":
		o.codec = kgo.NoCompression()
	case "gzip":
		o.codec = kgo.GzipCompression()
	case "snappy":
		o.codec = kgo.SnappyCompression()
	case "lz4":
		o.codec = kgo.Lz4Compression()
	case "zstd":
		o.codec = kgo.ZstdCompression()
	default:
		return nil, fmt.Errorf("-compression %q: want none, gzip, snappy, lz4 or zstd", *compression)
	}
	if o.rebalanceMembers, err = parseInts(*rebalanceMembers); err != nil {
		return nil, fmt.Errorf("-rebalance-members: %w", err)
	}
	for _, n := range o.rebalanceMembers {
		if n < 2 || n > rebalancePartitions {
			return nil, fmt.Errorf("-rebalance-members: %d: a group size is 2 to %d (the section's partitions)", n, rebalancePartitions)
		}
	}
	if o.rebalanceRounds < 1 {
		return nil, fmt.Errorf("-rebalance-rounds must be at least 1, got %d", o.rebalanceRounds)
	}
	if err := o.wide.validate(*brokers != ""); err != nil {
		return nil, err
	}
	if err := o.restore.validate(o.partitions); err != nil {
		return nil, err
	}
	switch {
	case o.messages < int64(o.partitions) || o.partitions < 1:
		return nil, fmt.Errorf("-messages %d and -partitions %d: want at least one message per partition", o.messages, o.partitions)
	case o.rounds < 1:
		return nil, fmt.Errorf("-rounds must be at least 1")
	case len(o.consumers) == 0:
		return nil, fmt.Errorf("no consumer to run")
	case o.batchBytes < 1024:
		return nil, fmt.Errorf("-batch-bytes must be at least 1024")
	case o.startupBufferBytes < 0:
		return nil, fmt.Errorf("-startup-buffer-bytes must not be negative")
	case o.startupIdleWindow < 0:
		return nil, fmt.Errorf("-startup-idle-window must not be negative")
	case o.runs(sectionLatency) && !o.runs(sectionThroughput) && o.latencyRate <= 0 && o.latencyDuration > 0 && len(o.sizes) > 0:
		return nil, fmt.Errorf("-sections: the latency runs take their rate from the throughput runs: add throughput, or set -latency-rate")
	case o.concRounds < 1:
		return nil, fmt.Errorf("-concurrency-rounds must be at least 1")
	case o.concKeys < o.partitions:
		return nil, fmt.Errorf("-concurrency-keys %d: want at least one key per partition (%d)", o.concKeys, o.partitions)
	case o.concKeyPick != keyPickRandom && o.concKeyPick != keyPickRoundRobin:
		return nil, fmt.Errorf("-concurrency-key-pick: unknown %q (known: %s, %s)", o.concKeyPick, keyPickRandom, keyPickRoundRobin)
	case o.concInFlight < 1:
		return nil, fmt.Errorf("-concurrency-in-flight must be at least 1")
	case o.concStuckAhead < 0:
		return nil, fmt.Errorf("-concurrency-stuck-ahead must not be negative")
	case o.replayRounds < 1:
		return nil, fmt.Errorf("-replay-rounds must be at least 1")
	case o.replayWindow <= 0:
		return nil, fmt.Errorf("-replay-window must be positive")
	case o.metricsPartitions < 0 || o.metricsPerPart < 1 || o.metricsScrapes < 1 || o.metricsIdleWindow <= 0 || o.metricsRounds < 0:
		return nil, fmt.Errorf("-metrics-partitions, -metrics-rounds must not be negative; -metrics-partition-messages, -metrics-scrapes, -metrics-idle-window must be positive")
	case o.metricsMessages < int64(o.partitions):
		return nil, fmt.Errorf("-metrics-messages %d: want at least one message per partition", o.metricsMessages)
	case o.moves < 1 || o.movesRounds < 1:
		return nil, fmt.Errorf("-leadermoves-moves and -leadermoves-rounds must be at least 1")
	case o.concMessages < int64(o.partitions):
		return nil, fmt.Errorf("-concurrency-messages %d: want at least one message per partition", o.concMessages)
	}
	for _, s := range o.sizes {
		if s < 16 {
			return nil, fmt.Errorf("-sizes: %d is below the 16 bytes a latency message needs", s)
		}
	}
	return o, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Sections of the benchmark (-sections), in the order they run.
const (
	sectionThroughput   = "throughput"   // the main tables: every consumer, every value size and handler
	sectionLatency      = "latency"      // the fixed-rate runs: latency columns of the main tables
	sectionStartup      = "startup"      // tidemark on many partitions
	sectionConcurrency  = "concurrency"  // tidemark's orderings on one keyed topic
	sectionReplay       = "replay"       // tidemark's Config.MaxUndurable: msgs/s against the replay bound
	sectionMetrics      = "metrics"      // the cost of package metrics: scrapes with many partitions, no-op msgs/s with it
	sectionTransactions = "transactions" // ReadCommitted on a transactional topic against plain reads and franz-go (transactions.go)
	sectionLeaderMoves  = "leadermoves"  // resume after a leader move, tidemark and franz-go (kfake only; leadermoves.go)
	sectionRebalance    = "rebalance"    // a member joins and leaves: move time and stalls, classic against the consumer protocol (rebalance.go)
	sectionWide         = "wide"         // 1,000 and 10,000 partitions: time to the last message and peak RSS, tidemark and franz-go (wide.go)
	sectionRestore      = "restore"      // a state restored from its changelog against consuming that changelog (restore.go)
)

var sectionOrder = []string{sectionThroughput, sectionLatency, sectionStartup, sectionConcurrency, sectionReplay, sectionMetrics, sectionTransactions, sectionLeaderMoves, sectionRebalance, sectionWide, sectionRestore}

// runs reports whether -sections selected section.
func (o *options) runs(section string) bool { return contains(o.sections, section) }

// parseWindows parses "mode=duration,..." over the concurrency section's
// default windows.
func parseWindows(s string, noop time.Duration) (map[string]time.Duration, error) {
	w := map[string]time.Duration{
		handlerNoop:     noop,
		handlerSleep:    3 * time.Second,
		handlerSleep20:  4 * time.Second,
		handlerSleep100: 8 * time.Second,
	}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		h, v, ok := strings.Cut(f, "=")
		if _, known := w[h]; !ok || !known {
			return nil, fmt.Errorf("%q: want mode=duration, mode one of %s", f, strings.Join(concHandlerOrder, ", "))
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q: bad duration", f)
		}
		w[h] = d
	}
	return w, nil
}

// parseList checks a comma-separated list against the known names, keeping
// their order; all selects every one.
func parseList(s string, known []string, all string) ([]string, error) {
	want := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == all {
			for _, k := range known {
				want[k] = true
			}
			continue
		}
		found := false
		for _, k := range known {
			found = found || k == f
		}
		if !found {
			return nil, fmt.Errorf("unknown %q (known: %s)", f, strings.Join(known, ", "))
		}
		want[f] = true
	}
	var out []string
	for _, k := range known {
		if want[k] {
			out = append(out, k)
		}
	}
	return out, nil
}

func remove(list []string, name string) []string {
	var out []string
	for _, s := range list {
		if s != name {
			out = append(out, s)
		}
	}
	return out
}

// run is the orchestrator: the whole benchmark, testable in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	if o.summaryOnly {
		if o.out == "" {
			return fmt.Errorf("-summary needs -out, the file whose tables it counts")
		}
		if err := writeSummary(o.out); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: wrote the summary of %s\n", o.out)
		return nil
	}
	b, err := newBench(o, stderr)
	if err != nil {
		return err
	}
	err = b.run(ctx)
	if cerr := b.close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	md := b.report()
	if _, err := io.WriteString(stdout, md); err != nil {
		return err
	}
	if o.out != "" {
		if err := b.updateMarkdown(o.out, md); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: wrote %s\n", o.out)
	}
	return nil
}
