package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// The bounded replay section: tidemark's Config.MaxUndurable, the messages
// per partition handled and not yet durable in the offset file (what a
// SIGKILL makes the consumer handle again), against msgs/s, CPU and the
// offset file's writes. OrderPartition, offsets fsync-ed, on the main
// tables' 100 B topic (preloaded here when they did not run).

const (
	// replayValueSize is the section's value size: the main tables'
	// smaller one, whose topic it reuses.
	replayValueSize = 100
	// defaultMaxUndurable is framework.Config.MaxUndurable's default.
	defaultMaxUndurable = 100_000
	// defaultFlushInterval is framework.Config.FlushInterval's default.
	defaultFlushInterval = 5 * time.Millisecond
)

// replayHandlerOrder is the order of the section's handler modes.
var replayHandlerOrder = []string{handlerNoop, handlerSleep}

type replayKey struct {
	handler string
	value   int // Config.MaxUndurable; 0: the default
}

// replayRuns is what the section measured.
type replayRuns struct {
	topic   string
	per     int64 // messages per partition
	own     bool  // preloaded by the section (the main tables did not run)
	preload time.Duration
	runs    map[replayKey][]childResult
	took    time.Duration // the whole section, preload included
}

// parseReplayValues parses -replay-max-undurable: distinct values, at
// least 0 (the default), in the given order.
func parseReplayValues(s string) ([]int, error) {
	vs, err := parseInts(s)
	if err != nil {
		return nil, err
	}
	var out []int
	seen := map[int]bool{}
	for _, v := range vs {
		if v < 0 {
			return nil, fmt.Errorf("%d: must not be negative (0: the default)", v)
		}
		if v == defaultMaxUndurable {
			v = 0
		}
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out, nil
}

// undurable is v with the default filled in.
func undurable(v int) int {
	if v == 0 {
		return defaultMaxUndurable
	}
	return v
}

func (b *bench) replayPhase(ctx context.Context) error {
	c := &b.replay
	if !contains(b.o.consumers, consTidemark) || len(b.o.replayHandlers) == 0 || len(b.o.replayValues) == 0 {
		return nil
	}
	start := time.Now()
	defer func() { c.took = time.Since(start) }()
	c.per = b.perPartition()
	if t, ok := b.topics[replayValueSize]; ok {
		c.topic = t
	} else {
		c.topic, c.own = fmt.Sprintf("tidemark-bench-%s-replay-%dB", b.runID, replayValueSize), true
		if err := b.broker.createTopic(ctx, c.topic, b.o.partitions); err != nil {
			return err
		}
		if err := b.prod.preload(ctx, b.broker, c.topic, b.o.partitions, c.per, replayValueSize, c.per, nil); err != nil {
			return err
		}
		c.preload = time.Since(start)
		b.logf("preloaded %s: %d x %d messages of %d bytes in %s", c.topic, b.o.partitions, c.per, replayValueSize, c.preload.Round(time.Millisecond))
	}
	c.runs = map[replayKey][]childResult{}
	n := len(b.o.replayValues)
	for r := 0; r < b.o.replayRounds; r++ {
		for _, h := range b.o.replayHandlers {
			for i := range n {
				v := b.o.replayValues[(i+r)%n]
				res, err := b.replayRun(ctx, r, h, v)
				if err != nil {
					return fmt.Errorf("replay round %d, %s, MaxUndurable %d: %w", r+1, h, undurable(v), err)
				}
				k := replayKey{h, v}
				c.runs[k] = append(c.runs[k], res)
				b.logf("replay round %d/%d %-8s MaxUndurable %-7d %9.0f msgs/s  %6.2f CPU s/M  %6.0f writes/s  (%d msgs in %s)",
					r+1, b.o.replayRounds, h, undurable(v), rate(res), cpuPerM(res), writesPerSec(res), res.Messages, res.Window.Round(time.Millisecond))
			}
		}
	}
	return nil
}

func (b *bench) replayRun(ctx context.Context, round int, h string, v int) (childResult, error) {
	dir, err := os.MkdirTemp(b.tmp, "replay-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	sp := childSpec{
		Mode:          modeThroughput,
		Consumer:      consTidemark,
		Handler:       h,
		Brokers:       b.broker.addrs,
		Topic:         b.replay.topic,
		Partitions:    b.o.partitions,
		Want:          b.replay.per * int64(b.o.partitions),
		MaxWindow:     b.o.replayWindow,
		FlushInterval: b.o.flushInterval,
		Group:         b.group("replay-" + strconv.Itoa(undurable(v))),
		Dir:           dir,
		Timeout:       b.o.timeout,
		MaxUndurable:  v,
		CountWrites:   true,
	}
	b.debugFiles(&sp, fmt.Sprintf("replay-%d-%s-r%d", undurable(v), h, round+1))
	return b.child(ctx, sp, nil)
}

// writesPerSec is a run's offset-file flushes per second over its
// window; NaN when not counted.
func writesPerSec(r childResult) float64 {
	if r.FileWrites < 0 || r.Window <= 0 {
		return math.NaN()
	}
	return float64(r.FileWrites) / r.Window.Seconds()
}

// msgsPerWrite is a run's messages handled per offset-file flush;
// NaN when not counted.
func msgsPerWrite(r childResult) float64 {
	if r.FileWrites <= 0 {
		return math.NaN()
	}
	return float64(r.Messages) / float64(r.FileWrites)
}

// smallRatioText is ratioText, with two significant digits below 0.1
// (MaxUndurable 1 may run hundreds of times slower than the default).
func smallRatioText(v float64) string {
	if v <= 0 || v >= 0.1 || math.IsNaN(v) {
		return ratioText(v)
	}
	return fmt.Sprintf("%.*f", 1-int(math.Floor(math.Log10(v))), v)
}

// counted keeps the runs with more than least offset-file writes counted.
func counted(rs []childResult, least int64) []childResult {
	var out []childResult
	for _, r := range rs {
		if r.FileWrites > least {
			out = append(out, r)
		}
	}
	return out
}

// replayReport renders the section's block; standalone, with the run's
// header, for a run of standalone sections alone.
func (b *bench) replayReport(w *strings.Builder, standalone bool) {
	c := &b.replay
	if len(c.runs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	key := b.sectionKey()
	p("<!-- bench:%s:%s:begin (written by bench/, do not edit by hand) -->\n", key, sectionReplay)
	defer p("<!-- bench:%s:%s:end -->\n", key, sectionReplay)
	data := fmt.Sprintf("the main tables' %d B topic (%d partitions x %s messages)", replayValueSize, b.o.partitions, thousands(float64(c.per)))
	if c.own {
		data = fmt.Sprintf("a topic of %d partitions x %s messages of %d B, as the main tables' (preload took %s)",
			b.o.partitions, thousands(float64(c.per)), replayValueSize, c.preload.Round(10*time.Millisecond))
	}
	flush := fmt.Sprintf("%s, its default", defaultFlushInterval)
	switch {
	case b.o.flushInterval < 0:
		flush = "negative: a write as soon as updates are pending"
	case b.o.flushInterval > 0:
		flush = b.o.flushInterval.String()
	}
	p("### Bounded replay (tidemark)\n\n")
	if standalone {
		p("Written by a run of this section alone, which replaces only this part of the %s section:\n\n", key)
		b.runHeader(w)
		p("\n")
	}
	p("`Config.MaxUndurable` bounds, per partition, the messages handled and not yet durable in the offset file: what a SIGKILL "+
		"makes the consumer handle again. A partition that reaches it waits for the offset file before it handles its next message. "+
		"tidemark alone on %s, a child process per run as everywhere in this benchmark, a fresh group from the first offset, "+
		"Config defaults (`OrderPartition`, offsets fsync-ed: not `NoSync`; `FlushInterval` %s) but `MaxUndurable` as the row says; "+
		"handlers no-op or a 1 ms sleep per message, each checking that every partition's offsets follow each other. A run ends once "+
		"it handled the whole topic or %s after its window started (`-replay-window`); msgs/s and CPU are over that window, "+
		"as in the main tables. %d round(s) (`-replay-rounds`), the values of a handler in an order rotated each round; medians and "+
		"the [min-max] of msgs/s. The section took %s.\n\n",
		data, flush, b.o.replayWindow, b.o.replayRounds, c.took.Round(time.Second))
	p("Replay bound: `MaxUndurable` x %d partitions, the most messages one SIGKILL makes the consumer handle again. "+
		"Offset-file writes/s: the offset file's flushes per second over the window (`Stats().FlushLatency.Count` at its start "+
		"and end), each one write that folds every partition's pending watermark (group commit): an append to the journal, "+
		"which a SIGKILL leaves, or a checkpoint, one fsync-ed transaction at most every `SyncInterval` (1 s). With `MaxUndurable` 1 "+
		"each message waits for a write before the next one of its partition: it costs about one write (and the `FlushInterval` "+
		"between two writes) per message per partition, so the messages per write are at most the partitions.\n\n", b.o.partitions)
	p("| handler | `MaxUndurable` | replay bound (msgs per SIGKILL, at most) | msgs/s [min-max] | msgs/s ÷ the default's | CPU s per 1M msgs | offset-file writes/s | msgs per write |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, h := range b.o.replayHandlers {
		base := c.runs[replayKey{h, 0}]
		for _, v := range b.o.replayValues {
			rs := c.runs[replayKey{h, v}]
			if len(rs) == 0 {
				continue
			}
			r := median(rs, rate)
			lo, hi := minMax(rs, rate)
			name := thousands(float64(undurable(v)))
			if v == 0 {
				name += " (the default)"
			}
			if n := len(rs); n < b.o.replayRounds {
				name += fmt.Sprintf(" (%d runs)", n)
			}
			ratio := "—"
			switch {
			case v == 0:
				ratio = "1"
			case len(base) > 0:
				ratio = fmt.Sprintf("**%sx**", smallRatioText(r/median(base, rate)))
			}
			writes, per := "—", "—"
			if cs := counted(rs, -1); len(cs) > 0 {
				writes = thousands(median(cs, writesPerSec))
			}
			if cs := counted(rs, 0); len(cs) > 0 {
				per = fmt.Sprintf("%.1f", median(cs, msgsPerWrite))
				if m := median(cs, msgsPerWrite); m >= 100 {
					per = thousands(m)
				}
			}
			p("| %s | %s | %s | %s [%s-%s] | %s | %.2f | %s | %s |\n", handlerName(h), name, thousands(float64(undurable(v)*b.o.partitions)),
				thousands(r), thousands(lo), thousands(hi), ratio, median(rs, cpuPerM), writes, per)
		}
	}
	p("\n")
}
