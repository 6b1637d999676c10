// Command quickstart shows, in a few seconds, what tidemark is for.
//
//	go run ./examples/quickstart
//
// It starts an in-process Kafka broker (franz-go's kfake; nothing to
// install), produces messages to a fresh topic and consumes them with
// tidemark. Half-way through, the broker starts refusing every offset
// commit. Handling goes on, because tidemark records what it handled in a
// local offset file, not in Kafka. The consumer is stopped while commits
// still fail, so Kafka's committed offsets are behind the file: a consumer
// that trusts Kafka would handle those messages again. A new consumer on the
// same file reconciles the two, resumes where the file says, and brings
// Kafka up to date. The run ends with a check: every message handled, none
// lost, none handled twice, and Kafka's committed offsets equal to the
// file's watermarks. It exits with status 1 if any of that fails.
//
// Flags:
//
//	-brokers host:port  use this Kafka cluster instead of the in-process
//	                    broker. A fresh topic and group are created, and
//	                    deleted at the end. A real broker cannot be made to
//	                    refuse commits from here, so commits do not fail:
//	                    the run shows a restart on the offset file with Kafka
//	                    up to date, and the same final check. (Setting the
//	                    group's offsets back with an admin tool would not do:
//	                    tidemark takes an offset below the one Kafka last
//	                    confirmed to it for an operator's reset, and follows
//	                    it.)
//	-messages N         messages to produce (default 2000).
//	-partitions N       partitions of the topic (default 4).
//	-offsets PATH       offset file to use (default: one in a temporary folder,
//	                    removed at the end). Its folder must exist.
//	-v                  debug logs of tidemark on stderr. By default only
//	                    errors are logged.
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
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/framework"
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
	fs.StringVar(&o.brokers, "brokers", "", "a real Kafka cluster `host:port[,host:port]` (default: an in-process broker)")
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
	brokers, topic := strings.Split(o.brokers, ","), "orders"
	group := "quickstart-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var fake *kfake.Cluster
	if o.brokers == "" {
		if fake, err = kfake.NewCluster(kfake.NumBrokers(1)); err != nil {
			return fmt.Errorf("starting the in-process broker: %w", err)
		}
		defer fake.Close()
		brokers = fake.ListenAddrs()
	} else {
		topic = group + "-orders"
	}
	tr := &kafka.Transport{ClientID: "quickstart-admin"}
	defer tr.CloseIdleConnections()
	admin := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}

	// The fault: on the in-process broker, every OffsetCommit is refused
	// while failing is set, with COORDINATOR_NOT_AVAILABLE, a retriable
	// error real clusters return while the group coordinator moves.
	var failing atomic.Bool
	var refused atomic.Int64
	if fake != nil {
		fake.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
			fake.KeepControl()
			if !failing.Load() {
				return nil, nil, false
			}
			refused.Add(1)
			return refuseCommit(req.(*kmsg.OffsetCommitRequest), kerr.CoordinatorNotAvailable.Code), nil, true
		})
	}

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
	ends, err := produce(ctx, brokers, topic, o.partitions, o.messages)
	if err != nil {
		return err
	}
	parts := make([]int, o.partitions)
	for p := range parts {
		parts[p] = p
	}
	out.nameWidth = max(out.nameWidth, len(fmt.Sprintf("%s/%d", topic, o.partitions-1)))

	where := "in-process kfake broker"
	if fake == nil {
		where = "Kafka"
	}
	if fake != nil {
		out.f("tidemark quickstart: commits to Kafka fail, the consumer restarts, nothing is lost or handled twice.\n\n")
	} else {
		out.f("tidemark quickstart: the consumer stops half-way and restarts on its offset file, nothing is lost or handled twice.\n\n")
	}
	out.f("  broker       %s at %s\n", where, strings.Join(brokers, ","))
	out.f("  topic        %s, %d partitions, %d messages produced\n", topic, o.partitions, o.messages)
	out.f("  group        %s\n", group)
	out.f("  offset file  %s\n\n", file)

	rec := newRecorder(o.partitions)
	cfg := framework.Config{
		Brokers:        brokers,
		GroupID:        group,
		Topics:         []string{topic},
		OffsetFile:     file,
		Handler:        rec,
		CommitInterval: commitInterval,
		Logger:         newLogger(o.verbose),
	}

	// 1. Consume; at half-way, every commit to Kafka starts failing.
	out.f("1. Consuming (%s of work per message, commits every %s).\n", work, commitInterval)
	half := o.messages / 2
	rec.at(half, func() { failing.Store(fake != nil) })
	c1, err := startConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	defer c1.stop()
	if err := waitFor(ctx, c1, "half of the messages handled", func() bool { return rec.distinct() >= half }); err != nil {
		return err
	}
	if fake != nil {
		out.f("   %d of %d handled: from now on every offset commit fails with %s (%d).\n", half, o.messages,
			kerr.CoordinatorNotAvailable.Message, kerr.CoordinatorNotAvailable.Code)
	} else {
		out.f("   %d of %d handled. (On a real broker, commits cannot be made to fail from here: they go on.)\n", half, o.messages)
	}
	if err := waitFor(ctx, c1, "commits refused while handling goes on", func() bool {
		return (fake == nil || refused.Load() >= 2) && rec.distinct() >= o.messages*3/4
	}); err != nil {
		return err
	}
	out.f("   %d of %d handled, %d commits refused. Handling goes on", rec.distinct(), o.messages, refused.Load())
	if fake != nil {
		out.f("; Kafka's committed offsets stay behind")
	}
	out.f(":\n\n")
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
	out.f("\n2. Stopped the consumer%s (Run returned nil).\n", map[bool]string{true: " while commits still fail"}[fake != nil])
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

	// 3. Heal and restart on the same offset file. The handler is held until
	// we have looked, so that what is printed is exactly what reconciliation
	// did, before any new message moves the offsets.
	failing.Store(false)
	release := rec.hold()
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
	out.f("\n3. %sA new consumer opened the same offset file and reconciled it with Kafka:\n\n", map[bool]string{true: "Commits work again. "}[fake != nil])
	for _, p := range c2.Stats().Partitions {
		l, k := local[p.Partition], kafkaOffsets[p.Partition]
		op := map[int]string{-1: "<", 0: "=", 1: ">"}[cmpInt(l, k)]
		out.f("   %-*s  local %s %s Kafka %s: resumed at %d, Kafka committed %s\n", out.nameWidth,
			fmt.Sprintf("%s/%d", p.Topic, p.Partition), offsetString(l), op, offsetString(k), p.Processed, offsetString(after[p.Partition]))
	}
	release()
	if err := waitFor(ctx, c2, "every message handled", func() bool { return rec.distinct() >= o.messages }); err != nil {
		return err
	}
	if err := c2.stop(); err != nil {
		return fmt.Errorf("second consumer: %w", err)
	}

	// 4. Check.
	if local, err = readOffsetFile(file, group, topic, parts); err != nil {
		return err
	}
	if kafkaOffsets, err = committed(ctx, admin, group, topic, parts); err != nil {
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

// refuseCommit answers an OffsetCommit with code for every partition.
func refuseCommit(req *kmsg.OffsetCommitRequest, code int16) *kmsg.OffsetCommitResponse {
	res := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewOffsetCommitResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewOffsetCommitResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			st.Partitions = append(st.Partitions, sp)
		}
		res.Topics = append(res.Topics, st)
	}
	return res
}

// payload is the value of the i-th message produced: unique, and it says
// where it must land, so the handler can check it got the right bytes.
func payload(i int) []byte { return fmt.Appendf(nil, "order-%07d", i) }

// createTopic creates topic and waits until every partition has a leader.
func createTopic(ctx context.Context, admin *kafka.Client, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	res, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: -1, // the cluster's default
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
// i%partitions, at offset i/partitions, with franz-go's idempotent producer
// (each record written once and in order, even when a request is retried).
// It returns each partition's log end.
func produce(ctx context.Context, brokers []string, topic string, partitions, messages int) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, err
	}
	defer kc.Close()
	recs := make([]*kgo.Record, messages)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: payload(i)}
	}
	if err := kc.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return nil, fmt.Errorf("producing to %s: %w", topic, err)
	}
	ends := make([]int64, partitions)
	for i, r := range recs {
		if r.Offset != int64(i/partitions) {
			return nil, fmt.Errorf("message %d landed at %s/%d offset %d, want %d: the topic is not fresh", i, topic, r.Partition, r.Offset, i/partitions)
		}
		ends[r.Partition] = r.Offset + 1
	}
	return ends, nil
}

// readOffsetFile reads the durable watermarks from the offset file, opened
// read-only (a consumer must not have it open); -1 where none.
func readOffsetFile(path, group, topic string, parts []int) ([]int64, error) {
	f, err := offsetstore.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := make([]int64, len(parts))
	for _, p := range parts {
		out[p] = -1
		if rec, ok := f.Lookup(group, topic, p); ok {
			out[p] = rec.Watermark
		}
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

func cmpInt(a, b int64) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
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

// newLogger logs tidemark's errors on stderr, or everything with -v. The
// commit failures the demo causes are logged at warn level, once per commit
// interval: not shown by default.
func newLogger(verbose bool) *zap.Logger {
	level := zapcore.ErrorLevel
	if verbose {
		level = zapcore.DebugLevel
	}
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	// framework raises its HTTP servers' logger to warn, which zap refuses,
	// noisily, on a core at error: keep that complaint off the console.
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(os.Stderr), level), zap.ErrorOutput(zapcore.AddSync(io.Discard)))
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
