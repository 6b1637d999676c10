// Command quickstart shows, in a few seconds, what tidemark is for.
//
//	go run ./examples/quickstart
//
// It starts an in-process Kafka broker (franz-go's kfake; nothing to
// install), produces messages to a fresh topic and consumes them with
// tidemark through a fault proxy. Half-way through, the proxy makes every
// offset commit fail. Handling goes on, because tidemark records what it
// handled in a local offset file, not in Kafka. The consumer is stopped while
// commits still fail, so Kafka's committed offsets are behind the file: a
// consumer that trusts Kafka would handle those messages again. A new
// consumer on the same file reconciles the two, resumes where the file says,
// and brings Kafka up to date. The run ends with a check: every message
// handled, none lost, none handled twice, and Kafka's committed offsets equal
// to the file's watermarks. It exits with status 1 if any of that fails.
//
// Flags:
//
//	-brokers host:port  use this Kafka broker instead of the in-process one.
//	                    A fresh topic and group are created (and the topic and
//	                    group are deleted at the end). The fault proxy fronts
//	                    this one broker, so use a single-broker cluster: with
//	                    several, the group's coordinator may be another broker
//	                    and the commit fault would not reach it.
//	-messages N         messages to produce (default 2000).
//	-partitions N       partitions of the topic (default 4).
//	-offsets PATH       offset file to use (default: one in a temporary folder,
//	                    removed at the end). Its folder must exist.
//	-v                  debug logs of tidemark, kafka-go and the proxy on
//	                    stderr. By default only errors are logged.
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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/offsetstore"
)

// The demo's pace: each message takes a little work so that the run spans
// many commit intervals, and commits are frequent so that a few seconds show
// many of them. A real service keeps the default CommitInterval (1s).
const (
	work           = 2 * time.Millisecond
	commitInterval = 100 * time.Millisecond
	// stepTimeout bounds every wait, so that a broken setup fails instead
	// of hanging.
	stepTimeout = 30 * time.Second
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

type options struct {
	brokers    string
	messages   int
	partitions int
	offsets    string
	verbose    bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.StringVar(&o.brokers, "brokers", "", "a real Kafka broker `host:port` (default: an in-process broker)")
	fs.IntVar(&o.messages, "messages", 2000, "messages to produce")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions of the topic")
	fs.StringVar(&o.offsets, "offsets", "", "offset file `path` (default: in a temporary folder)")
	fs.BoolVar(&o.verbose, "v", false, "debug logs on stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.messages < 2:
		return o, fmt.Errorf("-messages %d: at least 2 are needed", o.messages)
	case o.partitions < 1 || o.partitions > 1000:
		return o, fmt.Errorf("-partitions %d: must be in [1, 1000]", o.partitions)
	}
	return o, nil
}

// run is the whole quickstart; main only adds signal handling and the exit
// status. It returns an error if the setup fails or if the final check finds
// a message lost or handled twice.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	began := time.Now()
	out := &printer{w: stdout, nameWidth: len("partition")}

	// The broker: in-process unless -brokers names one.
	upstream, topic := o.brokers, "orders"
	group := "quickstart-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	where := "real broker"
	if upstream == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return fmt.Errorf("starting the in-process broker: %w", err)
		}
		defer cluster.Close()
		upstream, where = cluster.ListenAddrs()[0], "in-process kfake broker"
	} else {
		topic = group + "-orders"
	}
	tr := &kafka.Transport{ClientID: "quickstart-admin"}
	defer tr.CloseIdleConnections()
	admin := &kafka.Client{Addr: kafka.TCP(upstream), Transport: tr, Timeout: 10 * time.Second}

	// The fault proxy: consumers connect to it, and it forwards to the broker
	// unless told to fail a request.
	var proxyOpts []kafkaproxy.Option
	if o.verbose {
		proxyOpts = append(proxyOpts, kafkaproxy.WithLogger(newConsoleLogger(zapcore.DebugLevel)))
	}
	proxy, err := kafkaproxy.New(upstream, proxyOpts...)
	if err != nil {
		return err
	}
	defer proxy.Close()

	file := o.offsets
	if file == "" {
		dir, err := os.MkdirTemp("", "tidemark-quickstart-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		file = filepath.Join(dir, "offsets.db")
	}

	if err := createTopic(ctx, admin, topic, o.partitions); err != nil {
		return err
	}
	if o.brokers != "" {
		defer deleteTopicAndGroup(admin, topic, group, out)
	}
	ends, err := produce(ctx, admin, topic, o.partitions, o.messages)
	if err != nil {
		return err
	}
	parts := make([]int, o.partitions)
	for p := range parts {
		parts[p] = p
	}
	out.nameWidth = max(out.nameWidth, len(fmt.Sprintf("%s/%d", topic, o.partitions-1)))

	out.f("tidemark quickstart: commits to Kafka fail, the consumer restarts, nothing is lost or handled twice.\n\n")
	out.f("  broker       %s at %s, behind a fault proxy at %s\n", where, upstream, proxy.Addr())
	out.f("  topic        %s, %d partitions, %d messages produced\n", topic, o.partitions, o.messages)
	out.f("  group        %s\n", group)
	out.f("  offset file  %s\n\n", file)

	rec := newRecorder(o.partitions)
	cfg := framework.Config{
		Brokers:        []string{proxy.Addr()},
		GroupID:        group,
		Topics:         []string{topic},
		OffsetFile:     file,
		Handler:        rec,
		CommitInterval: commitInterval,
	}

	// 1. Consume; at half-way, every commit to Kafka starts failing.
	out.f("1. Consuming (%s of work per message, commits every %s).\n", work, commitInterval)
	var fault *kafkaproxy.Rule
	var faultErr error
	half := o.messages / 2
	rec.at(half, func() {
		// COORDINATOR_NOT_AVAILABLE, a retriable error real clusters return
		// while the group coordinator moves.
		fault, faultErr = proxy.Fail(kmsg.OffsetCommit, kerr.CoordinatorNotAvailable.Code)
	})
	log1, _ := newLogger(o.verbose)
	cfg.Logger = log1
	c1, err := startConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	defer c1.stop()
	if err := waitFor(ctx, c1, "half of the messages handled", func() bool { return rec.distinct() >= half }); err != nil {
		return err
	}
	if faultErr != nil {
		return faultErr
	}
	out.f("   %d of %d handled: from now on every offset commit fails with %s (%d).\n", half, o.messages,
		kerr.CoordinatorNotAvailable.Message, kerr.CoordinatorNotAvailable.Code)
	if err := waitFor(ctx, c1, "commits refused while handling goes on", func() bool {
		return fault.Applied() >= 2 && rec.distinct() >= o.messages*3/4
	}); err != nil {
		if fault.Applied() == 0 && ctx.Err() == nil {
			err = fmt.Errorf("%w (the proxy never saw a commit: is the group coordinator another broker?)", err)
		}
		return err
	}
	out.f("   %d of %d handled, %d commits refused. Handling goes on; Kafka's committed offsets stay behind:\n\n",
		rec.distinct(), o.messages, fault.Applied())
	out.table([]string{"handled", "local watermark", "Kafka committed", "behind"}, func(row func(string, ...int64)) {
		for _, p := range c1.Stats().Partitions {
			row(fmt.Sprintf("%s/%d", p.Topic, p.Partition), int64(p.Handled), p.Durable, p.Committed, behind(p.Durable, p.Committed))
		}
	})

	// 2. Stop while commits still fail: Run drains, flushes the offset file,
	// tries a last commit (refused) and returns nil.
	if err := c1.stop(); err != nil {
		return fmt.Errorf("first consumer: %w", err)
	}
	local, err := readOffsetFile(file, group, topic, parts)
	if err != nil {
		return err
	}
	kafkaOffsets, err := committed(ctx, admin, group, topic, parts)
	if err != nil {
		return err
	}
	out.f("\n2. Stopped the consumer while commits still fail (Run returned nil).\n")
	out.f("   The offset file (opened read-only) against Kafka's committed offsets (OffsetFetch):\n\n")
	var gap int64
	out.table([]string{"local watermark", "Kafka committed", "behind"}, func(row func(string, ...int64)) {
		for _, p := range parts {
			b := behind(local[p], kafkaOffsets[p])
			gap += b
			row(fmt.Sprintf("%s/%d", topic, p), local[p], kafkaOffsets[p], b)
		}
	})
	out.f("\n   A consumer that resumes from Kafka's committed offsets would handle %d messages again.\n", gap)

	// 3. Heal the proxy and restart on the same offset file. The handler is
	// held until we have looked, so that what is printed is exactly what
	// reconciliation did, before any new message moves the offsets.
	fault.Remove()
	release := rec.hold()
	log2, logs := newLogger(o.verbose)
	cfg.Logger = log2
	c2, err := startConsumer(ctx, cfg)
	if err != nil {
		release()
		return err
	}
	defer c2.stop()
	defer release() // before c2.stop, so that a held Handle does not wait out DrainTimeout
	if err := waitFor(ctx, c2, "reconciliation of every partition", func() bool {
		st := c2.Stats().Partitions
		return len(st) == len(parts) && !slices.ContainsFunc(st, func(p framework.PartitionStats) bool {
			return p.State == framework.StateReconciling
		})
	}); err != nil {
		return err
	}
	after, err := committed(ctx, admin, group, topic, parts)
	if err != nil {
		return err
	}
	out.f("\n3. Commits work again. A new consumer opened the same offset file and reconciled it with Kafka:\n\n")
	var msgs []string
	for _, p := range c2.Stats().Partitions {
		what, msg := reconciliation(logs, p.Partition)
		out.f("   %-*s  %s: resumed at %d, Kafka committed %s\n", out.nameWidth, fmt.Sprintf("%s/%d", p.Topic, p.Partition),
			what, p.Processed, offsetString(after[p.Partition]))
		if msg != "" && !slices.Contains(msgs, msg) {
			msgs = append(msgs, msg)
		}
	}
	for _, m := range msgs {
		out.f("   (tidemark logged: %q)\n", m)
	}
	release()
	if err := waitFor(ctx, c2, "every message handled", func() bool { return rec.distinct() >= o.messages }); err != nil {
		return err
	}
	if err := c2.stop(); err != nil {
		return fmt.Errorf("second consumer: %w", err)
	}

	// 4. Check.
	local, err = readOffsetFile(file, group, topic, parts)
	if err != nil {
		return err
	}
	kafkaOffsets, err = committed(ctx, admin, group, topic, parts)
	if err != nil {
		return err
	}
	lost, twice, calls, wrong := rec.check(ends)
	var mismatched []string
	for _, p := range parts {
		if local[p] != ends[p] || kafkaOffsets[p] != local[p] {
			mismatched = append(mismatched, fmt.Sprintf("%s/%d: log end %d, local %s, Kafka %s", topic, p,
				ends[p], offsetString(local[p]), offsetString(kafkaOffsets[p])))
		}
	}
	out.f("\n4. All handled; consumer stopped. Summary:\n\n")
	out.f("   produced        %6d\n", o.messages)
	out.f("   handled         %6d   (%d handler calls)\n", rec.distinct(), calls)
	out.f("   lost            %6d\n", lost)
	out.f("   handled twice   %6d\n", twice)
	if len(mismatched) == 0 {
		out.f("   Kafka committed == local watermark == log end, on every partition\n")
	} else {
		out.f("   Kafka committed != local watermark on %d partitions:\n", len(mismatched))
		for _, m := range mismatched {
			out.f("     %s\n", m)
		}
	}
	for _, w := range wrong {
		out.f("   wrong payload: %s\n", w)
	}
	if out.err != nil {
		return out.err
	}
	if lost > 0 || twice > 0 || len(mismatched) > 0 || len(wrong) > 0 {
		return fmt.Errorf("check failed: %d lost, %d handled twice, %d partitions with Kafka != local, %d wrong payloads",
			lost, twice, len(mismatched), len(wrong))
	}
	out.f("\nOK in %.1fs\n", time.Since(began).Seconds())
	return out.err
}

// payload is the value of the i-th message produced: unique, and it says
// where it must land, so the handler can check it got the right bytes.
func payload(i int) []byte { return fmt.Appendf(nil, "order-%07d", i) }

// createTopic creates topic and waits until every partition has a leader.
func createTopic(ctx context.Context, admin *kafka.Client, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	res, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	for {
		md, err := admin.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions &&
			!slices.ContainsFunc(md.Topics[0].Partitions, func(p kafka.Partition) bool { return p.Error != nil || p.Leader.Port == 0 }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: partitions without a leader: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// produce writes messages round-robin: message i goes to partition
// i%partitions, at offset i/partitions. It returns each partition's log end.
func produce(ctx context.Context, admin *kafka.Client, topic string, partitions, messages int) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	ends := make([]int64, partitions)
	for p := range partitions {
		type record struct{ value []byte }
		var recs []record
		for i := p; i < messages; i += partitions {
			recs = append(recs, record{payload(i)})
		}
		for len(recs) > 0 {
			n := min(len(recs), 1000)
			var res *kafka.ProduceResponse
			var err error
			// A real broker may still be electing the new partition's
			// leader: retry what Kafka calls retriable. Records are readers,
			// consumed by a send, so they are built anew each attempt.
			for attempt := 1; ; attempt++ {
				batch := make([]kafka.Record, n)
				for i := range batch {
					batch[i] = kafka.Record{Value: kafka.NewBytes(recs[i].value)}
				}
				res, err = admin.Produce(ctx, &kafka.ProduceRequest{
					Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
					Records: kafka.NewRecordReader(batch...),
				})
				if err == nil {
					err = res.Error
				}
				var ke kafka.Error
				if err == nil || !errors.As(err, &ke) || !ke.Temporary() || attempt == 50 {
					break
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(100 * time.Millisecond):
				}
			}
			if err == nil && res.BaseOffset != ends[p] {
				err = fmt.Errorf("records landed at offset %d, want %d: the topic is not fresh", res.BaseOffset, ends[p])
			}
			if err != nil {
				return nil, fmt.Errorf("producing to %s/%d: %w", topic, p, err)
			}
			ends[p] += int64(n)
			recs = recs[n:]
		}
	}
	return ends, nil
}

// readOffsetFile reads the durable watermarks from the offset file, opened
// read-only (a consumer must not have it open); -1 where none.
func readOffsetFile(path, group, topic string, parts []int) ([]int64, error) {
	st, err := offsetstore.Open(path, &offsetstore.Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	out := make([]int64, len(parts))
	for _, p := range parts {
		rec, _ := st.Durable(offsetstore.Key{Group: group, Topic: topic, Partition: int32(p)})
		out[p] = rec.Watermark
	}
	return out, nil
}

// committed returns the group's committed offsets in Kafka; -1 where none.
func committed(ctx context.Context, admin *kafka.Client, group, topic string, parts []int) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	res, err := admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, fmt.Errorf("fetching the committed offsets of group %s: %w", group, err)
	}
	out := make([]int64, len(parts))
	for p := range out {
		out[p] = -1
	}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("fetching the committed offset of %s/%d: %w", topic, po.Partition, po.Error)
		}
		if po.Partition >= 0 && po.Partition < len(out) {
			out[po.Partition] = po.CommittedOffset
		}
	}
	return out, nil
}

func deleteTopicAndGroup(admin *kafka.Client, topic, group string, out *printer) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	if res, err := admin.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}}); err != nil {
		errs = append(errs, err)
	} else if err := res.Errors[topic]; err != nil {
		errs = append(errs, err)
	}
	if res, err := admin.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{GroupIDs: []string{group}}); err != nil {
		errs = append(errs, err)
	} else if err := res.Errors[group]; err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		out.f("cleanup: deleting topic %s and group %s: %v\n", topic, group, err)
	}
}

// reconciliation describes what the consumer logged when it compared the
// offset file's watermark of a partition with Kafka's committed offset, and
// returns the log message it is drawn from.
func reconciliation(logs *observer.ObservedLogs, partition int) (what, msg string) {
	for _, e := range logs.All() {
		f := e.ContextMap()
		if e.LoggerName != "tidemark" || toInt64(f["partition"]) != int64(partition) {
			continue
		}
		switch {
		case f["kafka_committed"] != nil:
			l, c := toInt64(f["local"]), toInt64(f["kafka_committed"])
			op := "="
			switch {
			case l > c:
				op = ">"
			case l < c:
				op = "<"
			}
			return fmt.Sprintf("local %s %s Kafka %s", offsetString(l), op, offsetString(c)), e.Message
		case strings.Contains(e.Message, "agree"):
			o := offsetString(toInt64(f["offset"]))
			return fmt.Sprintf("local %s = Kafka %s", o, o), e.Message
		case f["log_start"] != nil: // out of range: reset or stalled by policy
			return "out of range", e.Message
		case strings.HasPrefix(e.Message, "no position"):
			return "no position in the file or Kafka", e.Message
		}
	}
	return "no reconciliation logged", ""
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case int:
		return int64(n)
	}
	return -2
}

func offsetString(o int64) string {
	if o < 0 {
		return "none"
	}
	return strconv.FormatInt(o, 10)
}

// behind is how many messages Kafka's committed offset is behind the local
// watermark.
func behind(local, kafka int64) int64 { return max(local, 0) - max(kafka, 0) }

// newLogger returns the consumer's logger: an observer that keeps every
// entry, for reading what reconciliation did, and the console (stderr) at
// error level, or debug level with -v. The commit failures the demo causes
// are logged at warn level, once per commit interval: not shown by default.
func newLogger(verbose bool) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	level := zapcore.ErrorLevel
	if verbose {
		level = zapcore.DebugLevel
	}
	return zap.New(zapcore.NewTee(core, newConsoleLogger(level).Core())), logs
}

func newConsoleLogger(level zapcore.Level) *zap.Logger {
	enc := zap.NewDevelopmentEncoderConfig()
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), level))
}

// consumer is a tidemark Consumer running in its own goroutine.
type consumer struct {
	*framework.Consumer
	cancel context.CancelFunc
	exited chan struct{}
	err    error // Run's result, once exited is closed
}

func startConsumer(ctx context.Context, cfg framework.Config) (*consumer, error) {
	c, err := framework.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &consumer{Consumer: c, cancel: cancel, exited: make(chan struct{})}
	go func() {
		defer close(r.exited)
		r.err = c.Run(ctx)
	}()
	return r, nil
}

// stop cancels Run and waits for it to return; it may be called again.
func (c *consumer) stop() error {
	c.cancel()
	<-c.exited
	return c.err
}

// waitFor polls cond until it holds, failing if ctx ends, the consumer
// stops, or stepTimeout passes.
func waitFor(ctx context.Context, c *consumer, what string, cond func() bool) error {
	deadline := time.NewTimer(stepTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.exited:
			return fmt.Errorf("waiting for %s: the consumer stopped: %v", what, c.err)
		case <-deadline.C:
			return fmt.Errorf("timed out after %s waiting for %s", stepTimeout, what)
		case <-tick.C:
		}
	}
	return nil
}

// recorder is the handler: it does a little work and records every
// (partition, offset) it handled. It is shared by all partitions, so it
// locks.
type recorder struct {
	partitions int

	mu      sync.Mutex
	seen    map[[2]int64]int // (partition, offset) -> times handled
	calls   int
	wrong   []string
	held    chan struct{} // while open, Handle waits
	atCount int           // when len(seen) reaches it, atFunc runs
	atFunc  func()
}

func newRecorder(partitions int) *recorder {
	return &recorder{partitions: partitions, seen: map[[2]int64]int{}}
}

func (r *recorder) Handle(ctx context.Context, m kafka.Message) error {
	r.mu.Lock()
	held := r.held
	r.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return ctx.Err() // not done: handled again by the next owner
		}
	}

	time.Sleep(work) // the work

	r.mu.Lock()
	defer r.mu.Unlock()
	if want := payload(int(m.Offset)*r.partitions + m.Partition); string(m.Value) != string(want) {
		r.wrong = append(r.wrong, fmt.Sprintf("%d/%d: %q, want %q", m.Partition, m.Offset, m.Value, want))
	}
	r.seen[[2]int64{int64(m.Partition), m.Offset}]++
	r.calls++
	if len(r.seen) == r.atCount && r.atFunc != nil {
		r.atFunc() // under the lock: no message is handled until it returns
		r.atFunc = nil
	}
	return nil
}

// at makes fn run when n distinct messages have been handled, before the
// next one is.
func (r *recorder) at(n int, fn func()) {
	r.mu.Lock()
	r.atCount, r.atFunc = n, fn
	r.mu.Unlock()
}

// hold makes Handle wait until the returned function is called.
func (r *recorder) hold() (release func()) {
	ch := make(chan struct{})
	r.mu.Lock()
	r.held = ch
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.held = nil
			r.mu.Unlock()
			close(ch)
		})
	}
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// check compares what was handled with the offsets [0, ends[p]) of every
// partition p.
func (r *recorder) check(ends []int64) (lost, twice, calls int, wrong []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, end := range ends {
		for o := range end {
			switch n := r.seen[[2]int64{int64(p), o}]; {
			case n == 0:
				lost++
			case n > 1:
				twice += n - 1
			}
		}
	}
	return lost, twice, r.calls, slices.Clone(r.wrong)
}

// printer writes the report, keeping the first write error.
type printer struct {
	w         io.Writer
	err       error
	nameWidth int // of the partition column
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

// table prints a header and rows of offsets, right-aligned under their
// column names; negative offsets print as "none".
func (p *printer) table(cols []string, rows func(row func(name string, vals ...int64))) {
	p.f("   %-*s", p.nameWidth, "partition")
	for _, c := range cols {
		p.f("  %s", c)
	}
	p.f("\n")
	rows(func(name string, vals ...int64) {
		p.f("   %-*s", p.nameWidth, name)
		for i, v := range vals {
			p.f("  %*s", len(cols[i]), offsetString(v))
		}
		p.f("\n")
	})
}
