package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The wide section: one consumer on a backlog spread over many partitions,
// tried as a new user would (issue 28): a topic of 1,000, then one of
// 10,000 partitions, each holding 1,000,000 messages of 200 B; each
// consumer in a child process printing every value through a buffered
// writer; the wall time from the child's start to its last message and its
// peak RSS, tidemark and franz-go's group consumer side by side. At the
// widest topic the consumer then stays up idle, and the fetch requests it
// sends and its CPU are measured.

// wideConsumerOrder are the section's consumers, in their order.
var wideConsumerOrder = []string{consTidemark, consFranz}

// wideOptions are the section's flags.
type wideOptions struct {
	messages   int64
	partitions []int
	size       int
	rounds     int
	idleWindow time.Duration
}

func registerWideFlags(fs *flag.FlagSet, w *wideOptions) {
	fs.Int64Var(&w.messages, "wide-messages", 1_000_000, "messages preloaded per topic of the wide section, spread evenly over its partitions")
	fs.Func("wide-partitions", "partitions of the wide section's topics, comma-separated, one topic each (default 1000,10000; on a real broker 1000,5000)", func(s string) error {
		v, err := parseInts(s)
		if err != nil {
			return err
		}
		w.partitions = v
		return nil
	})
	fs.IntVar(&w.size, "wide-size", 200, "value size in bytes of the wide section's messages")
	fs.IntVar(&w.rounds, "wide-rounds", 3, "rounds of the wide section, every consumer once per topic and round in a rotated order; tables show medians (one round of franz-go at 10,000 partitions took 1.16-1.75 s in runs of the same code)")
	fs.DurationVar(&w.idleWindow, "wide-idle-window", 10*time.Second, "at the widest topic, once the backlog is handled (and 1 s more), count the idle consumer's fetch requests and CPU over this long; 0: not measured")
}

// validate checks the flags; real says the broker is a real one, whose
// default widest topic is 5,000 partitions: on this 2-core machine Kafka
// 4.4.0 read back under 72,000 of the 1,000,000 records of a fresh
// 10,000-partition topic in the 10 minutes readAll allows.
func (w *wideOptions) validate(real bool) error {
	if w.partitions == nil {
		w.partitions = []int{1000, 10000}
		if real {
			w.partitions = []int{1000, 5000}
		}
	}
	for _, n := range w.partitions {
		if n < 1 || w.messages < int64(n) {
			return fmt.Errorf("-wide-partitions %d with -wide-messages %d: want at least one partition, and a message per partition", n, w.messages)
		}
	}
	switch {
	case len(w.partitions) == 0:
		return fmt.Errorf("-wide-partitions: none")
	case w.size < 1:
		return fmt.Errorf("-wide-size must be at least 1")
	case w.rounds < 1:
		return fmt.Errorf("-wide-rounds must be at least 1")
	case w.idleWindow < 0:
		return fmt.Errorf("-wide-idle-window must not be negative")
	}
	return nil
}

// wideRun is one child's run.
type wideRun struct {
	// wall is from just before the child was started to its last message.
	wall time.Duration
	res  childResult
	// broker is the broker's CPU over the run (brokerCPU), -1 when unknown.
	broker time.Duration
}

// wideRuns is what the section measured.
type wideRuns struct {
	// runs per topic width, then consumer.
	runs    map[int]map[string][]wideRun
	preload map[int]time.Duration
	// warm is the unmeasured read of each topic before its runs.
	warm map[int]time.Duration
	// leaders counts the brokers leading the widest topic's partitions.
	leaders int
	cons    []string
	took    time.Duration
	u0, u1  usage
	skip    string
}

func (b *bench) widest() int { return slices.Max(b.o.wide.partitions) }

func (b *bench) widePhase(ctx context.Context) error {
	x := &b.wide
	for _, c := range wideConsumerOrder {
		if contains(b.o.consumers, c) {
			x.cons = append(x.cons, c)
		}
	}
	if len(x.cons) == 0 {
		x.skip = "-consumers names neither tidemark nor franz-go"
		return nil
	}
	if b.broker.fake != nil {
		// kfake holds every topic in this process's memory: the earlier
		// sections' (GBs) made the broker slow in some runs, for either
		// consumer (1.5-2 s of its CPU, in encoding fetch responses, against
		// 0.4 s), and the next sections make their own.
		if err := b.broker.deleteCreated(ctx); err != nil {
			return err
		}
	}
	x.u0 = readUsage()
	start := time.Now()
	defer func() { x.took, x.u1 = time.Since(start), readUsage() }()
	x.runs, x.preload, x.warm = map[int]map[string][]wideRun{}, map[int]time.Duration{}, map[int]time.Duration{}
	o := &b.o.wide
	for _, parts := range o.partitions {
		per := o.messages / int64(parts)
		topic := fmt.Sprintf("tidemark-bench-%s-wide-%dp", b.runID, parts)
		t0 := time.Now()
		if err := b.broker.createWideTopic(ctx, topic, parts); err != nil {
			return err
		}
		if err := b.prod.preload(ctx, b.broker, topic, parts, per, o.size, per, nil); err != nil {
			return err
		}
		x.preload[parts] = time.Since(t0)
		b.logf("wide: preloaded %s: %d x %d messages of %d bytes in %s", topic, parts, per, o.size, x.preload[parts].Round(time.Millisecond))
		// A real broker's first read of a topic this wide is slow (Kafka 4.4.0
		// took about 70 s for the first consumer over 10,000 fresh
		// partitions, 2.5 s for the next one), and its first consumer group
		// makes it create the __consumer_offsets topic (0.7 s): read it
		// once unmeasured, in a group that commits, so that the first
		// consumer in the rotation does not pay for either.
		t0 = time.Now()
		if err := b.broker.readAll(ctx, topic, per*int64(parts)); err != nil {
			return err
		}
		x.warm[parts] = time.Since(t0)
		b.logf("wide: read %s once before the runs, in %s", topic, x.warm[parts].Round(time.Millisecond))
		idle := time.Duration(0)
		if parts == b.widest() {
			idle = o.idleWindow
			var err error
			if x.leaders, err = b.broker.leaders(ctx, topic); err != nil {
				return err
			}
		}
		x.runs[parts] = map[string][]wideRun{}
		for r := 0; r < o.rounds; r++ {
			for _, c := range rotate(x.cons, r) {
				u0 := readUsage()
				run, err := b.wideRun(ctx, c, topic, parts, per*int64(parts), idle, r)
				if err != nil {
					return fmt.Errorf("wide, %d partitions, round %d, %s: %w", parts, r+1, c, err)
				}
				u1 := readUsage()
				run.broker = brokerCPU(b.broker.fake != nil, u0, u1)
				x.runs[parts][c] = append(x.runs[parts][c], run)
				b.logf("wide %d partitions round %d/%d %-9s %d msgs: %s from process start to the last message, peak RSS %.0f MiB, CPU %.2f s to the last message; idle: %d fetch requests in %s, %.1f%% of a CPU (%s; the broker: CPU %.2f s over the run)",
					parts, r+1, o.rounds, c, run.res.Messages, run.wall.Round(time.Millisecond), mib(run.res.MaxRSS), run.res.CPUAtEnd.Seconds(),
					run.res.IdleRequests, run.res.IdleWindow.Round(time.Millisecond), 100*idleCores(run.res), disturbed(u0, u1), run.broker.Seconds())
			}
		}
		// The next topic is larger: kfake keeps every topic in memory.
		if err := b.broker.deleteTopic(ctx, topic); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) wideRun(ctx context.Context, c, topic string, parts int, want int64, idle time.Duration, round int) (wideRun, error) {
	dir, err := os.MkdirTemp(b.tmp, c+"-")
	if err != nil {
		return wideRun{}, err
	}
	defer os.RemoveAll(dir)
	sp := childSpec{
		Mode:       modeWide,
		Consumer:   c,
		Handler:    handlerNoop,
		Brokers:    b.broker.addrs,
		Topic:      topic,
		Partitions: parts,
		Want:       want,
		Group:      b.group(c + "-wide"),
		Dir:        dir,
		Timeout:    b.o.timeout,
		IdleWindow: idle,
		// -tidemark-flush-interval, as in the throughput runs.
		FlushInterval: b.o.flushInterval,
	}
	b.debugFiles(&sp, fmt.Sprintf("wide-%s-%dp-r%d", c, parts, round+1))
	if b.o.profileDir != "" && b.broker.fake != nil {
		// The in-process broker's side of the run: a run slower than its
		// CPU shows waited for this process.
		stop, err := profileSelf(filepath.Join(b.o.profileDir, fmt.Sprintf("wide-broker-%s-%dp-r%d.pprof", c, parts, round+1)))
		if err != nil {
			return wideRun{}, err
		}
		defer stop()
	}
	started := time.Now()
	res, err := b.child(ctx, sp, nil)
	if err != nil {
		return wideRun{}, err
	}
	if res.Messages != want {
		return wideRun{}, fmt.Errorf("%d of %d messages handled", res.Messages, want)
	}
	return wideRun{wall: res.LastAt.Sub(started), res: res}, nil
}

// wideCreateStep is the most partitions created in one request on a real
// broker: Kafka's KRaft controller refuses an operation of more than 10,000
// records ("excessively large batch operation"), one per partition.
const wideCreateStep = 5000

// createWideTopic creates topic with parts partitions; on a real broker, in
// steps of wideCreateStep (CreateTopics, then CreatePartitions), then waits
// until every partition has a leader.
func (b *broker) createWideTopic(ctx context.Context, topic string, parts int) error {
	if !b.real || parts <= wideCreateStep {
		return b.createTopic(ctx, topic, parts)
	}
	if err := b.createTopic(ctx, topic, wideCreateStep); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	for n := min(parts, 2*wideCreateStep); ; n = min(parts, n+wideCreateStep) {
		res, err := b.admin.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: int32(n)}}})
		if err == nil {
			err = res.Errors[topic]
		}
		if err != nil {
			return fmt.Errorf("growing topic %s to %d partitions: %w", topic, n, err)
		}
		if n == parts {
			break
		}
	}
	for {
		md, err := b.admin.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == parts {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				ready = ready && p.Error == nil && p.Leader.Port != 0
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: partitions without a leader: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readAll reads topic from its start until it has read want records,
// discarding them, in a group of its own that commits them: the broker's
// first read of the topic, and its first group (a coordinator from then
// on).
func (b *broker) readAll(ctx context.Context, topic string, want int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.ConsumerGroup(topic+"-warmup"), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for n := int64(0); n < want; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reading %s before the runs: %d of %d records: %w", topic, n, want, err)
		}
		n += int64(fs.NumRecords())
	}
	// In requests of 2,000 partitions: Kafka's coordinator refuses a
	// commit whose offsets pass __consumer_offsets' batch limit (1 MiB;
	// 10,000 partitions in one commit do), and franz-go sends one request.
	var chunk map[string]map[int32]kgo.EpochOffset
	n := 0
	send := func() error {
		if n == 0 {
			return nil
		}
		var cerr error
		cl.CommitOffsetsSync(ctx, chunk, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, res *kmsg.OffsetCommitResponse, err error) {
			cerr = err
			if res == nil {
				return
			}
			for _, t := range res.Topics {
				for _, p := range t.Partitions {
					if cerr == nil && p.ErrorCode != 0 {
						cerr = kerr.ErrorForCode(p.ErrorCode)
					}
				}
			}
		})
		chunk, n = nil, 0
		return cerr
	}
	for t, ps := range cl.UncommittedOffsets() {
		for p, o := range ps {
			if chunk == nil {
				chunk = map[string]map[int32]kgo.EpochOffset{}
			}
			if chunk[t] == nil {
				chunk[t] = map[int32]kgo.EpochOffset{}
			}
			chunk[t][p] = o
			if n++; n == 2000 {
				if err := send(); err != nil {
					return fmt.Errorf("committing the read of %s before the runs: %w", topic, err)
				}
			}
		}
	}
	if err := send(); err != nil {
		return fmt.Errorf("committing the read of %s before the runs: %w", topic, err)
	}
	return nil
}

// deleteCreated deletes every topic this run created so far.
func (b *broker) deleteCreated(ctx context.Context) error {
	for _, t := range slices.Clone(b.created) {
		if err := b.deleteTopic(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// deleteTopic deletes topic (kfake too: it holds every topic in memory).
func (b *broker) deleteTopic(ctx context.Context, topic string) error {
	res, err := b.admin.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("deleting %s: %w", topic, err)
	}
	b.created = slices.DeleteFunc(b.created, func(t string) bool { return t == topic })
	return nil
}

func wideMedian(rs []wideRun, f func(wideRun) float64) float64 {
	if len(rs) == 0 {
		return math.NaN()
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func wideWall(r wideRun) float64 { return r.wall.Seconds() }
func wideRSS(r wideRun) float64  { return mib(r.res.MaxRSS) }
func wideCPU(r wideRun) float64  { return r.res.CPUAtEnd.Seconds() }

// wideBroker is the broker's CPU over a run, NaN when unknown.
func wideBroker(r wideRun) float64 {
	if r.broker < 0 {
		return math.NaN()
	}
	return r.broker.Seconds()
}

// wideIdleRate is a run's idle fetch requests per second; NaN when not
// measured.
func wideIdleRate(r wideRun) float64 {
	if r.res.IdleWindow <= 0 {
		return math.NaN()
	}
	return float64(r.res.IdleRequests) / r.res.IdleWindow.Seconds()
}

func wideIdleCPU(r wideRun) float64 { return 100 * idleCores(r.res) }

// wideReport renders the section in a block of its own (markers
// bench:KEY:wide) that a run of this section alone replaces; standalone,
// the block starts with that run's command, machine and versions.
func (b *bench) wideReport(w *strings.Builder, standalone bool) {
	x := &b.wide
	if x.skip == "" && len(x.runs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	key := b.sectionKey()
	p("<!-- bench:%s:%s:begin (written by bench/, do not edit by hand) -->\n", key, sectionWide)
	p("### Wide topics: %s partitions\n\n", b.wideWidths())
	defer p("<!-- bench:%s:%s:end -->\n", key, sectionWide)
	if x.skip != "" {
		p("Not run: %s.\n\n", x.skip)
		return
	}
	if standalone {
		p("Written by a run of this section alone, which replaces only this part of the %s section:\n\n", key)
		b.runHeader(w)
		p("\n")
	}
	o := &b.o.wide
	p("The section took %s", x.took.Round(100*time.Millisecond))
	if oth := others(x.u0, x.u1); oth >= 0 && !standalone {
		p("; processes other than the benchmark kept **%.2f of %d CPUs** busy during it on average (load average %s at its start, %s at its end)",
			oth, runtime.NumCPU(), x.u0.loadavg, x.u1.loadavg)
		if d := disturbed(x.u0, x.u1); d != "" {
			p("; time no process's CPU shows: %s", d)
		}
	}
	p(".\n\n")
	var pre, warm []string
	for _, n := range o.partitions {
		pre = append(pre, fmt.Sprintf("%s for %s partitions", x.preload[n].Round(100*time.Millisecond), thousands(float64(n))))
		warm = append(warm, fmt.Sprintf("%s for %s", x.warm[n].Round(100*time.Millisecond), thousands(float64(n))))
	}
	p("One topic per width, each holding %s messages of %d B spread evenly over its partitions (uncompressed, producer batches of "+
		"at most %s bytes per partition; preload took %s; each topic deleted before the next is made; on a real broker a topic of more "+
		"than %s partitions is created in steps of that many, which Kafka's controller allows in one request). Before the runs, "+
		"each topic is read once, unmeasured, by a franz-go group consumer that commits (took %s): a real broker's first read "+
		"of many fresh partitions is far slower than the next, and its first consumer group creates the `__consumer_offsets` topic; "+
		"both would be charged to whichever consumer runs first. Each consumer in a child "+
		"process of its own, as a new user would write it: every value printed on a line through a `bufio.Writer` (its default "+
		"4 KiB buffer, under a mutex, to %s); tidemark at its Config defaults (`MaxBufferedBytes` 16 MiB), franz-go's `kgo` group "+
		"consumer with `AutoCommitMarks`, each partition's records of a poll handled in order and its last one marked, other "+
		"options default. **Time**: from just before the child process is started to its last message handled: the process "+
		"start, the group join and the fetching of the whole backlog; CPU over the same span (the child's own, "+
		"`getrusage`); **broker CPU**: the broker's over the child's whole life (kfake: this process; a single-node Kafka from "+
		"`scripts/kafka-local`: its JVM, from `/proc`; at the widest topic the idle window is included): on a 2-core machine "+
		"the broker's work for a consumer competes with the consumer for the CPUs; **peak RSS**: the child's `VmHWM` over its whole life. %d round(s), every consumer once per topic and "+
		"round in a rotated order; medians.\n\n",
		thousands(float64(o.messages)), o.size, thousands(float64(b.o.batchBytes)), strings.Join(pre, ", "), thousands(wideCreateStep), strings.Join(warm, ", "), os.DevNull, o.rounds)
	p("| partitions | consumer | time to the last message | msgs/s over it | CPU s | broker CPU s | peak RSS MiB | tidemark's time ÷ this | tidemark's peak RSS ÷ this |\n")
	p("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range o.partitions {
		tm := x.runs[n][consTidemark]
		for _, c := range x.cons {
			rs := x.runs[n][c]
			if len(rs) == 0 {
				continue
			}
			wall := wideMedian(rs, wideWall)
			tRatio, rRatio := "", ""
			if c != consTidemark && len(tm) > 0 {
				tRatio = fmt.Sprintf("**%.2fx**", wideMedian(tm, wideWall)/wall)
				rRatio = fmt.Sprintf("**%.2fx**", wideMedian(tm, wideRSS)/wideMedian(rs, wideRSS))
			}
			brokerCPU := "—"
			if v := wideMedian(rs, wideBroker); !math.IsNaN(v) {
				brokerCPU = fmt.Sprintf("%.2f", v)
			}
			p("| %s | %s | %.2f s | %s | %.2f | %s | %.0f | %s | %s |\n", thousands(float64(n)), c, wall,
				thousands(float64(rs[0].res.Messages)/wall), wideMedian(rs, wideCPU), brokerCPU, wideMedian(rs, wideRSS), tRatio, rRatio)
		}
	}
	p("\n")
	widest := b.widest()
	if o.idleWindow > 0 {
		p("**Idle, %s partitions.** After its last message the same child waits %s, then counts the fetch requests its consumer "+
			"sends over %s with nothing left to fetch (tidemark: `Stats().FetchRequests`; franz-go: a `kgo.HookBrokerWrite` "+
			"counting Fetch requests written), and its CPU time. %d broker(s) lead the topic's partitions. Each client at its "+
			"default fetch wait (tidemark `FetchMaxWait` 500 ms; franz-go `FetchMaxWait` 5 s), which the broker holds an empty "+
			"fetch for. Both keep incremental fetch sessions (KIP-227) where the broker has them (kfake and Kafka do): an idle "+
			"request lists no partition.\n\n",
			thousands(float64(widest)), wideSettle, o.idleWindow, max(x.leaders, 1))
		p("| consumer | idle fetch requests/s | per broker | idle CPU |\n|---|---:|---:|---:|\n")
		for _, c := range x.cons {
			rs := x.runs[widest][c]
			if len(rs) == 0 {
				continue
			}
			r := wideMedian(rs, wideIdleRate)
			p("| %s | %.2f | %.2f | %.1f%% |\n", c, r, r/float64(max(x.leaders, 1)), wideMedian(rs, wideIdleCPU))
		}
		p("\n")
	}
	b.wideTargets(w)
}

func (b *bench) wideWidths() string {
	var s []string
	for _, n := range b.o.wide.partitions {
		s = append(s, thousands(float64(n)))
	}
	return strings.Join(s, " and ")
}

// wideTargets checks issue 28's targets: tidemark's time <= 1.0x
// franz-go's at every width; at the widest, peak RSS <= 256 MiB with the
// default budget and <= 0.5x franz-go's.
func (b *bench) wideTargets(w *strings.Builder) {
	x := &b.wide
	var rows [][3]string
	check := func(target string, v float64, ok bool, measured string) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		verdict := "met"
		if !ok {
			verdict = "**missed**"
		}
		rows = append(rows, [3]string{target, measured, verdict})
	}
	for _, n := range b.o.wide.partitions {
		tm, fr := x.runs[n][consTidemark], x.runs[n][consFranz]
		if len(tm) == 0 || len(fr) == 0 {
			continue
		}
		t, f := wideMedian(tm, wideWall), wideMedian(fr, wideWall)
		check(fmt.Sprintf("%s partitions, %s messages of %d B: tidemark's time from process start to the last message <= 1.0x franz-go's",
			thousands(float64(n)), thousands(float64(b.o.wide.messages)), b.o.wide.size),
			t/f, t/f <= 1.0, fmt.Sprintf("%.2fx (%.2f s against %.2f s)", t/f, t, f))
	}
	n := b.widest()
	tm, fr := x.runs[n][consTidemark], x.runs[n][consFranz]
	if len(tm) > 0 {
		rss := wideMedian(tm, wideRSS)
		check(fmt.Sprintf("%s partitions, Config defaults: tidemark's peak RSS <= 256 MiB", thousands(float64(n))), rss, rss <= 256, fmt.Sprintf("%.0f MiB", rss))
		if len(fr) > 0 {
			f := wideMedian(fr, wideRSS)
			check(fmt.Sprintf("%s partitions: tidemark's peak RSS <= 0.5x franz-go's", thousands(float64(n))),
				rss/f, rss/f <= 0.5, fmt.Sprintf("%.2fx (%.0f MiB against %.0f MiB)", rss/f, rss, f))
		}
	}
	if len(rows) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("### Targets: wide topics (ratios from this run)\n\n| target | measured | |\n|---|---:|---|\n")
	for _, r := range rows {
		p("| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	p("\n")
}

// profileSelf writes a CPU profile of this process into path until stop.
func profileSelf(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
