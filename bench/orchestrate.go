package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/framework"
)

// bench is one run of the orchestrator.
type bench struct {
	o      *options
	log    io.Writer
	runID  string
	tmp    string
	broker *broker
	prod   *producer

	started   time.Time
	finished  time.Time
	brokerVer string
	usage0    usage
	usage1    usage

	topics     map[int]string // value size -> preloaded topic
	preloadDur map[int]time.Duration
	tput       map[runKey][]childResult
	lat        map[runKey][]childResult
	latRate    map[string]float64 // handler -> messages/s of the latency runs
	latSize    int
	startup    []startupRun
	// startupLeaders is the number of brokers leading the startup topic's
	// partitions (metadata): the idle fetch requests are per broker.
	startupLeaders int
	conc           concurrencyRuns
	replay         replayRuns
	met            metricsRuns
	txn            txnRuns
	moves          leaderMoveRuns
	rebalance      rebalanceRuns
	wide           wideRuns
	restore        restoreRuns
	notes          []string
}

// runKey names one cell of the tables.
type runKey struct {
	size     int
	handler  string
	consumer string
}

type startupRun struct {
	label string
	// budget is the run's Config.MaxBufferedBytes.
	budget int
	res    childResult
}

// defaultBufferBytes is framework.Config.MaxBufferedBytes's default.
const defaultBufferBytes = 16 << 20

func newBench(o *options, log io.Writer) (*bench, error) {
	tmp, err := os.MkdirTemp("", "tidemark-bench-")
	if err != nil {
		return nil, err
	}
	b := &bench{
		o:          o,
		log:        log,
		runID:      fmt.Sprintf("%d", time.Now().UnixNano()%1e10),
		tmp:        tmp,
		topics:     map[int]string{},
		preloadDur: map[int]time.Duration{},
		tput:       map[runKey][]childResult{},
		lat:        map[runKey][]childResult{},
		latRate:    map[string]float64{},
	}
	if len(o.sizes) > 0 {
		b.latSize = o.sizes[0]
	}
	return b, nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (b *bench) sectionKey() string {
	if len(b.o.brokers) > 0 {
		return "kafka"
	}
	return "kfake"
}

func (b *bench) close() error {
	var err error
	if b.prod != nil {
		b.prod.close()
	}
	if b.broker != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err = b.broker.close(ctx)
		cancel()
	}
	if rerr := os.RemoveAll(b.tmp); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func (b *bench) run(ctx context.Context) error {
	b.started = time.Now()
	b.usage0 = readUsage()
	var err error
	if b.broker, err = startBroker(b.o.brokers); err != nil {
		return err
	}
	b.brokerVer = b.broker.version(ctx)
	b.logf("broker %s at %s (%s)", b.sectionKey(), strings.Join(b.broker.addrs, ","), b.brokerVer)
	if b.prod, err = newProducer(b.broker.addrs, b.o.batchBytes, 0, b.o.codec); err != nil {
		return err
	}
	if b.o.runs(sectionThroughput) {
		if err := b.preload(ctx); err != nil {
			return err
		}
		if err := b.throughput(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionLatency) {
		if err := b.latency(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionStartup) {
		if err := b.startupPhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionConcurrency) {
		if err := b.concurrencyPhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionReplay) {
		if err := b.replayPhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionMetrics) {
		if err := b.metricsPhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionTransactions) {
		if err := b.transactionsPhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionLeaderMoves) {
		if err := b.leaderMovesPhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionRebalance) {
		if err := b.rebalancePhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionWide) {
		if err := b.widePhase(ctx); err != nil {
			return err
		}
	}
	if b.o.runs(sectionRestore) {
		if err := b.restorePhase(ctx); err != nil {
			return err
		}
	}
	b.usage1 = readUsage()
	b.finished = time.Now()
	return nil
}

func (b *bench) perPartition() int64 { return b.o.messages / int64(b.o.partitions) }

// total is the number of messages actually preloaded per size (a multiple
// of the partitions).
func (b *bench) total() int64 { return b.perPartition() * int64(b.o.partitions) }

func (b *bench) preload(ctx context.Context) error {
	for _, size := range b.o.sizes {
		topic := fmt.Sprintf("tidemark-bench-%s-%dB", b.runID, size)
		start := time.Now()
		if err := b.broker.createTopic(ctx, topic, b.o.partitions); err != nil {
			return err
		}
		if err := b.prod.preload(ctx, b.broker, topic, b.o.partitions, b.perPartition(), size, b.perPartition(), nil); err != nil {
			return err
		}
		b.topics[size] = topic
		b.preloadDur[size] = time.Since(start)
		b.logf("preloaded %s: %d x %d messages of %d bytes in %s", topic, b.o.partitions, b.perPartition(), size, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// rotate returns the consumers in the order of round r: each round starts
// one further down the list, so no consumer always runs first or right
// after the same neighbour.
func rotate(list []string, r int) []string {
	out := make([]string, 0, len(list))
	for i := range list {
		out = append(out, list[(i+r)%len(list)])
	}
	return out
}

func (b *bench) throughput(ctx context.Context) error {
	for r := 0; r < b.o.rounds; r++ {
		for _, size := range b.o.sizes {
			for _, h := range b.o.handlers {
				for _, c := range rotate(b.o.consumers, r) {
					if c == consKafkaPerf && h != handlerNoop {
						continue // no handler to run
					}
					u0 := readUsage()
					res, err := b.throughputRun(ctx, r, size, h, c)
					if err != nil {
						return fmt.Errorf("round %d, %d B, %s, %s: %w", r+1, size, h, c, err)
					}
					u1 := readUsage()
					k := runKey{size, h, c}
					b.tput[k] = append(b.tput[k], res)
					// A round slow at the same CPU per message, with steal or
					// memory stalls beside it, was slowed by the machine; with
					// kfake, this process's CPU is the broker's.
					b.logf("round %d/%d %5dB %-8s %-15s %10.0f msgs/s  %6.2f CPU s/M  %6.2f allocs/msg  %7.0f B/msg  %5.0f MiB RSS  (%d msgs in %s; %s; this process: CPU %.2f s over the run)",
						r+1, b.o.rounds, size, h, c, rate(res), cpuPerM(res), perMsg(float64(res.Mallocs), res), perMsg(float64(res.Bytes), res),
						mib(res.MaxRSS), res.Messages, res.Window.Round(time.Millisecond), disturbed(u0, u1), (u1.self - u0.self).Seconds())
				}
			}
		}
	}
	return nil
}

func (b *bench) group(kind string) string {
	return fmt.Sprintf("tidemark-bench-%s-%s-%d", b.runID, kind, time.Now().UnixNano()%1e9)
}

func (b *bench) throughputRun(ctx context.Context, round, size int, h, c string) (childResult, error) {
	if c == consKafkaPerf {
		return b.kafkaPerf(ctx, b.topics[size], b.total())
	}
	dir, err := os.MkdirTemp(b.tmp, c+"-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	window := b.o.maxWindow
	if h == handlerSleep && b.o.sleepWindow > 0 {
		window = b.o.sleepWindow
	}
	sp := childSpec{
		Mode:          modeThroughput,
		Consumer:      c,
		Handler:       h,
		Brokers:       b.broker.addrs,
		Topic:         b.topics[size],
		Partitions:    b.o.partitions,
		Want:          b.total(),
		MaxWindow:     window,
		FlushInterval: b.o.flushInterval,
		Group:         b.group(c),
		Dir:           dir,
		Timeout:       b.o.timeout,
	}
	b.debugFiles(&sp, fmt.Sprintf("%s-%dB-%s-r%d", c, size, h, round+1))
	return b.child(ctx, sp, nil)
}

// debugFiles sets the CPU profile and log file of a child, as -profile and
// -log ask.
func (b *bench) debugFiles(sp *childSpec, name string) {
	abs := func(dir, ext string) string {
		p := filepath.Join(dir, name+ext)
		if a, err := filepath.Abs(p); err == nil {
			return a
		}
		return p
	}
	if b.o.profileDir != "" {
		sp.CPUProfile = abs(b.o.profileDir, ".pprof")
	}
	if b.o.logDir != "" && isTidemark(sp.Consumer) {
		sp.LogFile = abs(b.o.logDir, ".log")
	}
}

// latency runs every consumer on messages produced at a fixed rate.
func (b *bench) latency(ctx context.Context) error {
	if b.o.latencyDuration <= 0 || len(b.o.sizes) == 0 {
		return nil
	}
	for _, h := range b.o.handlers {
		b.latRate[h] = b.latencyRateFor(h)
		if b.latRate[h] <= 0 {
			return fmt.Errorf("no rate for the %s latency runs (no throughput figure)", h)
		}
	}
	for r := 0; r < b.latencyRounds(); r++ {
		for _, h := range b.o.handlers {
			for _, c := range rotate(b.o.consumers, r) {
				if c == consKafkaPerf {
					continue // it measures no latency
				}
				res, err := b.latencyRun(ctx, r, h, c)
				if err != nil {
					return fmt.Errorf("latency round %d, %s, %s: %w", r+1, h, c, err)
				}
				k := runKey{b.latSize, h, c}
				b.lat[k] = append(b.lat[k], res)
				b.logf("latency round %d/%d %-8s %-15s at %.0f msgs/s: p50 %s p99 %s max %s (%d msgs), %.0f%% of a CPU", r+1, b.latencyRounds(), h, c,
					b.latRate[h], res.LatP50.Round(time.Microsecond), res.LatP99.Round(time.Microsecond), res.LatMax.Round(time.Microsecond), res.LatN, 100*cores(res))
			}
		}
	}
	return nil
}

func (b *bench) latencyRounds() int { return max(1, min(b.o.rounds, b.o.latencyRounds)) }

// latencyRateFor is -latency-rate, or half the median msgs/s of the slowest
// peer (not tidemark) with handler h on the latency size.
func (b *bench) latencyRateFor(h string) float64 {
	if b.o.latencyRate > 0 {
		return b.o.latencyRate
	}
	slowest := math.Inf(1)
	for _, peersOnly := range []bool{true, false} {
		for _, c := range b.o.consumers {
			if c == consKafkaPerf || (peersOnly && isTidemark(c)) {
				continue
			}
			if rs := b.tput[runKey{b.latSize, h, c}]; len(rs) > 0 {
				slowest = math.Min(slowest, median(rs, rate))
			}
		}
		if !math.IsInf(slowest, 1) {
			return math.Floor(slowest / 2)
		}
	}
	return 0
}

func isTidemark(c string) bool { return c == consTidemark || c == consTidemarkNoSync }

func (b *bench) latencyRun(ctx context.Context, round int, h, c string) (childResult, error) {
	topic := fmt.Sprintf("tidemark-bench-%s-lat-%s-%s-%d", b.runID, h, c, round+1)
	if err := b.broker.createTopic(ctx, topic, b.o.partitions); err != nil {
		return childResult{}, err
	}
	if err := b.prod.warmup(ctx, topic, b.o.partitions, b.latSize); err != nil {
		return childResult{}, fmt.Errorf("warm-up messages: %w", err)
	}
	dir, err := os.MkdirTemp(b.tmp, c+"-")
	if err != nil {
		return childResult{}, err
	}
	defer os.RemoveAll(dir)
	rateH := b.latRate[h]
	n := int64(math.Max(1, math.Round(rateH*b.o.latencyDuration.Seconds())))
	sp := childSpec{
		Mode:          modeLatency,
		Consumer:      c,
		Handler:       h,
		Brokers:       b.broker.addrs,
		Topic:         topic,
		Partitions:    b.o.partitions,
		Want:          n,
		FlushInterval: b.o.flushInterval,
		Group:         b.group(c),
		Dir:           dir,
		Timeout:       b.o.timeout,
	}
	b.debugFiles(&sp, fmt.Sprintf("latency-%s-%s-r%d", c, h, round+1))
	var achieved float64
	res, err := b.child(ctx, sp, func(ctx context.Context) error {
		var err error
		achieved, err = b.prod.paced(ctx, topic, b.o.partitions, b.latSize, n, rateH)
		return err
	})
	if err != nil {
		return res, err
	}
	if achieved < 0.9*rateH {
		b.notes = append(b.notes, fmt.Sprintf("latency run %s/%s round %d: the producer reached only %.0f of %.0f msgs/s", h, c, round+1, achieved, rateH))
	}
	return res, nil
}

// startupPhase: a topic of many partitions; tidemark consumes it from an
// empty offset file (cold), then, after more messages were produced,
// restarts on the same file and group (warm: a record per partition to
// reconcile), and once more with a smaller MaxBufferedBytes. After each
// backlog, the child counts the fetch requests of the idle consumer.
func (b *bench) startupPhase(ctx context.Context) error {
	if b.o.startupPartitions <= 0 || !contains(b.o.consumers, consTidemark) {
		return nil
	}
	parts, per := b.o.startupPartitions, b.o.startupMessages
	topic := fmt.Sprintf("tidemark-bench-%s-startup-%dp", b.runID, parts)
	if err := b.broker.createTopic(ctx, topic, parts); err != nil {
		return err
	}
	var err error
	if b.startupLeaders, err = b.broker.leaders(ctx, topic); err != nil {
		return err
	}
	file := filepath.Join(b.tmp, "startup-offsets.db")
	group := b.group("startup")
	runs := []struct {
		label  string
		budget int // 0: the default
	}{
		{"cold: empty offset file, nothing committed", 0},
		{"restart: offset file with a record per partition", 0},
	}
	if n := b.o.startupBufferBytes; n > 0 {
		runs = append(runs, struct {
			label  string
			budget int
		}{fmt.Sprintf("restart again, `MaxBufferedBytes` %s", bytesText(n)), n})
	}
	for i, r := range runs {
		// Every run starts with a backlog of per messages per partition.
		if err := b.prod.preload(ctx, b.broker, topic, parts, per, 100, int64(i+1)*per, nil); err != nil {
			return err
		}
		sp := childSpec{
			Mode:             modeStartup,
			Consumer:         consTidemark,
			Handler:          handlerNoop,
			Brokers:          b.broker.addrs,
			Topic:            topic,
			Partitions:       parts,
			Want:             int64(parts) * per,
			StartAt:          int64(i) * per,
			Group:            group,
			OffsetFile:       file,
			Dir:              b.tmp,
			Timeout:          b.o.timeout,
			MaxBufferedBytes: r.budget,
			IdleWindow:       b.o.startupIdleWindow,
		}
		b.debugFiles(&sp, fmt.Sprintf("startup-%dp-%d", parts, i+1))
		res, err := b.child(ctx, sp, nil)
		if err != nil {
			return fmt.Errorf("startup phase (%s): %w", r.label, err)
		}
		budget := r.budget
		if budget == 0 {
			budget = defaultBufferBytes
		}
		b.startup = append(b.startup, startupRun{label: r.label, budget: budget, res: res})
		b.logf("startup %d partitions, %s: joined %s, all reconciled %s, all running %s, then %d msgs at %.0f msgs/s, peak buffered %.1f MiB, peak RSS %.0f MiB, %d open fds; idle: %d fetch requests in %s (%.1f/s per broker of %d), %.1f%% of a CPU",
			parts, r.label, res.Joined.Round(time.Millisecond), res.Reconciled.Round(time.Millisecond), res.Ready.Round(time.Millisecond),
			res.Messages, rate(res), mib(res.PeakBuffered), mib(res.MaxRSS), res.OpenFDs,
			res.IdleRequests, res.IdleWindow.Round(time.Millisecond), b.idleRate(res), b.startupLeaders, 100*idleCores(res))
	}
	return nil
}

// idleRate is a startup run's fetch requests per second and per broker
// over its idle window; NaN when not measured.
func (b *bench) idleRate(r childResult) float64 {
	if r.IdleWindow <= 0 {
		return math.NaN()
	}
	return float64(r.IdleRequests) / r.IdleWindow.Seconds() / float64(max(b.startupLeaders, 1))
}

// idleCores is the CPU a startup run used over its idle window, in CPUs.
func idleCores(r childResult) float64 {
	if r.IdleWindow <= 0 {
		return math.NaN()
	}
	return r.IdleCPU.Seconds() / r.IdleWindow.Seconds()
}

// bytesText is n bytes in MiB or KiB when it is a whole number of them.
func bytesText(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// child runs one child process with sp and returns its result, with its
// peak RSS and whole-life CPU from wait4. onReady, if set, runs when the
// child prints READY; the child is killed if it fails.
func (b *bench) child(ctx context.Context, sp childSpec, onReady func(context.Context) error) (childResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return childResult{}, err
	}
	spec, err := json.Marshal(sp)
	if err != nil {
		return childResult{}, err
	}
	if b.broker.fake != nil {
		// kfake holds every preloaded topic in this process's heap (GBs):
		// a collection it owes from the run before (kafka-go-sync's leaves
		// the most) would land in the next run and slow its consumer, by up
		// to 3x at 100 B. Each run starts with none owed.
		runtime.GC()
	}
	cctx, cancel := context.WithTimeout(ctx, sp.Timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, exe)
	cmd.Env = append(os.Environ(), envChild+"="+string(spec))
	var stderr tailBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return childResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return childResult{}, err
	}
	var (
		res    childResult
		got    bool
		runErr error
	)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "READY" && onReady != nil:
			if err := onReady(cctx); err != nil {
				runErr = err
				cancel()
			}
		case strings.HasPrefix(line, "RESULT "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &res); err != nil {
				runErr = fmt.Errorf("decoding the child's result: %w", err)
			}
			got = true
		}
	}
	werr := cmd.Wait()
	if runErr != nil {
		return res, runErr
	}
	if werr != nil || !got {
		return res, fmt.Errorf("child %s: %v; its stderr ends with:\n%s", sp.Consumer, werr, stderr.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.ProcCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if res.OutOfOrder != 0 {
		return res, fmt.Errorf("child %s saw %d messages out of order or repeated", sp.Consumer, res.OutOfOrder)
	}
	if sp.Keys > 0 && sp.Ordering != framework.OrderNone && res.KeyViolations != 0 {
		return res, fmt.Errorf("child %s (%s) saw %d calls break their key's order", sp.Consumer, sp.Ordering, res.KeyViolations)
	}
	if sp.Mode != modeLatency && res.Messages <= 0 {
		return res, fmt.Errorf("child %s handled no message in its window", sp.Consumer)
	}
	return res, nil
}

// tailBuffer keeps the last 8 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if t.buf.Len() > 16<<10 {
		tail := append([]byte(nil), t.buf.Bytes()[t.buf.Len()-8<<10:]...)
		t.buf.Reset()
		t.buf.Write(tail)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

// Per-result figures.

func rate(r childResult) float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Messages) / r.Window.Seconds()
}

func cpuPerM(r childResult) float64 {
	if r.Messages == 0 {
		return 0
	}
	return r.CPU.Seconds() / float64(r.Messages) * 1e6
}

func perMsg(v float64, r childResult) float64 {
	if r.Messages == 0 {
		return 0
	}
	return v / float64(r.Messages)
}

// cores is the CPU a run used over its window, in CPUs.
func cores(r childResult) float64 {
	if r.Window <= 0 {
		return 0
	}
	return r.CPU.Seconds() / r.Window.Seconds()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// median of f over rs.
func median(rs []childResult, f func(childResult) float64) float64 {
	if len(rs) == 0 {
		return math.NaN()
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
