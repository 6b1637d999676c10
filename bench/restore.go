package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// The restore section (issue 29): how fast a partition's state comes back
// from its changelog (Config.StateChangelog) when an instance starts
// without it, against tidemark's own consume rate of the same changelog
// topic. A TxHandler fills the changelog, putting every message of the
// topic under a key of its own (its offset), so that the changelog holds
// one record per message; then, in each round, a consumer of the same
// group starts on an empty offset file (Kafka's committed offset is past
// it, so every partition restores before it runs), and a no-op
// BatchHandler in a fresh group consumes the changelog topic itself.

// restoreOptions are the section's flags.
type restoreOptions struct {
	records int64
	size    int
	rounds  int
}

func registerRestoreFlags(fs *flag.FlagSet, r *restoreOptions) {
	fs.Int64Var(&r.records, "restore-records", 1_000_000, "messages of the restore section's topic, spread evenly over -partitions, each one changelog record (a key of its own)")
	fs.IntVar(&r.size, "restore-size", 100, "value size in bytes of the restore section's messages, and so of its state's values")
	fs.IntVar(&r.rounds, "restore-rounds", 3, "rounds of the restore section, each one restore and one consume of the changelog in a rotated order; tables show medians")
}

func (r *restoreOptions) validate(partitions int) error {
	switch {
	case r.records < int64(partitions):
		return fmt.Errorf("-restore-records %d: want at least one message per partition", r.records)
	case r.size < 1:
		return fmt.Errorf("-restore-size must be at least 1")
	case r.rounds < 1:
		return fmt.Errorf("-restore-rounds must be at least 1")
	}
	return nil
}

// The section's runs.
const (
	restoreRun = "restore" // an empty offset file restoring every partition
	consumeRun = "consume" // tidemark-batch, no-op, on the changelog topic
)

// restoreRuns is what the section measured.
type restoreRuns struct {
	topic, changelog string
	per              int64 // messages per partition
	preload          time.Duration
	fill             childResult
	fillWall         time.Duration
	logRecords       []int64 // the changelog's records at each consume run
	runs             map[string][]childResult
	took             time.Duration
	u0, u1           usage
}

func (b *bench) restorePhase(ctx context.Context) error {
	x, o, parts := &b.restore, &b.o.restore, b.o.partitions
	x.u0 = readUsage()
	start := time.Now()
	defer func() { x.took, x.u1 = time.Since(start), readUsage() }()
	x.per = o.records / int64(parts)
	x.topic = fmt.Sprintf("tidemark-bench-%s-restore-%dB", b.runID, o.size)
	t0 := time.Now()
	if err := b.broker.createTopic(ctx, x.topic, parts); err != nil {
		return err
	}
	if err := b.prod.preload(ctx, b.broker, x.topic, parts, x.per, o.size, x.per, nil); err != nil {
		return err
	}
	x.preload = time.Since(t0)

	group := b.group("restore")
	x.changelog = x.topic + "-state-" + group // tidemark-txlog's StateChangelog suffix
	dir, err := os.MkdirTemp(b.tmp, "restore-fill-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sp := b.restoreSpec(group, dir, false)
	sp.Want = x.per * int64(parts)
	t0 = time.Now()
	if x.fill, err = b.child(ctx, sp, nil); err != nil {
		return fmt.Errorf("restore: filling the changelog: %w", err)
	}
	x.fillWall = time.Since(t0)
	b.logf("restore: %s filled its changelog %s with %d records: %.0f msgs/s handled, %s in all", x.topic, x.changelog,
		x.fill.Messages, rate(x.fill), x.fillWall.Round(time.Millisecond))

	x.runs = map[string][]childResult{}
	for r := 0; r < o.rounds; r++ {
		for _, run := range rotate([]string{restoreRun, consumeRun}, r) {
			var res childResult
			if run == restoreRun {
				res, err = b.restoreOnce(ctx, group, r)
			} else {
				res, err = b.consumeChangelog(ctx, r)
			}
			if err != nil {
				return fmt.Errorf("restore round %d, %s: %w", r+1, run, err)
			}
			x.runs[run] = append(x.runs[run], res)
			durable := ""
			if run == restoreRun {
				durable = fmt.Sprintf(" (durable after %s)", res.RestoreDurable.Round(time.Millisecond))
			}
			b.logf("restore round %d/%d %-7s %10.0f records/s  %d records in %s%s  %6.2f CPU s/M  %5.0f MiB RSS",
				r+1, o.rounds, run, rate(res), res.Messages, res.Window.Round(time.Millisecond), durable, cpuPerM(res), mib(res.MaxRSS))
		}
	}
	return nil
}

// restoreSpec is the spec of the section's tidemark-txlog child in group,
// with its offset file in dir.
func (b *bench) restoreSpec(group, dir string, restore bool) childSpec {
	x := &b.restore
	return childSpec{
		Mode:          modeRestore,
		Consumer:      consTidemarkTxLog,
		Handler:       handlerNoop,
		Brokers:       b.broker.addrs,
		Topic:         x.topic,
		Partitions:    b.o.partitions,
		PerPartition:  x.per,
		Group:         group,
		Dir:           dir,
		Timeout:       b.o.timeout,
		FlushInterval: b.o.flushInterval,
		Restore:       restore,
	}
}

func (b *bench) restoreOnce(ctx context.Context, group string, round int) (childResult, error) {
	dir, err := os.MkdirTemp(b.tmp, "restore-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	sp := b.restoreSpec(group, dir, true)
	b.debugFiles(&sp, fmt.Sprintf("restore-r%d", round+1))
	if b.o.logDir != "" {
		sp.LogFile = filepath.Join(b.o.logDir, fmt.Sprintf("restore-r%d.log", round+1))
	}
	res, err := b.child(ctx, sp, nil)
	if err == nil && res.StateKeys != b.restore.per*int64(b.o.partitions) {
		err = fmt.Errorf("%d keys restored, want %d", res.StateKeys, b.restore.per*int64(b.o.partitions))
	}
	return res, err
}

// consumeChangelog runs the main tables' tidemark-batch child, no-op, on
// the whole changelog topic (its markers too), from a fresh group.
func (b *bench) consumeChangelog(ctx context.Context, round int) (childResult, error) {
	x := &b.restore
	n, err := b.broker.records(ctx, x.changelog, b.o.partitions)
	if err != nil {
		return childResult{}, err
	}
	x.logRecords = append(x.logRecords, n)
	dir, err := os.MkdirTemp(b.tmp, "restore-consume-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	sp := childSpec{
		Mode:          modeThroughput,
		Consumer:      consTidemarkBatch,
		Handler:       handlerNoop,
		Brokers:       b.broker.addrs,
		Topic:         x.changelog,
		Partitions:    b.o.partitions,
		Want:          n,
		FlushInterval: b.o.flushInterval,
		Group:         b.group("restore-consume"),
		Dir:           dir,
		Timeout:       b.o.timeout,
	}
	b.debugFiles(&sp, fmt.Sprintf("restore-consume-r%d", round+1))
	return b.child(ctx, sp, nil)
}

// records is the sum of topic's log ends (every partition starts at 0).
func (b *broker) records(ctx context.Context, topic string, partitions int) (int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for i := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(i), kafka.LastOffsetOf(i))
	}
	res, err := b.admin.ListOffsets(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("listing the ends of %s: %w", topic, err)
	}
	if len(res.Topics[topic]) != partitions {
		return 0, fmt.Errorf("%s: %d partitions listed, want %d", topic, len(res.Topics[topic]), partitions)
	}
	var n int64
	for _, po := range res.Topics[topic] {
		switch {
		case po.Error != nil:
			return 0, fmt.Errorf("%s/%d: %w", topic, po.Partition, po.Error)
		case po.FirstOffset != 0:
			return 0, fmt.Errorf("%s/%d starts at %d: the consume run checks every offset from 0", topic, po.Partition, po.FirstOffset)
		}
		n += po.LastOffset
	}
	return n, nil
}

// restoreReport renders the section, in a block of its own (markers
// bench:KEY:restore) that a run of this section alone replaces.
func (b *bench) restoreReport(w *strings.Builder, standalone bool) {
	x := &b.restore
	if len(x.runs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	key := b.sectionKey()
	p("<!-- bench:%s:%s:begin (written by bench/, do not edit by hand) -->\n", key, sectionRestore)
	defer p("<!-- bench:%s:%s:end -->\n", key, sectionRestore)
	p("### State restore from a changelog (tidemark)\n\n")
	if standalone {
		p("Written by a run of this section alone, which replaces only this part of the %s section:\n\n", key)
		b.runHeader(w)
		p("\n")
	}
	o, parts := &b.o.restore, b.o.partitions
	p("The section took %s", x.took.Round(100*time.Millisecond))
	if oth := others(x.u0, x.u1); oth >= 0 && !standalone {
		p("; processes other than the benchmark kept **%.2f of %d CPUs** busy during it on average (load average %s at its start, %s at its end)",
			oth, runtime.NumCPU(), x.u0.loadavg, x.u1.loadavg)
		if d := disturbed(x.u0, x.u1); d != "" {
			p("; time no process's CPU shows: %s", d)
		}
	}
	p(".\n\n")
	p("**Data.** A topic of %d partitions holding %s messages of %d B (preload took %s). A `TxHandler` with "+
		"`Config.StateChangelog` puts each message's value under a key of its own (its offset), so its partition's changelog "+
		"holds one record per message: %s records, filled in %s from the child's start to Kafka's commit covering every "+
		"message (%s msgs/s handled).\n\n",
		parts, thousands(float64(x.per*int64(parts))), o.size, x.preload.Round(10*time.Millisecond),
		thousands(float64(x.fill.Messages)), x.fillWall.Round(10*time.Millisecond), thousands(rate(x.fill)))
	p("**Runs.** *restore*: the same consumer, in the same group, starts on an empty offset file; Kafka's committed offset is "+
		"past the file, so every partition reads its changelog up to its end, applies it (fencing each owner's records by its "+
		"marker), writes and fsyncs the state, and only then runs. Timed from the group's assignment (`Stats().Generation`) to "+
		"every partition running: a partition runs on its restored state as soon as it is applied, and the file writes it in the "+
		"background, before any later change (*durable after*: to every partition's restored state durable, `Stats().Durable`); "+
		"records are `Stats().RestoreTotal` summed; the child then counts every partition's keys "+
		"through `ViewState` and the run fails unless there is one per message. *consume*: the main tables' `tidemark-batch` "+
		"consumer (a no-op `BatchHandler`) in a fresh group on the changelog topic itself, from its first offset to its end "+
		"(the owners' markers included), timed from the assignment or its first record to its last. %d round(s), the two runs "+
		"in a rotated order; medians and the [min-max] of records/s.\n\n", o.rounds)
	p("| run | records | records/s [min-max] | time | durable after | CPU s per 1M records | allocs/record | peak RSS MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range []string{restoreRun, consumeRun} {
		rs := x.runs[run]
		if len(rs) == 0 {
			continue
		}
		r := median(rs, rate)
		lo, hi := minMax(rs, rate)
		durable := ""
		if run == restoreRun {
			durable = fmt.Sprintf("%.2f s", median(rs, func(r childResult) float64 { return r.RestoreDurable.Seconds() }))
		}
		p("| %s | %s | %s [%s-%s] | %.2f s | %s | %.2f | %.2f | %.0f |\n", run, thousands(median(rs, func(r childResult) float64 { return float64(r.Messages) })),
			thousands(r), thousands(lo), thousands(hi), median(rs, func(r childResult) float64 { return r.Window.Seconds() }), durable,
			median(rs, cpuPerM), median(rs, func(r childResult) float64 { return perMsg(float64(r.Mallocs), r) }),
			median(rs, func(r childResult) float64 { return mib(r.MaxRSS) }))
	}
	p("\n")
	b.restoreTargets(w)
}

// restoreTargets checks issue 29's restore target: restore at >= 0.5x
// tidemark's own consume rate of the changelog topic.
func (b *bench) restoreTargets(w *strings.Builder) {
	x := &b.restore
	rs, cs := x.runs[restoreRun], x.runs[consumeRun]
	if len(rs) == 0 || len(cs) == 0 {
		return
	}
	r, c := median(rs, rate), median(cs, rate)
	v := r / c
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	verdict := "met"
	if v < 0.5 {
		verdict = "**missed**"
	}
	var per []float64
	for i := range min(len(rs), len(cs)) {
		per = append(per, rate(rs[i])/rate(cs[i]))
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("### Targets: state restore (ratios from this run)\n\n| target | measured | |\n|---|---:|---|\n")
	p("| a partition's state restored from its changelog at >= 0.5x tidemark's own consume rate of the changelog topic (records/s); %s records | %.2fx (%s against %s records/s; within each round: median %.2fx; the restore took %.2f s) | %s |\n\n",
		thousands(median(rs, func(r childResult) float64 { return float64(r.Messages) })), v, thousands(r), thousands(c),
		medianOf(per), median(rs, func(r childResult) float64 { return r.Window.Seconds() }), verdict)
}
