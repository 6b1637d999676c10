package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark/tidemark/framework"
)

// The concurrency section: tidemark's orderings (Config.Ordering,
// MaxInFlight) side by side on one topic of keyed messages, with handlers
// that sleep as long as an I/O call, and the memory a stuck message costs
// while the window above it completes. The children run the keyed handler
// (concurrency_child.go).

// How each message of a partition takes one of its partition's keys
// (-concurrency-key-pick).
const (
	keyPickRandom     = "random"      // pseudo-random, keySeed
	keyPickRoundRobin = "round-robin" // in turn
)

const (
	// keySeed seeds the pseudo-random pick of keys: the same data in every
	// run.
	keySeed uint64 = 0x74696465 // "tide"
	// concValueSize is the section's value size: the main tables' smaller
	// one, so that its no-op runs compare with theirs.
	concValueSize = 100
	// defaultInFlight is framework.Config.MaxInFlight's default with
	// OrderKey and OrderNone.
	defaultInFlight = 100
)

// concHandlerOrder is the order of the section's handler modes.
var concHandlerOrder = []string{handlerNoop, handlerSleep, handlerSleep20, handlerSleep100}

// The tidemark variants of the section: the rows of its table.
const (
	varPartition  = "partition"   // OrderPartition, the default
	varKey        = "key"         // OrderKey, -concurrency-in-flight
	varKeyDefault = "key-default" // OrderKey, MaxInFlight at its default
	varNone       = "none"        // OrderNone, -concurrency-in-flight
)

var variantOrder = []string{varPartition, varKey, varKeyDefault, varNone}

// variantsFor lists the variants run with handler mode h: OrderKey at its
// default MaxInFlight where the default is the limit (100 ms: 100 calls
// per partition, fewer than its 125 keys), OrderNone where it is cheap.
func variantsFor(h string) []string {
	switch h {
	case handlerSleep100:
		return []string{varPartition, varKey, varKeyDefault}
	case handlerNoop, handlerSleep:
		return []string{varPartition, varKey, varNone}
	}
	return []string{varPartition, varKey}
}

type concKey struct{ handler, variant string }

// concurrencyRuns is what the section measured.
type concurrencyRuns struct {
	topic   string
	per     int64 // messages per partition
	preload time.Duration
	runs    map[concKey][]childResult
	// The stuck runs: Config.MaxWindow, then per round the run with a
	// stuck message per partition and the one without (free).
	maxWindow   int
	stuck, free []childResult
	took        time.Duration // the whole section, preload included
}

// variant returns v's Config.Ordering and MaxInFlight (0: the default).
func (b *bench) variant(v string) (framework.Ordering, int) {
	switch v {
	case varKey:
		return framework.OrderKey, b.o.concInFlight
	case varKeyDefault:
		return framework.OrderKey, 0
	case varNone:
		return framework.OrderNone, b.o.concInFlight
	}
	return framework.OrderPartition, 0
}

// inFlightOf is v's MaxInFlight, its default filled in.
func (b *bench) inFlightOf(v string) int {
	switch ord, n := b.variant(v); {
	case n > 0:
		return n
	case ord == framework.OrderPartition:
		return 1
	}
	return defaultInFlight
}

func (b *bench) variantName(v string) string {
	switch v {
	case varKey:
		return fmt.Sprintf("`OrderKey`, `MaxInFlight` %d", b.o.concInFlight)
	case varKeyDefault:
		return fmt.Sprintf("`OrderKey`, `MaxInFlight` %d (its default)", defaultInFlight)
	case varNone:
		return fmt.Sprintf("`OrderNone`, `MaxInFlight` %d", b.o.concInFlight)
	}
	return "`OrderPartition` (the default; `MaxInFlight` 1)"
}

// keysIn is the number of keys that live in partition p: k % partitions
// == p.
func (b *bench) keysIn(p int) int {
	return (b.o.concKeys - p + b.o.partitions - 1) / b.o.partitions
}

// keyOf is the key of message i (from 0) of partition p: one of the
// partition's keys, p + j*partitions.
func (b *bench) keyOf(p int, i int64) int {
	n := int64(b.keysIn(p))
	j := i % n
	if b.o.concKeyPick == keyPickRandom {
		j = int64(splitmix64(keySeed^uint64(p)<<40^uint64(i)) % uint64(n))
	}
	return p + int(j)*b.o.partitions
}

// splitmix64 is SplitMix64's finalizer: a hash that spreads consecutive
// inputs evenly.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// calls is how many Handler calls v can run at once over the topic: one
// per partition (OrderPartition), MaxInFlight per partition (OrderNone),
// and with OrderKey no more than the partition's keys.
func (b *bench) calls(v string) int {
	ord, _ := b.variant(v)
	n := b.inFlightOf(v)
	total := 0
	for p := 0; p < b.o.partitions; p++ {
		switch ord {
		case framework.OrderKey:
			total += min(n, b.keysIn(p))
		default:
			total += n
		}
	}
	return total
}

// bound is the most msgs/s v can reach with handler mode h: its calls at
// once over the handler's sleep; NaN for the no-op handler.
func (b *bench) bound(v, h string) float64 {
	l := handlerLatency(h)
	if l <= 0 {
		return math.NaN()
	}
	return float64(b.calls(v)) / l.Seconds()
}

// stuckWindow is the Config.MaxWindow of the stuck runs: the least for
// which every partition, with its first message stuck, holds
// -concurrency-stuck-ahead completed messages above it when its window is
// full (the later messages of the stuck key wait, in the window too); and
// at least MaxInFlight, which Config requires.
func (b *bench) stuckWindow() int {
	need := 0
	for p := 0; p < b.o.partitions; p++ {
		stuck := b.keyOf(p, 0)
		done, i := 0, int64(1)
		for ; done < b.o.concStuckAhead; i++ {
			if b.keyOf(p, i) != stuck {
				done++
			}
		}
		need = max(need, int(i))
	}
	return max(need, b.o.concInFlight)
}

func (b *bench) concurrencyPhase(ctx context.Context) error {
	c := &b.conc
	if !contains(b.o.consumers, consTidemark) || (len(b.o.concHandlers) == 0 && b.o.concStuckAhead == 0) {
		return nil
	}
	c.per = b.o.concMessages / int64(b.o.partitions)
	if b.o.concStuckAhead > 0 {
		c.maxWindow = b.stuckWindow()
		if int64(c.maxWindow) >= c.per {
			return fmt.Errorf("concurrency section: -concurrency-stuck-ahead %d needs a window of %d messages per partition, more than the %d preloaded (-concurrency-messages)",
				b.o.concStuckAhead, c.maxWindow, c.per)
		}
	}
	c.topic = fmt.Sprintf("tidemark-bench-%s-keyed-%dk", b.runID, b.o.concKeys)
	start := time.Now()
	defer func() { c.took = time.Since(start) }()
	if err := b.broker.createTopic(ctx, c.topic, b.o.partitions); err != nil {
		return err
	}
	keys := make([][]byte, b.o.concKeys)
	for k := range keys {
		keys[k] = []byte(strconv.Itoa(k))
	}
	if err := b.prod.preload(ctx, b.broker, c.topic, b.o.partitions, c.per, concValueSize, c.per, func(p int, i int64) []byte {
		return keys[b.keyOf(p, i)]
	}); err != nil {
		return err
	}
	c.preload = time.Since(start)
	b.logf("preloaded %s: %d x %d messages of %d bytes, %d keys (%s) in %s", c.topic, b.o.partitions, c.per, concValueSize, b.o.concKeys,
		b.o.concKeyPick, c.preload.Round(time.Millisecond))
	c.runs = map[concKey][]childResult{}
	for r := 0; r < b.o.concRounds; r++ {
		for _, h := range b.o.concHandlers {
			for _, v := range rotate(variantsFor(h), r) {
				res, err := b.concRun(ctx, r, h, v)
				if err != nil {
					return fmt.Errorf("concurrency round %d, %s, %s: %w", r+1, h, v, err)
				}
				k := concKey{h, v}
				c.runs[k] = append(c.runs[k], res)
				pct := ""
				if bd := b.bound(v, h); !math.IsNaN(bd) {
					pct = fmt.Sprintf(" (%.0f%% of its bound)", 100*rate(res)/bd)
				}
				b.logf("concurrency round %d/%d %-10s %-11s %9.0f msgs/s%s  %6.2f CPU s/M  %5.0f MiB RSS  %6.0f calls in flight  %d per-key violations  (%d msgs in %s; stop took %s)",
					r+1, b.o.concRounds, h, v, rate(res), pct, cpuPerM(res), mib(res.MaxRSS), res.MeanInFlight, res.KeyViolations,
					res.Messages, res.Window.Round(time.Millisecond), res.Stop.Round(time.Millisecond))
			}
		}
		if b.o.concStuckAhead > 0 {
			stuck, err := b.stuckRun(ctx, r, 0)
			if err != nil {
				return fmt.Errorf("concurrency round %d, stuck run: %w", r+1, err)
			}
			free, err := b.stuckRun(ctx, r, stuck.Messages)
			if err != nil {
				return fmt.Errorf("concurrency round %d, the stuck run's twin without stuck messages: %w", r+1, err)
			}
			c.stuck, c.free = append(c.stuck, stuck), append(c.free, free)
			b.logf("concurrency round %d/%d stuck: %d msgs handled, completed above the stuck offsets %d (least per partition %d), %d waiting, %d in calls; peak RSS %.0f MiB, without stuck messages %.0f MiB (%d msgs)",
				r+1, b.o.concRounds, stuck.Messages, stuck.AheadSum, stuck.AheadMin, stuck.WaitingSum, stuck.InFlightSum,
				mib(stuck.WindowRSS), mib(free.WindowRSS), free.Messages)
		}
	}
	return nil
}

// concSpec is the spec of a child of the section.
func (b *bench) concSpec(h, v, dir string) childSpec {
	ord, n := b.variant(v)
	return childSpec{
		Mode:          modeThroughput,
		Consumer:      consTidemark,
		Handler:       h,
		Brokers:       b.broker.addrs,
		Topic:         b.conc.topic,
		Partitions:    b.o.partitions,
		Want:          b.conc.per * int64(b.o.partitions),
		MaxWindow:     b.o.concWindows[h],
		FlushInterval: b.o.flushInterval,
		Group:         b.group("conc-" + v),
		Dir:           dir,
		Timeout:       b.o.timeout,
		Ordering:      ord,
		MaxInFlight:   n,
		Keys:          b.o.concKeys,
		PerPartition:  b.conc.per,
	}
}

func (b *bench) concRun(ctx context.Context, round int, h, v string) (childResult, error) {
	dir, err := os.MkdirTemp(b.tmp, "conc-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	sp := b.concSpec(h, v, dir)
	if h == handlerNoop {
		sp.Want = b.noopWant()
	}
	b.debugFiles(&sp, fmt.Sprintf("concurrency-%s-%s-r%d", v, h, round+1))
	return b.child(ctx, sp, nil)
}

// noopWant is how many messages a no-op run of the section handles: as
// many as a run of the main tables (the whole of their topic), to compare
// with theirs, or the whole topic if it is smaller.
func (b *bench) noopWant() int64 { return min(b.total(), b.conc.per*int64(b.o.partitions)) }

// stuckRun is OrderKey with the no-op handler and the stuck runs'
// MaxWindow: with want 0, the run whose first message of each partition
// blocks until every partition holds -concurrency-stuck-ahead messages
// completed above it; otherwise the same without a stuck message, ending
// once it handled want messages.
func (b *bench) stuckRun(ctx context.Context, round int, want int64) (childResult, error) {
	dir, err := os.MkdirTemp(b.tmp, "stuck-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	sp := b.concSpec(handlerNoop, varKey, dir)
	sp.ConfigMaxWindow = b.conc.maxWindow
	sp.MaxWindow = 0
	name := "stuck"
	if want == 0 {
		sp.StuckAhead, sp.Want = b.o.concStuckAhead, 0
	} else {
		sp.Want, name = want, "stuck-free"
	}
	sp.Group = b.group(name)
	b.debugFiles(&sp, fmt.Sprintf("concurrency-%s-r%d", name, round+1))
	res, err := b.child(ctx, sp, nil)
	if err == nil && want == 0 && res.AheadMin < int64(b.o.concStuckAhead) {
		err = fmt.Errorf("the window ended with %d messages completed above a stuck one, want %d", res.AheadMin, b.o.concStuckAhead)
	}
	return res, err
}

// concurrencyReport renders the section: its table, the stuck runs and
// its targets.
func (b *bench) concurrencyReport(w *strings.Builder) {
	c := &b.conc
	if len(c.runs) == 0 && len(c.stuck) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	pick := "pseudo-randomly (a fixed seed: the same data every run)"
	if b.o.concKeyPick == keyPickRoundRobin {
		pick = "in turn (round-robin)"
	}
	p("### Concurrency inside a partition (tidemark)\n\n")
	p("One topic of %d partitions x %s messages of %d B (preload took %s), each with a key: %s distinct keys, the decimal numbers "+
		"0-%d, key k in partition k %% %d (%s keys per partition, as a hashing producer gives), each message of a partition taking "+
		"one of its partition's keys %s. tidemark alone, a child process per run as everywhere in this benchmark, a fresh group from the "+
		"first offset, Config defaults but `Ordering` and `MaxInFlight` as the row says. Handlers: no-op, or a sleep per message "+
		"(I/O-bound work; 100 ms is an HTTP call). Each checks every key's order: a call never starts while another call of its key "+
		"runs, nor with an offset below the last one of its key (`OrderPartition` and `OrderKey` promise it: a violation fails the "+
		"run; `OrderNone` does not, its count is shown); and that no offset comes twice (that fails any run); with `OrderPartition` "+
		"also that each partition's offsets follow each other. A no-op run ends once it handled %s messages (as many as a run of "+
		"the main tables; or %s after its first message if slower), the others at a window after their first message (%s) or when the topic is consumed; msgs/s is over "+
		"what a run handled, the ramp-up included. %d round(s) (`-concurrency-rounds`: the sleeping runs "+
		"are long), the variants of a handler in a rotated order; medians and the [min-max] of msgs/s. The section took %s.\n\n",
		b.o.partitions, thousands(float64(c.per)), concValueSize, c.preload.Round(10*time.Millisecond), thousands(float64(b.o.concKeys)),
		b.o.concKeys-1, b.o.partitions, keysPerPartition(b), pick, thousands(float64(b.noopWant())), b.o.concWindows[handlerNoop], b.windowsText(), b.o.concRounds, c.took.Round(time.Second))
	p("Bound: the most msgs/s the sleep allows with that many calls at once: partitions x `MaxInFlight`, and with `OrderKey` at "+
		"most one call per key (so at most %s per partition here), over the sleep; e.g. `OrderPartition` %d / 100 ms = %s msgs/s, "+
		"`OrderKey` with every key in a call %s / 100 ms = %s msgs/s. Calls in flight: `Stats().InFlight` summed over the "+
		"partitions, the mean of samples every 50 ms over the window. Graceful stop: from the window's end to `Run` returning "+
		"(Config's `DrainTimeout`, 5 s, bounds the drain), outside the window.\n\n",
		keysPerPartition(b), b.o.partitions, thousands(float64(b.o.partitions)/0.1), thousands(float64(b.o.concKeys)), thousands(float64(b.o.concKeys)/0.1))
	if len(c.runs) > 0 {
		p("| handler | tidemark | msgs/s [min-max] | bound msgs/s | %% of bound | msgs/s ÷ `OrderPartition`'s | CPU s per 1M msgs | peak RSS MiB | calls in flight | per-key order violations | graceful stop |\n")
		p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, h := range b.o.concHandlers {
			base := c.runs[concKey{h, varPartition}]
			for _, v := range variantOrder {
				rs := c.runs[concKey{h, v}]
				if len(rs) == 0 {
					continue
				}
				r := median(rs, rate)
				lo, hi := minMax(rs, rate)
				bound, pct := "—", "—"
				if bd := b.bound(v, h); !math.IsNaN(bd) {
					bound, pct = thousands(bd), fmt.Sprintf("%.0f%%", 100*r/bd)
				}
				ratio := ""
				if v != varPartition && len(base) > 0 {
					ratio = fmt.Sprintf("**%sx**", ratioText(r/median(base, rate)))
				}
				viol := thousands(median(rs, func(r childResult) float64 { return float64(r.KeyViolations) }))
				if v == varNone {
					viol += " (none promised)"
				}
				name := b.variantName(v)
				if n := len(rs); n < b.o.concRounds {
					name += fmt.Sprintf(" (%d runs)", n)
				}
				inFlight := "—"
				if sampled := samples(rs); len(sampled) > 0 {
					inFlight = thousands(median(sampled, func(r childResult) float64 { return r.MeanInFlight }))
				}
				p("| %s | %s | %s [%s-%s] | %s | %s | %s | %.2f | %.0f | %s | %s | %s |\n", handlerName(h), name, thousands(r), thousands(lo), thousands(hi),
					bound, pct, ratio, median(rs, cpuPerM), median(rs, func(r childResult) float64 { return mib(r.MaxRSS) }), inFlight, viol,
					time.Duration(median(rs, func(r childResult) float64 { return float64(r.Stop) })).Round(10*time.Millisecond))
			}
		}
		p("\n")
	}
	if len(c.stuck) > 0 {
		p("Stuck messages: %s, `MaxWindow` %s (the least for which every partition, given its keys, holds %s completed messages above "+
			"its first one when its window is full: the later messages of the stuck key wait in the window too), no-op handler. In the "+
			"stuck run the first message of each partition blocks in its Handler call; the run ends when `Stats` shows every "+
			"partition's window full (`WindowFull`) with at least %s messages completed above it (`CompletedAhead`), then releases "+
			"them. Its twin without stuck messages has the same Config and ends once it handled as many messages as the stuck run did. "+
			"Peak RSS is the child's VmHWM when the window closed (the shutdown left out); medians of %d round(s).\n\n",
			b.variantName(varKey), thousands(float64(c.maxWindow)), thousands(float64(b.o.concStuckAhead)), thousands(float64(b.o.concStuckAhead)), len(c.stuck))
		p("| run | messages handled | `CompletedAhead` per partition, least | `CompletedAhead`, all partitions | `Waiting`, all partitions | peak RSS MiB [min-max] |\n")
		p("|---|---:|---:|---:|---:|---:|\n")
		for _, row := range []struct {
			label string
			rs    []childResult
			stuck bool
		}{{"first message of each partition stuck", c.stuck, true}, {"no stuck message", c.free, false}} {
			rss := func(r childResult) float64 { return mib(r.WindowRSS) }
			lo, hi := minMax(row.rs, rss)
			least, all, waiting := "—", "—", "—"
			if row.stuck {
				least = thousands(median(row.rs, func(r childResult) float64 { return float64(r.AheadMin) }))
				all = thousands(median(row.rs, func(r childResult) float64 { return float64(r.AheadSum) }))
				waiting = thousands(median(row.rs, func(r childResult) float64 { return float64(r.WaitingSum) }))
			}
			p("| %s | %s | %s | %s | %s | %.0f [%.0f-%.0f] |\n", row.label, thousands(median(row.rs, func(r childResult) float64 { return float64(r.Messages) })),
				least, all, waiting, median(row.rs, rss), lo, hi)
		}
		p("\n")
	}
	b.concurrencyTargets(w)
}

// samples keeps the runs whose window was long enough for a sample of
// Stats (MeanInFlight -1: none).
func samples(rs []childResult) []childResult {
	var out []childResult
	for _, r := range rs {
		if r.MeanInFlight >= 0 {
			out = append(out, r)
		}
	}
	return out
}

func keysPerPartition(b *bench) string {
	lo, hi := b.keysIn(b.o.partitions-1), b.keysIn(0)
	if lo == hi {
		return thousands(float64(lo))
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

// windowsText names each handler's window.
func (b *bench) windowsText() string {
	var s []string
	for _, h := range b.o.concHandlers {
		if h != handlerNoop {
			s = append(s, fmt.Sprintf("%s %s", handlerName(h), b.o.concWindows[h]))
		}
	}
	return strings.Join(s, ", ")
}

// concurrencyTargets checks issue 10's targets against this run's figures.
func (b *bench) concurrencyTargets(w *strings.Builder) {
	c := &b.conc
	var rows [][3]string
	add := func(target, measured string, ok bool) {
		verdict := "met"
		if !ok {
			verdict = "**missed**"
		}
		rows = append(rows, [3]string{target, measured, verdict})
	}
	key := b.variantName(varKey)
	runs := func(h, v string) []childResult { return c.runs[concKey{h, v}] }

	// 1 ms: OrderKey >= 100,000 msgs/s (kfake) and >= 15x OrderPartition.
	if k := runs(handlerSleep, varKey); len(k) > 0 {
		r := median(k, rate)
		t := fmt.Sprintf("1 ms handler: %s >= 100,000 msgs/s", key)
		if b.broker.real {
			rows = append(rows, [3]string{t + " (a kfake target: on a real broker the figure is reported)", thousands(r) + " msgs/s", "reported"})
		} else {
			add(t, thousands(r)+" msgs/s", r >= 100_000)
		}
		if p := runs(handlerSleep, varPartition); len(p) > 0 {
			v := r / median(p, rate)
			add(fmt.Sprintf("1 ms handler: %s msgs/s >= 15x `OrderPartition`'s", key), fmt.Sprintf("%.1fx", v), v >= 15)
		}
	}
	// 20 ms: OrderKey >= 50x OrderPartition.
	if k, p := runs(handlerSleep20, varKey), runs(handlerSleep20, varPartition); len(k) > 0 && len(p) > 0 {
		v := median(k, rate) / median(p, rate)
		add(fmt.Sprintf("20 ms handler: %s msgs/s >= 50x `OrderPartition`'s", key), fmt.Sprintf("%.1fx", v), v >= 50)
	}
	// 100 ms: OrderKey >= 90% of the key bound.
	if k := runs(handlerSleep100, varKey); len(k) > 0 {
		r := median(k, rate)
		keyBound := float64(b.o.concKeys) / handlerLatency(handlerSleep100).Seconds()
		add(fmt.Sprintf("100 ms handler: %s >= %s msgs/s, 90%% of the %s-key bound (%s keys / 100 ms = %s msgs/s)", key,
			thousands(0.9*keyBound), thousands(float64(b.o.concKeys)), thousands(float64(b.o.concKeys)), thousands(keyBound)),
			fmt.Sprintf("%s msgs/s, %.1f%% of the bound", thousands(r), 100*r/keyBound), r >= 0.9*keyBound)
	}
	// No-op: OrderPartition here against the main table's tidemark; OrderKey's
	// CPU per message against OrderPartition's.
	if p := runs(handlerNoop, varPartition); len(p) > 0 {
		t := fmt.Sprintf("no-op handler: `OrderPartition` on this topic loses nothing against the main table's tidemark (%d B, no-op) in this run, "+
			"within noise: msgs/s median ratio >= 0.95, or the [min-max] ranges overlap", concValueSize)
		if m := b.tput[runKey{concValueSize, handlerNoop, consTidemark}]; len(m) > 0 {
			pr, mr := median(p, rate), median(m, rate)
			plo, phi := minMax(p, rate)
			mlo, mhi := minMax(m, rate)
			v := pr / mr
			add(t, fmt.Sprintf("%.2fx (%s [%s-%s] vs %s [%s-%s])", v, thousands(pr), thousands(plo), thousands(phi), thousands(mr), thousands(mlo), thousands(mhi)),
				v >= 0.95 || (phi >= mlo && plo <= mhi))
		} else {
			rows = append(rows, [3]string{t, "not measured: the main table did not run (`-sections throughput`, `-sizes` with 100, `-handlers` with noop)", "—"})
		}
		if k := runs(handlerNoop, varKey); len(k) > 0 {
			v := median(k, cpuPerM) / median(p, cpuPerM)
			add(fmt.Sprintf("no-op handler: %s CPU per message <= 2x `OrderPartition`'s", key), fmt.Sprintf("%.2fx", v), v <= 2)
		}
	}
	// Memory with a stuck message per partition.
	if len(c.stuck) > 0 && len(c.stuck) == len(c.free) {
		diffs := make([]childResult, len(c.stuck))
		least := int64(math.MaxInt64)
		for i := range c.stuck {
			diffs[i].WindowRSS = c.stuck[i].WindowRSS - c.free[i].WindowRSS
			least = min(least, c.stuck[i].AheadMin)
		}
		d := median(diffs, func(r childResult) float64 { return mib(r.WindowRSS) })
		if math.Round(d) == 0 {
			d = 0 // not -0
		}
		s := median(c.stuck, func(r childResult) float64 { return mib(r.WindowRSS) })
		f := median(c.free, func(r childResult) float64 { return mib(r.WindowRSS) })
		add(fmt.Sprintf("peak RSS with %d x %s messages completed above a stuck offset (%s, `MaxWindow` %s), minus the same run without stuck messages handling as many: < 100 MiB",
			b.o.partitions, thousands(float64(b.o.concStuckAhead)), key, thousands(float64(c.maxWindow))),
			fmt.Sprintf("%+.0f MiB (median of the rounds' differences; %.0f vs %.0f MiB; `CompletedAhead` >= %s in every partition)", d, s, f, thousands(float64(least))),
			d < 100 && least >= int64(b.o.concStuckAhead))
	}
	if len(rows) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("### Targets: concurrency inside a partition (ratios from this run)\n\n| target | measured | |\n|---|---:|---|\n")
	for _, r := range rows {
		p("| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	p("\n")
}
