package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// report renders this run as a markdown section: the command, the machine,
// one table per value size and handler, the targets, the startup phase.
func (b *bench) report() string {
	var w strings.Builder
	if b.standalone() {
		for _, sec := range b.o.sections {
			w.WriteString(b.standaloneBlock(sec))
		}
		return w.String()
	}
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	key := b.sectionKey()
	p("<!-- bench:%s:begin (written by bench/, do not edit by hand) -->\n", key)
	p("%s\n\n", b.heading())
	b.runHeader(&w)
	if len(b.o.sizes) > 0 && b.o.runs(sectionThroughput) {
		p("- Data: %d partitions x %s messages per value size (%s), uncompressed, producer batches of at most %s bytes per partition; preload took %s.\n",
			b.o.partitions, thousands(float64(b.perPartition())), b.sizesText(), thousands(float64(b.o.batchBytes)), b.preloadText())
		p("- Each throughput run: a fresh consumer group from the first offset, in a child process; msgs/s from the first message handled to the last (join and shutdown excluded), ")
		if b.o.maxWindow > 0 {
			p("or to %s after the first message (%s with the 1 ms sleep handler) if the consumer is slower than that (its msgs/s is over what it handled). ", b.o.maxWindow, b.o.sleepWindow)
		}
		p("%d round(s), every consumer once per round in a rotated order; the tables show medians and the [min-max] of msgs/s.\n", b.o.rounds)
	}
	if b.o.flushInterval > 0 {
		p("- tidemark ran with `Config.FlushInterval: %s` (not its default) in the throughput, latency and concurrency runs.\n", b.o.flushInterval)
	}
	if len(b.latRate) > 0 {
		p("- Latency runs: %d round(s), %d B values on a fresh topic, produced at a fixed rate for %s (", b.latencyRounds(), b.latSize, b.o.latencyDuration)
		first := true
		for _, h := range b.o.handlers {
			if !first {
				p(", ")
			}
			first = false
			p("%s: %s msgs/s", h, thousands(b.latRate[h]))
		}
		if b.o.latencyRate > 0 {
			p(", set by -latency-rate")
		} else {
			p(": half the slowest peer's median msgs/s with that handler")
		}
		p("); latency from the producer's send time (in the value) to the handler call; \"CPU at that rate\" is the consumer's CPU over those %s, in %% of one CPU.\n", b.o.latencyDuration)
	}
	p("\n")

	if len(b.tput) > 0 {
		for _, size := range b.o.sizes {
			for _, h := range b.o.handlers {
				b.table(&w, size, h)
			}
		}
	}
	b.targets(&w)
	b.startupTable(&w)
	b.concurrencyReport(&w)
	b.replayReport(&w, false)
	b.metricsReport(&w)
	b.transactionsReport(&w, false)
	b.leaderMovesReport(&w, false)
	b.rebalanceReport(&w, false)
	b.wideReport(&w, false)
	b.restoreReport(&w, false)
	if len(b.notes) > 0 {
		p("Notes from the run:\n\n")
		for _, n := range b.notes {
			p("- %s\n", n)
		}
		p("\n")
	}
	p("<!-- bench:%s:end -->\n", key)
	return w.String()
}

// heading is the title of this broker kind's section.
func (b *bench) heading() string {
	if b.sectionKey() == "kafka" {
		return "## Real broker: " + b.brokerVer
	}
	return "## In-process broker: kfake"
}

// runHeader is what every section starts with: the command, when, the
// machine and how busy it was, the versions.
func (b *bench) runHeader(w *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	key := b.sectionKey()
	p("Command (`make bench` runs `cd bench && go run . $(BENCHFLAGS)`):\n\n```\n%s\n```\n\n", b.command())
	p("- Run: %s, took %s.\n", b.started.Format("2006-01-02 15:04 MST"), b.finished.Sub(b.started).Round(time.Second))
	p("- Machine: %s.\n", machine())
	if o := others(b.usage0, b.usage1); o >= 0 {
		extra := ""
		if key == "kafka" {
			extra = " (this includes the broker's JVM, which is not a child of the benchmark)"
		}
		p("- Other work on the machine: processes other than the benchmark kept on average **%.2f of %d CPUs** busy during the run%s; load average %s at the start, %s at the end.",
			o, runtime.NumCPU(), extra, b.usage0.loadavg, b.usage1.loadavg)
		if d := disturbed(b.usage0, b.usage1); d != "" {
			p(" Time the machine lost that no process's CPU shows (the hypervisor's CPU steal; PSI \"full\" memory stalls, every task waiting for memory at once): %s.", d)
		}
		p("\n")
	}
	p("- Versions: %s.\n", versions())
	if key == "kafka" {
		p("- Broker: %s, single node (scripts/kafka-local), Java: %s.\n", b.brokerVer, javaVersion())
	}
}

// standaloneSections write blocks of their own inside their broker kind's
// section, which a run of such sections alone replaces without touching
// the rest (the other sections' figures and the header of the run that
// wrote them).
var standaloneSections = []string{sectionReplay, sectionTransactions, sectionLeaderMoves, sectionRebalance, sectionWide, sectionRestore}

// standaloneBlock renders a standalone section's block for a run of such
// sections alone.
func (b *bench) standaloneBlock(section string) string {
	var w strings.Builder
	switch section {
	case sectionReplay:
		b.replayReport(&w, true)
	case sectionTransactions:
		b.transactionsReport(&w, true)
	case sectionLeaderMoves:
		b.leaderMovesReport(&w, true)
	case sectionRebalance:
		b.rebalanceReport(&w, true)
	case sectionWide:
		b.wideReport(&w, true)
	case sectionRestore:
		b.restoreReport(&w, true)
	}
	return w.String()
}

// standalone reports whether this run selected standalone sections only
// (and not every section).
func (b *bench) standalone() bool {
	if len(b.o.sections) == len(sectionOrder) {
		return false
	}
	for _, s := range b.o.sections {
		if !contains(standaloneSections, s) {
			return false
		}
	}
	return true
}

// updateMarkdown writes this run's report into path: its broker kind's
// section, or, for a run of standalone sections alone, their blocks inside
// it.
func (b *bench) updateMarkdown(path, report string) error {
	if !b.standalone() {
		return updateMarkdown(path, b.sectionKey(), report)
	}
	for _, sec := range b.o.sections {
		if block := b.standaloneBlock(sec); block != "" {
			if err := updateSubsection(path, b.sectionKey(), sec, block, b.heading()); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) command() string {
	parts := []string{"cd bench &&"}
	if len(b.o.brokers) > 0 && !hasFlag(b.o.args, "brokers") {
		parts = append(parts, "KAFKA_BROKERS="+strings.Join(b.o.brokers, ","))
	}
	parts = append(parts, "go run .")
	for _, a := range b.o.args {
		parts = append(parts, shellQuote(a))
	}
	return strings.Join(parts, " ")
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == ',' || r == '=' || r == '/' || r == ':' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (b *bench) sizesText() string {
	var s []string
	for _, size := range b.o.sizes {
		s = append(s, fmt.Sprintf("%d B", size))
	}
	return strings.Join(s, ", ")
}

func (b *bench) preloadText() string {
	var s []string
	for _, size := range b.o.sizes {
		s = append(s, fmt.Sprintf("%s for %d B", b.preloadDur[size].Round(100*time.Millisecond), size))
	}
	return strings.Join(s, ", ")
}

// table is one value size and handler: a row per consumer with medians,
// and tidemark's ratio to each.
func (b *bench) table(w *strings.Builder, size int, h string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	tm := b.tput[runKey{size, h, consTidemark}]
	p("### %d B values, %s handler\n\n", size, handlerName(h))
	p("| consumer | msgs/s [min-max] | CPU s per 1M msgs | allocs/msg | B/msg | peak RSS MiB | latency p50 / p99 | CPU at that rate | tidemark's msgs/s ÷ this | tidemark's CPU/msg ÷ this |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range b.o.consumers {
		rs := b.tput[runKey{size, h, c}]
		if len(rs) == 0 {
			continue
		}
		r := median(rs, rate)
		lo, hi := minMax(rs, rate)
		cpu := fmt.Sprintf("%.2f", median(rs, cpuPerM))
		allocs := fmt.Sprintf("%.2f", median(rs, func(r childResult) float64 { return perMsg(float64(r.Mallocs), r) }))
		bytes := thousands(median(rs, func(r childResult) float64 { return perMsg(float64(r.Bytes), r) }))
		if c == consKafkaPerf {
			cpu += " †"
			allocs, bytes = "—", "—"
		}
		lat, latCPU := "—", "—"
		if ls := b.lat[runKey{size, h, c}]; len(ls) > 0 {
			lat = fmt.Sprintf("%s / %s", ms(median(ls, func(r childResult) float64 { return float64(r.LatP50) })),
				ms(median(ls, func(r childResult) float64 { return float64(r.LatP99) })))
			latCPU = fmt.Sprintf("%.0f%%", 100*median(ls, cores))
		}
		ratio, cpuRatio := "", ""
		if c != consTidemark && len(tm) > 0 {
			ratio = fmt.Sprintf("**%sx**", ratioText(median(tm, rate)/r))
			if c != consKafkaPerf {
				cpuRatio = fmt.Sprintf("%.2fx", median(tm, cpuPerM)/median(rs, cpuPerM))
			}
		}
		name := c
		if n := len(rs); n < b.o.rounds {
			name += fmt.Sprintf(" (%d runs)", n)
		}
		p("| %s | %s [%s-%s] | %s | %s | %s | %.0f | %s | %s | %s | %s |\n", name, thousands(r), thousands(lo), thousands(hi), cpu, allocs, bytes,
			median(rs, func(r childResult) float64 { return mib(r.MaxRSS) }), lat, latCPU, ratio, cpuRatio)
	}
	if contains(b.o.consumers, consKafkaPerf) && h == handlerNoop {
		p("\n† the whole JVM's CPU time, startup and JIT included, per million messages.\n")
	}
	p("\n")
}

func handlerName(h string) string {
	switch h {
	case handlerSleep:
		return "1 ms sleep"
	case handlerSleep20:
		return "20 ms sleep"
	case handlerSleep100:
		return "100 ms sleep"
	}
	return "no-op"
}

// targets checks the targets, as ratios in this run.
func (b *bench) targets(w *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	type row struct{ target, measured, verdict string }
	var rows []row
	check := func(target string, v float64, ok bool, format string) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		verdict := "met"
		if !ok {
			verdict = "**missed**"
		}
		rows = append(rows, row{target, fmt.Sprintf(format, v), verdict})
	}
	for _, size := range b.o.sizes {
		tm := b.tput[runKey{size, handlerNoop, consTidemark}]
		if len(tm) == 0 {
			continue
		}
		tRate, tCPU := median(tm, rate), median(tm, cpuPerM)
		if rs := b.tput[runKey{size, handlerNoop, consReader1s}]; len(rs) > 0 {
			v := tRate / median(rs, rate)
			check(fmt.Sprintf("%d B, no-op: tidemark msgs/s >= 1.0x kafka-go Reader `CommitInterval: 1s`", size), v, v >= 1.0, "%.2fx")
			c := tCPU / median(rs, cpuPerM)
			check(fmt.Sprintf("%d B, no-op: tidemark CPU per message <= 1.2x kafka-go Reader `CommitInterval: 1s`", size), c, c <= 1.2, "%.2fx")
		}
		if rs := b.tput[runKey{size, handlerNoop, consReaderSync}]; len(rs) > 0 {
			v := tRate / median(rs, rate)
			check(fmt.Sprintf("%d B, no-op: tidemark msgs/s >= 30x kafka-go Reader with a synchronous commit per message", size), v, v >= 30, "%.0fx")
		}
		a := median(tm, func(r childResult) float64 { return perMsg(float64(r.Mallocs), r) })
		check(fmt.Sprintf("%d B, no-op: tidemark allocations per message <= 3", size), a, a <= 3, "%.2f")
		if rs := b.tput[runKey{size, handlerNoop, consTidemarkNoSync}]; len(rs) > 0 {
			v := tRate / median(rs, rate)
			check(fmt.Sprintf("%d B, no-op: fsync-ed offsets cost <= 10%%: tidemark's msgs/s against the same with `NoSync` (>= 90%%)", size), 100*v, v >= 0.90, "%.0f%%")
			c := tCPU / median(rs, cpuPerM)
			check(fmt.Sprintf("%d B, no-op: fsync-ed offsets cost <= 10%%: tidemark's CPU per message against the same with `NoSync` (<= 110%%)", size), 100*c, c <= 1.10, "%.0f%%")
		}
	}
	b.engineTargets(check)
	if len(b.startup) > 1 {
		// Run 1 is the restart with Config defaults.
		def, n := b.startup[1].res, b.o.startupPartitions
		check(fmt.Sprintf("%d partitions, restart on an offset file with a record per partition: startup reconciliation (from `framework.New` to every partition's position decided) < 1 s",
			n), def.Reconciled.Seconds(), def.Reconciled < time.Second, "%.3f s")
		if def.OpenFDs >= 0 {
			check(fmt.Sprintf("%d backlogged partitions, Config defaults (the restart): open fds <= 50", n), float64(def.OpenFDs), def.OpenFDs <= 50, "%.0f")
		}
		if def.MaxRSS > 0 {
			check(fmt.Sprintf("%d backlogged partitions, Config defaults (the restart): peak RSS <= 256 MiB", n), mib(def.MaxRSS), def.MaxRSS <= 256<<20, "%.0f MiB")
		}
		if v := b.idleRate(def); !math.IsNaN(v) {
			check(fmt.Sprintf("%d idle partitions, Config defaults (the restart, after its backlog): <= 10 fetch requests/s per broker", n), v, v <= 10, "%.1f/s")
		}
	}
	// Memory: bounded by MaxBufferedBytes whatever the partition count (a
	// fetch may bring one record batch beyond what it asked for).
	var mem []string
	memOK := true
	for _, s := range b.startup[min(1, len(b.startup)):] {
		mem = append(mem, fmt.Sprintf("%.1f MiB of %s, RSS %.0f MiB", mib(s.res.PeakBuffered), bytesText(s.budget), mib(s.res.MaxRSS)))
		memOK = memOK && s.res.PeakBuffered <= int64(s.budget+b.o.batchBytes)
	}
	if len(mem) > 0 {
		verdict := "met"
		if !memOK {
			verdict = "**missed**"
		}
		rows = append(rows, row{
			fmt.Sprintf("%d partitions: fetched but not handled bytes bounded by `MaxBufferedBytes` (plus one record batch, here <= %s) whatever the partition count: peak `Stats().BufferedBytes` of the restarts",
				b.o.startupPartitions, bytesText(b.o.batchBytes)),
			strings.Join(mem, "; "), verdict,
		})
	}
	if len(rows) == 0 {
		return
	}
	p("### Targets (ratios from this run)\n\n| target | measured | |\n|---|---:|---|\n")
	for _, r := range rows {
		p("| %s | %s | %s |\n", r.target, r.measured, r.verdict)
	}
	p("\n")
}

// engineTargets checks the fetch engine issue's throughput and CPU targets
// against franz-go and sarama, on 100 B values with the no-op handler.
func (b *bench) engineTargets(check func(target string, v float64, ok bool, format string)) {
	const size = 100
	tm := b.tput[runKey{size, handlerNoop, consTidemark}]
	if len(tm) > 0 {
		tRate, tCPU := median(tm, rate), median(tm, cpuPerM)
		if rs := b.tput[runKey{size, handlerNoop, consFranz}]; len(rs) > 0 {
			v := tRate / median(rs, rate)
			check(fmt.Sprintf("%d B, no-op: tidemark msgs/s >= 0.8x franz-go", size), v, v >= 0.8, "%.2fx")
			c := tCPU / median(rs, cpuPerM)
			check(fmt.Sprintf("%d B, no-op: tidemark CPU per message <= 2.0x franz-go", size), c, c <= 2.0, "%.2fx")
		}
		if rs := b.tput[runKey{size, handlerNoop, consSarama}]; len(rs) > 0 {
			v := tRate / median(rs, rate)
			check(fmt.Sprintf("%d B, no-op: tidemark msgs/s >= 1.0x sarama", size), v, v >= 1.0, "%.2fx")
		}
	}
	tl, fl := b.lat[runKey{size, handlerNoop, consTidemark}], b.lat[runKey{size, handlerNoop, consFranz}]
	if len(tl) > 0 && len(fl) > 0 {
		v := median(tl, cores) / median(fl, cores)
		check(fmt.Sprintf("%d B, no-op, fixed-rate latency run (%s msgs/s): tidemark's CPU at that rate <= 2x franz-go's", size, thousands(b.latRate[handlerNoop])),
			v, v <= 2, "%.2fx")
	}
	b.scaleTargets(check)
}

// scaleTargets checks the scale issue's targets against franz-go on 8
// partitions of 100 B values: throughput and CPU with the no-op handler, CPU
// with the 1 ms handler, and CPU and p99 latency at the latency runs' fixed
// rates.
func (b *bench) scaleTargets(check func(target string, v float64, ok bool, format string)) {
	const size = 100
	tm, fr := b.tput[runKey{size, handlerNoop, consTidemark}], b.tput[runKey{size, handlerNoop, consFranz}]
	if len(tm) > 0 && len(fr) > 0 {
		v := median(tm, rate) / median(fr, rate)
		check(fmt.Sprintf("%d B, no-op: tidemark msgs/s >= 1.2x franz-go", size), v, v >= 1.2, "%.2fx")
		c := median(tm, cpuPerM) / median(fr, cpuPerM)
		check(fmt.Sprintf("%d B, no-op: tidemark CPU per message <= 1.0x franz-go", size), c, c <= 1.0, "%.2fx")
	}
	tm, fr = b.tput[runKey{size, handlerSleep, consTidemark}], b.tput[runKey{size, handlerSleep, consFranz}]
	if len(tm) > 0 && len(fr) > 0 {
		c := median(tm, cpuPerM) / median(fr, cpuPerM)
		check(fmt.Sprintf("%d B, 1 ms handler: tidemark CPU per message <= 1.2x franz-go", size), c, c <= 1.2, "%.2fx")
	}
	p99 := func(r childResult) float64 { return float64(r.LatP99) }
	for _, h := range []string{handlerNoop, handlerSleep} {
		tl, fl := b.lat[runKey{size, h, consTidemark}], b.lat[runKey{size, h, consFranz}]
		if len(tl) == 0 || len(fl) == 0 {
			continue
		}
		at := fmt.Sprintf("%d B, %s, fixed-rate latency run (%s msgs/s)", size, handlerName(h), thousands(b.latRate[h]))
		c := median(tl, cores) / median(fl, cores)
		check(at+": tidemark's CPU at that rate <= 1.0x franz-go's", c, c <= 1.0, "%.2fx")
		l := median(tl, p99) / median(fl, p99)
		check(at+": tidemark's p99 latency <= 1.1x franz-go's", l, l <= 1.1, "%.2fx")
	}
	b.stateTargets(check)
}

// stateTargets checks the state issue's throughput targets: a TxHandler
// doing one Get and one Put per message (1,000 keys), without a changelog
// and with one, against a no-op BatchHandler, on 8 partitions of 100 B
// values.
func (b *bench) stateTargets(check func(target string, v float64, ok bool, format string)) {
	const size = 100
	tx, batch := b.tput[runKey{size, handlerNoop, consTidemarkTx}], b.tput[runKey{size, handlerNoop, consTidemarkBatch}]
	if len(tx) > 0 && len(batch) > 0 {
		v := median(tx, rate) / median(batch, rate)
		check(fmt.Sprintf("%d B: a TxHandler with one Put per message (1,000 keys), no changelog, msgs/s >= 0.5x a no-op BatchHandler's", size),
			v, v >= 0.5, "%.2fx")
	}
	if txlog := b.tput[runKey{size, handlerNoop, consTidemarkTxLog}]; len(txlog) > 0 && len(batch) > 0 {
		v := median(txlog, rate) / median(batch, rate)
		check(fmt.Sprintf("%d B: the same TxHandler with a changelog (`StateChangelog`), msgs/s >= 0.3x a no-op BatchHandler's", size),
			v, v >= 0.3, "%.2fx")
	}
}

func (b *bench) startupTable(w *strings.Builder) {
	if len(b.startup) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("### Startup with %s partitions (tidemark)\n\n", thousands(float64(b.o.startupPartitions)))
	p("One topic of %s partitions. Before each run %s messages of 100 B are produced to every partition; tidemark starts, "+
		"consumes them and stops. The first run starts from an empty offset file, the next ones restart on the same file and group "+
		"(a record per partition to reconcile with Kafka's committed offsets); the first two with Config defaults, the third (if any) "+
		"with a smaller `MaxBufferedBytes`. Times from before `framework.New` (opening the file) to the "+
		"consumer being a member of a generation (the group join), to every partition's position decided by reconciliation "+
		"(file vs Kafka's committed offset vs the log bounds; `Stats` shows a position) and to every partition's goroutine running "+
		"(state `running`), polled through `Stats` every 10 ms. Memory: one budget, `MaxBufferedBytes` (default 16 MiB), bounds the "+
		"fetched but not yet handled bytes across all partitions, whatever their number (a fetch may bring one record batch beyond it); "+
		"`FetchMaxBytes` (1 MiB) only caps what one fetch asks per partition. Peak buffered is the highest `Stats().BufferedBytes` "+
		"sampled every 10 ms from `framework.New` to the last message; peak RSS is the child's VmHWM over the whole run; open fds "+
		"are counted at the last message.\n\n",
		thousands(float64(b.o.startupPartitions)), thousands(float64(b.o.startupMessages)))
	idle := b.o.startupIdleWindow > 0
	if idle {
		p("Idle: once a run has handled its backlog, nothing more is produced; from the moment `Stats().BufferedBytes` is 0 (every "+
			"fetched message handled, every partition running and caught up), the child counts the fetch requests the consumer sends "+
			"(`Stats().FetchRequests`) over %s, and its CPU time. Requests/s are divided by the number of brokers that lead the "+
			"topic's partitions (from a metadata request: %d here), since tidemark runs one fetch loop per broker.\n\n",
			b.o.startupIdleWindow, max(b.startupLeaders, 1))
	}
	p("| run | joined | every partition reconciled | every partition running | then msgs/s | peak buffered MiB | peak RSS MiB | open fds |")
	if idle {
		p(" idle: fetch requests/s per broker | idle: CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	} else {
		p("\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for _, s := range b.startup {
		p("| %s | %s | %s | %s | %s | %.1f | %.0f | %d |", s.label, s.res.Joined.Round(time.Millisecond), s.res.Reconciled.Round(time.Millisecond),
			s.res.Ready.Round(time.Millisecond), thousands(rate(s.res)), mib(s.res.PeakBuffered), mib(s.res.MaxRSS), s.res.OpenFDs)
		if idle {
			p(" %.1f | %.1f%% |", b.idleRate(s.res), 100*idleCores(s.res))
		}
		p("\n")
	}
	p("\n")
}

func minMax(rs []childResult, f func(childResult) float64) (float64, float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		v := f(r)
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	return lo, hi
}

func ratioText(v float64) string {
	switch {
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func ms(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}

// thousands formats v rounded, with commas.
func thousands(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// updateMarkdown replaces this broker kind's section of path (between its
// begin and end markers) with section and the text before the first section
// with mdHeader, keeping the other section and any text after the sections;
// a missing section is added (kfake before kafka). The summary of the
// Targets tables (summary.go) is written again from the result.
func updateMarkdown(path, key, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	if doc == "" {
		doc = mdHeader
	}
	begin := fmt.Sprintf("<!-- bench:%s:begin", key)
	end := fmt.Sprintf("<!-- bench:%s:end -->\n", key)
	if i := strings.Index(doc, begin); i >= 0 {
		j := strings.Index(doc[i:], end)
		if j < 0 {
			return fmt.Errorf("%s: %q without %q", path, begin, strings.TrimSpace(end))
		}
		doc = doc[:i] + section + doc[i+j+len(end):]
	} else if k := strings.Index(doc, "<!-- bench:kafka:begin"); key == "kfake" && k >= 0 {
		doc = doc[:k] + section + "\n" + doc[k:]
	} else {
		if !strings.HasSuffix(doc, "\n\n") {
			doc = strings.TrimRight(doc, "\n") + "\n\n"
		}
		doc += section
	}
	// The text before the first section is the method, which this program
	// owns: it follows the code. Text after the sections is kept.
	if i := strings.Index(doc, "<!-- bench:"); i >= 0 {
		doc = mdHeader + doc[i:]
	}
	// The summary follows the tables, whichever section changed.
	doc = withSummary(doc)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// updateSubsection replaces the block of section name (between its
// markers bench:KEY:NAME) inside key's section of path with block, or adds
// it at the end of key's section; if path has no such section, it is added
// with heading and block alone. The rest of key's section is kept.
func updateSubsection(path, key, name, block, heading string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	begin := fmt.Sprintf("<!-- bench:%s:begin", key)
	end := fmt.Sprintf("<!-- bench:%s:end -->\n", key)
	i := strings.Index(doc, begin)
	if i < 0 {
		return updateMarkdown(path, key, fmt.Sprintf("%s (written by bench/, do not edit by hand) -->\n%s\n\n%s%s", begin, heading, block, end))
	}
	j := strings.Index(doc[i:], end)
	if j < 0 {
		return fmt.Errorf("%s: %q without %q", path, begin, strings.TrimSpace(end))
	}
	sec := doc[i : i+j] // without its end marker
	subBegin := fmt.Sprintf("<!-- bench:%s:%s:begin", key, name)
	subEnd := fmt.Sprintf("<!-- bench:%s:%s:end -->\n", key, name)
	if k := strings.Index(sec, subBegin); k >= 0 {
		l := strings.Index(sec[k:], subEnd)
		if l < 0 {
			return fmt.Errorf("%s: %q without %q", path, subBegin, strings.TrimSpace(subEnd))
		}
		sec = sec[:k] + block + sec[k+l+len(subEnd):]
	} else {
		if !strings.HasSuffix(sec, "\n\n") {
			sec = strings.TrimRight(sec, "\n") + "\n\n"
		}
		sec += block
	}
	return updateMarkdown(path, key, sec+end)
}

// mdHeader is the top of BENCHMARKS.md, before the sections: the method.
const mdHeader = "# Benchmarks\n\n" +
	"tidemark against the Go Kafka consumers users would pick instead, side by side: the same broker, the same data, one run.\n" +
	"Written by `make bench` (the program in `bench/`, a Go module of its own so that sarama and franz-go's client never enter\n" +
	"the library's go.mod). Each section below was written by one run and starts with its exact command, the machine, how busy\n" +
	"the machine was, and the versions; no figure in it is typed by hand.\n\n" +
	"```\n" +
	"make bench                                  # in-process kfake broker: nothing to install but Go\n" +
	"make bench-kafka                            # a real Apache Kafka broker (scripts/kafka-local: JDK 17 + Maven)\n" +
	"make bench BENCHFLAGS='-rounds 1 -messages 200000 -handlers noop'   # smaller; `cd bench && go run . -h` lists the flags\n" +
	"make bench BENCHFLAGS='-sections concurrency'                       # only the section on concurrency inside a partition\n" +
	"make bench BENCHFLAGS='-sections replay'                            # only the section on bounded replay (MaxUndurable); rewrites only its own block\n" +
	"make bench BENCHFLAGS='-sections metrics'                           # only the section on the cost of package metrics\n" +
	"make bench BENCHFLAGS='-sections transactions'                      # only read_committed; rewrites only its own block\n" +
	"make bench BENCHFLAGS='-sections leadermoves'                       # only the resume after leader moves (kfake); rewrites only its own block\n" +
	"make bench BENCHFLAGS='-sections wide'                              # only 1,000 and 10,000 partitions against franz-go; rewrites only its own block\n" +
	"make bench BENCHFLAGS='-sections restore'                           # only a state's restore from its changelog; rewrites only its own block\n" +
	"cd bench && go test ./...                   # the smoke test: the whole pipeline, small, on kfake (about 20 s)\n" +
	"```\n\n" +
	"## Method\n\n" +
	"- **One broker, one data set.** The program preloads one topic per value size (default 8 partitions, 1,000,000 messages\n" +
	"  of 100 B, and of 1 KiB), uncompressed, in producer batches of at most 16 KiB per partition (the Java producer's\n" +
	"  default `batch.size`). The broker is the in-process kfake by default, or `KAFKA_BROKERS`.\n" +
	"- **Each consumer in a child process of its own.** The program re-executes itself once per run, with the consumer, the\n" +
	"  topic and a fresh consumer group (from the first offset) in an environment variable. The broker (kfake) and the\n" +
	"  producers stay in the parent, so the broker's CPU and memory are never charged to a consumer, and each consumer's\n" +
	"  figures are its own: CPU from `getrusage(RUSAGE_SELF)` in the child, allocations from `runtime.MemStats` in the\n" +
	"  child, peak RSS from the child's own `VmHWM` (not wait4's `ru_maxrss`, which Linux starts at the parent's RSS at the\n" +
	"  fork, and the parent holds the broker's data). One at a time, so they never compete with each other. With kfake the\n" +
	"  parent collects its garbage before each run (it holds every preloaded topic): a collection owed by the run before\n" +
	"  would otherwise land in the next, and the in-process broker's CPU over each run is on the run's log line.\n" +
	"- **Rounds in alternation.** Every round runs every consumer once per value size and handler, in an order rotated by\n" +
	"  one each round; the tables show the median of the rounds (each metric's own median) and the min-max of msgs/s. A\n" +
	"  burst of other work on the machine then hits different consumers in different rounds. What slows a machine without\n" +
	"  showing in any process's CPU, the hypervisor's CPU steal and memory stalls (Linux PSI \"full\"), is read around each\n" +
	"  run and printed on its log line, and summed in each header: a round slow at the same CPU per message with either\n" +
	"  beside it was slowed by the machine, not by its consumer.\n" +
	"- **The window.** msgs/s, CPU and allocations are taken from the moment the group assigned the partitions (tidemark: its\n" +
	"  `Stats` shows a generation; sarama: `Setup`; franz-go: `OnPartitionsAssigned`) or the first message, whichever comes\n" +
	"  first, to the last message; kafka-go's `Reader` has no assignment callback, so its window starts at its first message\n" +
	"  (it fetches ahead at most `QueueCapacity`, 100 messages). What a client fetches ahead is inside the window; the group\n" +
	"  join and the shutdown are not. A consumer slower than `-max-window` (6 s; 3 s with the sleeping handler, whose\n" +
	"  msgs/s the handler bounds) is stopped there, and its msgs/s is over what it handled. Kafka's own\n" +
	"  ConsumerPerformance tool reports `fetch.nMsg.sec`, which likewise leaves out its join.\n" +
	"- **Handlers.** `no-op` returns at once (the consumer's own cost); `1 ms sleep` sleeps 1 ms per message (I/O-bound\n" +
	"  work). Every handler checks that each partition's offsets arrive in order, without gaps or repeats: a run that sees\n" +
	"  one fails. Concurrency is each client's own: tidemark and sarama call the handler on one goroutine per partition;\n" +
	"  the franz-go loop hands each partition of a poll to its own goroutine with the sleeping handler; kafka-go's `Reader`\n" +
	"  is one stream of messages, so its handler runs one message at a time.\n" +
	"- **Latency.** On a fresh topic a warm-up message per partition tells when the consumer has every partition; then the\n" +
	"  parent produces at a fixed rate (half the slowest peer's median msgs/s with that handler, so every consumer keeps\n" +
	"  up), each value carrying its send time; the handler records now minus that time: producer, broker and consumer.\n" +
	"- **Durable offsets.** tidemark writes its offset file (group commit: one write folds every partition's pending\n" +
	"  watermark) to a journal a SIGKILL leaves, fsyncs it in a bbolt transaction every second, and commits to Kafka\n" +
	"  every second; `tidemark-nosync` is the same with `Config.NoSync`: the difference is what durability costs.\n" +
	"- **Startup with many partitions.** tidemark alone, on a topic of 1,000 partitions with a backlog, from an empty offset\n" +
	"  file, then restarted on it (a record per partition to reconcile), then restarted with a smaller `MaxBufferedBytes`\n" +
	"  (8 MiB; the one budget of fetched but not handled bytes, default 16 MiB), measured through `Stats`; after each\n" +
	"  backlog the consumer stays up idle for 3 s, and the fetch requests it sends then are counted; see its table.\n" +
	"- **Concurrency inside a partition.** tidemark alone, on a topic of 100 B messages with 1,000 keys (key k in partition\n" +
	"  k % 8), with `Config.Ordering` `OrderPartition` (the default), `OrderKey` and `OrderNone`, and handlers that sleep 1, 20\n" +
	"  or 100 ms (I/O-bound work) besides the no-op one; each handler checks every key's order. Each run is capped at a window\n" +
	"  after its first message (8 s with the 100 ms handler, so that the concurrent runs reach their steady state), 3 rounds;\n" +
	"  then the memory of a window held above one stuck message per partition; see its table.\n" +
	"- **Bounded replay.** tidemark alone, `OrderPartition`, offsets fsync-ed, on the 100 B topic, with `Config.MaxUndurable`\n" +
	"  (the messages per partition handled and not yet durable: what a SIGKILL makes it handle again) at 1, 10, 100, 1,000\n" +
	"  and its default, 100,000, with the no-op and 1 ms handlers; msgs/s, CPU and the offset file's writes per second\n" +
	"  against the replay bound each value gives; see its table.\n" +
	"- **Metrics.** tidemark alone on a topic of 1,000 partitions, idle after a small backlog: the CPU of 60 scrapes of\n" +
	"  `metrics.Handler` served back to back in its process, beyond the idle consumer's own, as a share of a CPU at one scrape\n" +
	"  per second, and the exposition's size; then the no-op throughput run with and without metrics (a Collector, so every\n" +
	"  Handler call is timed, scraped every second), alternating, 3 rounds; see its table.\n" +
	"- **Transactions.** tidemark with `Config.IsolationLevel: kafka.ReadCommitted` on a topic written by a franz-go\n" +
	"  transactional producer (8 partitions, 1,000,000 committed records of 100 B in transactions of 500 records per\n" +
	"  partition, every 5th transaction aborted after its records were written, so they stay in the log), against tidemark's\n" +
	"  default `ReadUncommitted` on a plain topic of exactly the same committed records, and against franz-go at\n" +
	"  read_committed on the transactional topic (and on the plain one, for scale); no-op handler, 5 rounds in alternation.\n" +
	"  Only committed records count; every value carries its sequence number among its partition's committed records, and\n" +
	"  a run handed a record of an aborted transaction, or a committed one twice or out of order, fails. A run of\n" +
	"  `-sections transactions` alone replaces only that block of BENCHMARKS.md, with its own command; see its table.\n" +
	"- **Leader moves.** kfake only: one partition's leader moved 50 times between three brokers under a producer writing\n" +
	"  straight to the leader every 2 ms; each move's resume time, from the move to the first message handled from the new\n" +
	"  leader, for tidemark and franz-go's `kgo` consumer group at their defaults, 3 rounds; the ratio tidemark / franz-go.\n" +
	"  A run of `-sections leadermoves` alone replaces only that block of BENCHMARKS.md, with its own command; see its table.\n" +
	"- **Wide topics.** tidemark and franz-go's `kgo` group consumer (`AutoCommitMarks`) on a topic of 1,000 partitions, then\n" +
	"  one of 10,000, each holding 1,000,000 messages of 200 B; each consumer in a child process printing every value\n" +
	"  through a `bufio.Writer`, timed from just before the process starts to its last message (start, join and backlog),\n" +
	"  with its peak RSS; at 10,000 partitions the consumer then stays up idle and its fetch requests per second and CPU are\n" +
	"  measured. A run of `-sections wide` alone replaces only that block of BENCHMARKS.md; see its table.\n" +
	"- **State restore.** tidemark alone: a `TxHandler` with `Config.StateChangelog` fills a changelog with 1,000,000\n" +
	"  records (one key per message, 100 B values, 8 partitions); then a member of the same group starts on an empty\n" +
	"  offset file and restores every partition's state from the changelog, timed from the assignment to every partition\n" +
	"  running, against a no-op `BatchHandler` consuming the changelog topic itself; 3 rounds in alternation. A run of\n" +
	"  `-sections restore` alone replaces only that block of BENCHMARKS.md; see its table.\n" +
	"- **Ratios** are tidemark's median over the other consumer's median, from the same run: above 1 means tidemark handles\n" +
	"  more messages per second; for CPU, below 1 means tidemark spends less CPU per message.\n\n" +
	"kfake is franz-go's in-process test broker: it is fast but not Apache Kafka (no disk, its own fetch and group code), so\n" +
	"its absolute figures flatter every client alike; the real-broker section is the one to quote for absolute numbers. On\n" +
	"a 2-core machine the consumer and the broker share the two CPUs, so msgs/s also depends on how much CPU the broker\n" +
	"needs to serve each client's fetches; CPU per message is the steadier comparison.\n\n"
