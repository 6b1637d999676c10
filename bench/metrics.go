package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// The metrics section: what package metrics costs. A scrape run: tidemark
// on a topic of many partitions (1,000), idle once its small backlog is
// handled, with metrics.Handler scraped back to back in its process: the
// CPU of one scrape beyond the idle consumer's own, as a share of a CPU at
// one scrape per second, and the exposition's size. Then the no-op
// throughput runs of the main tables, with and without metrics (a
// Collector registered, so every Handler call is timed, and scraped every
// second), alternating.

// metricsValueSize is the section's value size: the main tables' smaller
// one, whose topic it reuses.
const metricsValueSize = 100

// metricsRuns is what the section measured.
type metricsRuns struct {
	scrape      *childResult
	scrapeTopic string
	// The throughput runs, without (off) and with (on) metrics.
	topic   string
	per     int64
	own     bool // preloaded by the section
	preload time.Duration
	off, on []childResult
	took    time.Duration
}

func (b *bench) metricsPhase(ctx context.Context) error {
	m := &b.met
	if !contains(b.o.consumers, consTidemark) {
		return nil
	}
	start := time.Now()
	defer func() { m.took = time.Since(start) }()
	if parts := b.o.metricsPartitions; parts > 0 {
		per := b.o.metricsPerPart
		m.scrapeTopic = fmt.Sprintf("tidemark-bench-%s-metrics-%dp", b.runID, parts)
		if err := b.broker.createTopic(ctx, m.scrapeTopic, parts); err != nil {
			return err
		}
		if err := b.prod.preload(ctx, b.broker, m.scrapeTopic, parts, per, metricsValueSize, per, nil); err != nil {
			return err
		}
		dir, err := os.MkdirTemp(b.tmp, "scrape-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		sp := childSpec{
			Mode:       modeScrape,
			Consumer:   consTidemark,
			Handler:    handlerNoop,
			Brokers:    b.broker.addrs,
			Topic:      m.scrapeTopic,
			Partitions: parts,
			Want:       int64(parts) * per,
			Group:      b.group("metrics-scrape"),
			Dir:        dir,
			Timeout:    b.o.timeout,
			IdleWindow: b.o.metricsIdleWindow,
			Scrapes:    b.o.metricsScrapes,
		}
		b.debugFiles(&sp, fmt.Sprintf("metrics-scrape-%dp", parts))
		res, err := b.child(ctx, sp, nil)
		if err != nil {
			return fmt.Errorf("metrics section, scrape run: %w", err)
		}
		m.scrape = &res
		b.logf("metrics %d partitions: %d series, %s B (%s B gzip) a scrape; %d scrapes took %s of CPU in %s, the idle consumer %.2f%% of a CPU: "+
			"%s of CPU a scrape beyond it, %.2f%% of a CPU at one scrape per second",
			parts, res.Series, thousands(float64(res.ScrapeBytes)), thousands(float64(res.ScrapeGzipBytes)), res.Scrapes,
			res.ScrapeCPU.Round(time.Millisecond), res.ScrapeWall.Round(time.Millisecond), 100*idleCores(res),
			scrapeCost(res).Round(10*time.Microsecond), 100*scrapeCost(res).Seconds())
	}
	if b.o.metricsRounds == 0 {
		return nil
	}
	if t, ok := b.topics[metricsValueSize]; ok {
		m.topic, m.per = t, b.perPartition()
	} else {
		m.per = b.o.metricsMessages / int64(b.o.partitions)
		m.topic, m.own = fmt.Sprintf("tidemark-bench-%s-metrics-%dB", b.runID, metricsValueSize), true
		t0 := time.Now()
		if err := b.broker.createTopic(ctx, m.topic, b.o.partitions); err != nil {
			return err
		}
		if err := b.prod.preload(ctx, b.broker, m.topic, b.o.partitions, m.per, metricsValueSize, m.per, nil); err != nil {
			return err
		}
		m.preload = time.Since(t0)
		b.logf("preloaded %s: %d x %d messages of %d bytes in %s", m.topic, b.o.partitions, m.per, metricsValueSize, m.preload.Round(time.Millisecond))
	}
	for r := 0; r < b.o.metricsRounds; r++ {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, with := range order {
			res, err := b.metricsRun(ctx, r, with)
			if err != nil {
				return fmt.Errorf("metrics round %d, metrics %v: %w", r+1, with, err)
			}
			label := "without metrics"
			if with {
				m.on = append(m.on, res)
				label = fmt.Sprintf("with metrics (%d scrapes)", res.MetricsScrapes)
			} else {
				m.off = append(m.off, res)
			}
			b.logf("metrics round %d/%d no-op %-27s %9.0f msgs/s  %6.2f CPU s/M  (%d msgs in %s)",
				r+1, b.o.metricsRounds, label, rate(res), cpuPerM(res), res.Messages, res.Window.Round(time.Millisecond))
		}
	}
	return nil
}

func (b *bench) metricsRun(ctx context.Context, round int, with bool) (childResult, error) {
	dir, err := os.MkdirTemp(b.tmp, "metrics-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	name := "off"
	if with {
		name = "on"
	}
	sp := childSpec{
		Mode:          modeThroughput,
		Consumer:      consTidemark,
		Handler:       handlerNoop,
		Brokers:       b.broker.addrs,
		Topic:         b.met.topic,
		Partitions:    b.o.partitions,
		Want:          b.met.per * int64(b.o.partitions),
		MaxWindow:     b.o.maxWindow,
		FlushInterval: b.o.flushInterval,
		Group:         b.group("metrics-" + name),
		Dir:           dir,
		Timeout:       b.o.timeout,
		Metrics:       with,
	}
	b.debugFiles(&sp, fmt.Sprintf("metrics-%s-r%d", name, round+1))
	return b.child(ctx, sp, nil)
}

// scrapeCost is the CPU one scrape of the scrape run cost beyond the idle
// consumer's own.
func scrapeCost(r childResult) time.Duration {
	if r.Scrapes == 0 {
		return 0
	}
	own := time.Duration(idleCores(r) * float64(r.ScrapeWall))
	return max(r.ScrapeCPU-own, 0) / time.Duration(r.Scrapes)
}

// metricsReport renders the section.
func (b *bench) metricsReport(w *strings.Builder) {
	m := &b.met
	if m.scrape == nil && len(m.off) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("### Metrics (tidemark)\n\n")
	p("What package `metrics` costs. The section took %s.\n\n", m.took.Round(100*time.Millisecond))
	if r := m.scrape; r != nil {
		p("**Scrapes.** tidemark alone in a child process, Config defaults, on a topic of %s partitions x %d messages of %d B; once it "+
			"has handled them and every partition is idle (every position known, so every series is there), the child measures its own "+
			"CPU over %s without scrapes (the idle consumer: its fetch loop long-polling every partition), then serves %d scrapes of "+
			"`metrics.Handler` back to back, in process (`httptest`), each asked as Prometheus 3 asks (its `Accept` header, "+
			"`Accept-Encoding: gzip`). A scrape's cost is the CPU of those scrapes minus the idle consumer's CPU over their wall time, "+
			"divided by the scrapes; at one scrape per second that cost per second is the share of a CPU. The exposition is counted once "+
			"more, uncompressed.\n\n",
			thousands(float64(b.o.metricsPartitions)), b.o.metricsPerPart, metricsValueSize, b.o.metricsIdleWindow, r.Scrapes)
		p("| partitions | series | exposition | gzip | scrapes: CPU / wall | idle consumer | CPU a scrape, beyond the idle consumer | share of a CPU at one scrape per second |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		p("| %s | %s | %s B | %s B | %s / %s | %.2f%% of a CPU | %s | **%.2f%%** |\n\n", thousands(float64(b.o.metricsPartitions)),
			thousands(float64(r.Series)), thousands(float64(r.ScrapeBytes)), thousands(float64(r.ScrapeGzipBytes)),
			r.ScrapeCPU.Round(time.Millisecond), r.ScrapeWall.Round(time.Millisecond), 100*idleCores(*r),
			scrapeCost(*r).Round(10*time.Microsecond), 100*scrapeCost(*r).Seconds())
	}
	if len(m.off) > 0 {
		data := fmt.Sprintf("the main tables' %d B topic (%d partitions x %s messages)", metricsValueSize, b.o.partitions, thousands(float64(m.per)))
		if m.own {
			data = fmt.Sprintf("a topic of %d partitions x %s messages of %d B, as the main tables' (preload took %s)",
				b.o.partitions, thousands(float64(m.per)), metricsValueSize, m.preload.Round(10*time.Millisecond))
		}
		p("**No-op throughput with metrics.** The main tables' tidemark run (no-op handler, Config defaults, a fresh group from the first "+
			"offset, a child process per run) on %s, without metrics and with them: `metrics.Handler` built before `Run` (so every "+
			"Handler call is timed: `MeasureHandlerLatency`) and scraped in process when the window starts, then every second. %d round(s), "+
			"alternating which goes first; medians and the [min-max] of msgs/s.\n\n", data, len(m.off))
		p("| tidemark, no-op | msgs/s [min-max] | CPU s per 1M msgs | scrapes a run |\n|---|---:|---:|---:|\n")
		for _, row := range []struct {
			label string
			rs    []childResult
		}{{"without metrics", m.off}, {"with metrics, scraped every second", m.on}} {
			lo, hi := minMax(row.rs, rate)
			p("| %s | %s [%s-%s] | %.2f | %s |\n", row.label, thousands(median(row.rs, rate)), thousands(lo), thousands(hi), median(row.rs, cpuPerM),
				thousands(median(row.rs, func(r childResult) float64 { return float64(r.MetricsScrapes) })))
		}
		p("\n")
	}
	b.metricsTargets(w)
}

// metricsTargets checks issue 12's targets against this run's figures.
func (b *bench) metricsTargets(w *strings.Builder) {
	m := &b.met
	var rows [][3]string
	add := func(target, measured string, ok bool) {
		verdict := "met"
		if !ok {
			verdict = "**missed**"
		}
		rows = append(rows, [3]string{target, measured, verdict})
	}
	if r := m.scrape; r != nil {
		c := scrapeCost(*r)
		add(fmt.Sprintf("scraping `/metrics` every second with %s partitions costs < 1%% of a CPU", thousands(float64(b.o.metricsPartitions))),
			fmt.Sprintf("%.2f%% (%s of CPU a scrape)", 100*c.Seconds(), c.Round(10*time.Microsecond)), c < 10*time.Millisecond)
	}
	if len(m.off) > 0 && len(m.on) > 0 {
		on, off := median(m.on, rate), median(m.off, rate)
		onLo, onHi := minMax(m.on, rate)
		offLo, offHi := minMax(m.off, rate)
		v := on / off
		add("the no-op benchmark does not move with metrics registered: msgs/s with ÷ without >= 0.95, or the [min-max] ranges overlap",
			fmt.Sprintf("%.2fx (%s [%s-%s] vs %s [%s-%s])", v, thousands(on), thousands(onLo), thousands(onHi), thousands(off), thousands(offLo), thousands(offHi)),
			v >= 0.95 || (onHi >= offLo && onLo <= offHi))
		con, coff := median(m.on, cpuPerM), median(m.off, cpuPerM)
		cLo, cHi := minMax(m.on, cpuPerM)
		oLo, oHi := minMax(m.off, cpuPerM)
		cv := con / coff
		add("... and CPU per message with ÷ without <= 1.05, or the [min-max] ranges overlap",
			fmt.Sprintf("%.2fx (%.2f [%.2f-%.2f] vs %.2f [%.2f-%.2f] CPU s per 1M msgs)", cv, con, cLo, cHi, coff, oLo, oHi),
			cv <= 1.05 || (cHi >= oLo && cLo <= oHi))
	}
	if len(rows) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("### Targets: metrics (from this run)\n\n| target | measured | |\n|---|---:|---|\n")
	for _, r := range rows {
		p("| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	p("\n")
}
