package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/framework"
)

// envChild carries a childSpec, as JSON, to a child process: the bench
// binary re-executes itself with it set, and main (or TestMain) runs the
// child instead of the orchestrator.
const envChild = "TIDEMARK_BENCH_CHILD"

// Child modes.
const (
	modeThroughput = "throughput" // consume a preloaded topic as fast as possible
	modeLatency    = "latency"    // consume messages produced at a fixed rate; record end-to-end latency
	modeStartup    = "startup"    // tidemark only: time to join and reconcile every partition, then consume
	modeScrape     = "scrape"     // tidemark only: consume the backlog, then measure scrapes of metrics.Handler (metrics_child.go)
	modeWide       = "wide"       // consume a wide topic, printing every value; then, with IdleWindow, the idle fetch rate (wide_child.go)
	modeRestore    = "restore"    // tidemark only: fill a state changelog, or restore from it into an empty file (restore_child.go)
)

// Handler modes. The main tables run noop and sleep1ms; the concurrency
// section all four.
const (
	handlerNoop     = "noop"
	handlerSleep    = "sleep1ms"
	handlerSleep20  = "sleep20ms"
	handlerSleep100 = "sleep100ms"
)

// handlerLatency is how long a handler mode sleeps per message.
func handlerLatency(h string) time.Duration {
	switch h {
	case handlerSleep:
		return time.Millisecond
	case handlerSleep20:
		return 20 * time.Millisecond
	case handlerSleep100:
		return 100 * time.Millisecond
	}
	return 0
}

// Value kinds, the first byte of every value the orchestrator produces.
const (
	valueThroughput = 'T'
	valueWarmup     = 'W' // latency mode: one per partition before the paced messages
	valueLatency    = 'L' // latency mode: followed by the send time, UnixNano, big endian
)

// childSpec is what one child process does.
type childSpec struct {
	Mode       string
	Consumer   string
	Handler    string
	Brokers    []string
	Topic      string
	Partitions int
	// Want is how many messages to handle: the whole topic (throughput,
	// startup) or the paced messages (latency; warm-up messages not counted).
	Want int64
	// MaxWindow ends a throughput run this long after its first message,
	// even if fewer than Want messages were handled. 0: no limit.
	MaxWindow time.Duration
	Group     string
	// StartAt is the first offset expected in every partition.
	StartAt int64
	// OffsetFile is tidemark's offset file; Dir/offsets.db when empty.
	OffsetFile string
	Dir        string
	// Timeout bounds the whole child, group join and shutdown included.
	Timeout time.Duration
	// CPUProfile, when set, is written with a CPU profile of the measured
	// window (startup mode: from before framework.New to every partition
	// running).
	CPUProfile string
	// MaxBufferedBytes and FlushInterval, when set, are tidemark's Config
	// fields of the same names.
	MaxBufferedBytes int
	FlushInterval    time.Duration
	// IdleWindow (startup mode): once the backlog is handled, how long to
	// count fetch requests with every partition idle. 0: not measured.
	IdleWindow time.Duration
	// LogFile, when set, receives tidemark's log (debug level, JSON).
	LogFile string

	// The concurrency section (tidemark only; see concurrency.go).
	// Ordering, MaxInFlight and ConfigMaxWindow are tidemark's
	// Config.Ordering, MaxInFlight and MaxWindow (0: its defaults).
	Ordering        framework.Ordering
	MaxInFlight     int
	ConfigMaxWindow int
	// Keys, when above 0, selects the keyed handler: every message carries
	// a key, the decimal number of one of Keys keys, key k in partition
	// k % Partitions; the handler checks each key's order (see seeKeyed)
	// and sleeps as Handler says, concurrently as Ordering allows.
	// PerPartition is the topic's messages per partition (from StartAt):
	// the repeat check's size.
	Keys         int
	PerPartition int64
	// StuckAhead, when above 0, makes the first message of each partition
	// block in its Handler call until the window ends, which is when Stats
	// shows, for every partition, a full window with at least StuckAhead
	// messages completed above that message (Want is then not used).
	StuckAhead int

	// The replay section (tidemark only; see replay.go). MaxUndurable is
	// tidemark's Config.MaxUndurable (0: its default); with CountWrites
	// the child counts the offset file's flushes over the window
	// (childResult.FileWrites).
	MaxUndurable int
	CountWrites  bool

	// The metrics section (tidemark only; see metrics.go). Metrics
	// (throughput mode) serves metrics.Handler and scrapes it every
	// second; Scrapes (scrape mode) is the number of scrapes measured.
	Metrics bool
	Scrapes int

	// The transactions section (see transactions.go). ReadCommitted reads
	// at read_committed (tidemark's Config.IsolationLevel, franz-go's
	// FetchIsolationLevel); Sequenced checks each value's sequence number
	// instead of contiguous offsets (sink.checkSequenced).
	ReadCommitted bool
	Sequenced     bool

	// The restore section (see restore.go): without Restore the child
	// fills the changelog (PerPartition messages per partition, from
	// StartAt); with it, it restores the state into an empty offset file.
	Restore bool
}

// childResult is what a child reports, as one "RESULT {json}" line on its
// stdout. The orchestrator adds what it learns from wait4.
type childResult struct {
	// Messages handled in the window; Window from the first message
	// handled to the last (or to MaxWindow).
	Messages int64
	Window   time.Duration
	// CPU is the child's user+system CPU time over the window (getrusage
	// RUSAGE_SELF, every thread); Mallocs and Bytes the heap allocations over
	// the window (runtime.MemStats).
	CPU     time.Duration
	Mallocs uint64
	Bytes   uint64
	// OutOfOrder counts messages whose offset was not the one after the
	// previous message of their partition: must be 0.
	OutOfOrder int64
	// Latency mode: percentiles of the end-to-end latency of the paced
	// messages.
	LatN                   int64
	LatP50, LatP99, LatMax time.Duration
	// Startup mode: from before framework.New to the consumer being a
	// member of a generation (Joined), to every partition's start position
	// decided by reconciliation (Reconciled), and to every partition's
	// goroutine running (Ready).
	Joined, Reconciled, Ready time.Duration
	// Startup mode: the peak of Stats().BufferedBytes, sampled every 10 ms
	// from framework.New to the last message handled; and, over IdleWindow
	// after that (every partition running, nothing left to fetch), the
	// fetch requests sent (Stats().FetchRequests), the window's actual
	// length and the CPU time spent in it.
	PeakBuffered int64
	IdleRequests uint64
	IdleWindow   time.Duration
	IdleCPU      time.Duration
	// OpenFDs is the number of file descriptors the child had open at the
	// end of the window: mostly its connections to the broker.
	OpenFDs int
	// MaxRSS is the child's peak RSS (VmHWM) when it reports; ProcCPU, set
	// by the orchestrator, its whole-life CPU time (wait4). WindowRSS is
	// VmHWM when the window closed: the shutdown left out.
	MaxRSS    int64
	ProcCPU   time.Duration
	WindowRSS int64
	// Stop is how long the consumer took to return once told to stop at
	// the window's end: its graceful shutdown (throughput mode).
	Stop time.Duration
	// Keyed handler (concurrency section): KeyViolations counts calls that
	// started while another call of the same key ran, or with an offset not
	// above the last one started for the key: 0 unless Ordering is
	// OrderNone. MeanInFlight is the mean of the messages in Handler calls
	// (Stats().InFlight summed over the partitions), sampled every 50 ms
	// over the window; -1 without a sample.
	KeyViolations int64
	MeanInFlight  float64
	// Stuck runs, when the window closed: the least and the sum over the
	// partitions of Stats().CompletedAhead, and the sum of Waiting and of
	// InFlight.
	AheadMin, AheadSum      int64
	WaitingSum, InFlightSum int64
	// FileWrites (CountWrites) is the number of the offset file's flushes
	// over the window (Stats.FlushLatency.Count: journal writes and
	// checkpoints); -1 when not counted.
	FileWrites int64
	// Scrape mode: Scrapes scrapes of metrics.Handler served back to back
	// took ScrapeCPU of the child's CPU and ScrapeWall; one exposition is
	// ScrapeBytes (ScrapeGzipBytes gzip-compressed) and Series series.
	// MetricsScrapes (throughput mode with Metrics) counts the scrapes
	// served during the run.
	Scrapes                      int
	ScrapeCPU, ScrapeWall        time.Duration
	ScrapeBytes, ScrapeGzipBytes int64
	Series                       int
	MetricsScrapes               int
	// Aborted (Spec.Sequenced) counts the records of aborted transactions
	// handed to the handler: must be 0.
	Aborted int64
	// Wide mode: LastAt is when the last wanted message was handled (the
	// orchestrator takes the time from the child's start to it); CPUAtEnd
	// the process's CPU time from its start to then; Printed the bytes of
	// values printed.
	LastAt   time.Time
	CPUAtEnd time.Duration
	Printed  int64
	// Restore mode: StateKeys counts the keys of every partition's state
	// once restored (read through ViewState); Messages is then the
	// changelog records the restore read; RestoreDurable the time from
	// the window's start to every partition's restored state durable.
	StateKeys      int64
	RestoreDurable time.Duration
}

// runChild is the child process: it runs one consumer as the spec says and
// prints its result.
func runChild(specJSON string, stdout io.Writer) error {
	var sp childSpec
	if err := json.Unmarshal([]byte(specJSON), &sp); err != nil {
		return fmt.Errorf("child: decoding %s: %w", envChild, err)
	}
	if sp.Timeout <= 0 {
		sp.Timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), sp.Timeout)
	defer cancel()
	out := &lineWriter{w: stdout}
	var (
		res childResult
		err error
	)
	switch sp.Mode {
	case modeStartup:
		res, err = runStartup(ctx, &sp, out)
	case modeScrape:
		res, err = runScrape(ctx, &sp, out)
	case modeWide:
		res, err = runWide(ctx, &sp, out)
	case modeRestore:
		res, err = runRestore(ctx, &sp, out)
	default:
		res, err = runConsumer(ctx, &sp, out)
	}
	if err != nil {
		return fmt.Errorf("child %s (%s, %s): %w", sp.Consumer, sp.Mode, sp.Handler, err)
	}
	res.MaxRSS = peakRSS()
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return out.line("RESULT " + string(b))
}

// lineWriter serializes the lines a child prints.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) line(s string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := io.WriteString(l.w, s+"\n")
	return err
}

// runConsumer runs the named consumer until the sink has what it wants,
// MaxWindow passed, or the timeout; then stops the consumer and waits for it.
func runConsumer(ctx context.Context, sp *childSpec, out *lineWriter) (childResult, error) {
	run, ok := consumers[sp.Consumer]
	if !ok {
		return childResult{}, fmt.Errorf("unknown consumer %q", sp.Consumer)
	}
	s := newSink(sp, out)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- run(cctx, sp, s) }()

	err := s.wait(ctx, ran)
	stopped := time.Now()
	stop()
	if err != nil {
		if errors.Is(err, errConsumerReturned) {
			return childResult{}, err
		}
		<-ran
		return childResult{}, err
	}
	if err := <-ran; err != nil {
		return childResult{}, fmt.Errorf("stopping the consumer: %w", err)
	}
	took := time.Since(stopped)
	res, err := s.result()
	res.Stop = took
	return res, err
}

var errConsumerReturned = errors.New("the consumer returned before handling every message")

// sink is the handler every consumer calls: it applies the handler mode,
// checks the order of offsets, counts, and takes the measurements at the
// first and the last message.
type sink struct {
	sp      *childSpec
	out     *lineWriter
	sleep   bool
	latency bool
	parts   []partCount

	n         atomic.Int64
	firstOnce sync.Once
	first     chan struct{}
	endOnce   sync.Once
	done      chan struct{}
	bad       atomic.Int64 // partitions outside [0, Partitions)

	t0, t1     time.Time
	cpu0, cpu1 time.Duration
	mem0, mem1 runtime.MemStats
	n1         int64
	fds        int
	prof       *os.File
	profErr    error

	warm      atomic.Int64
	readyOnce sync.Once
	readyErr  error
	lat       []int64
	latN      atomic.Int64

	keyed                  // the keyed handler's state (concurrency_child.go)
	scrapes   atomic.Int64 // metrics scrapes served (Spec.Metrics)
	windowRSS int64
	// flushes, set before the consumer runs (CountWrites), counts the
	// offset file's flushes so far; flush0 and flush1 are its values at
	// the window's start and end, -1 if not counted.
	flushes        func() int64
	flush0, flush1 int64
	seq            bool         // Spec.Sequenced
	aborted        atomic.Int64 // records of aborted transactions seen (Spec.Sequenced)
	// print, when set, is given every value first (wide mode: printed
	// through a buffered writer, as a program that prints its input would).
	print func(value []byte)
}

// partCount is one partition's counters, one cache line each: partitions
// are handled on different goroutines.
type partCount struct {
	next, bad int64
	seq       int64 // the next committed sequence number (Spec.Sequenced)
	warm      bool
	_         [39]byte
}

func newSink(sp *childSpec, out *lineWriter) *sink {
	s := &sink{
		sp:      sp,
		out:     out,
		sleep:   sp.Handler == handlerSleep,
		latency: sp.Mode == modeLatency,
		seq:     sp.Sequenced,
		parts:   make([]partCount, sp.Partitions),
		first:   make(chan struct{}),
		done:    make(chan struct{}),
	}
	for i := range s.parts {
		s.parts[i].next = sp.StartAt
	}
	if s.latency {
		s.lat = make([]int64, sp.Want)
	}
	if sp.Keys > 0 {
		s.keyed.init(sp)
	}
	return s
}

// see is the Handler: every consumer calls it once per message, in offset
// order within a partition. value may be reused by the consumer once see
// returns.
func (s *sink) see(partition int, offset int64, value []byte) {
	if s.print != nil {
		s.print(value)
	}
	if s.sleep {
		time.Sleep(time.Millisecond)
	}
	if partition < 0 || partition >= len(s.parts) {
		s.bad.Add(1)
		return
	}
	p := &s.parts[partition]
	if s.seq {
		s.checkSequenced(p, offset, value)
	} else if offset != p.next {
		p.bad++
	}
	p.next = offset + 1
	if s.latency {
		s.seeLatency(p, value)
		return
	}
	s.firstOnce.Do(s.begin)
	if s.n.Add(1) == s.sp.Want {
		s.end()
	}
}

// assigned is called by the consumers that tell when the group assigned
// them their partitions (tidemark, sarama, franz-go): the window starts
// there, or at the first message, whichever comes first, so that what a
// client fetches ahead before handing out its first message is inside the
// window.
func (s *sink) assigned() {
	if !s.latency {
		s.firstOnce.Do(s.begin)
	}
}

func (s *sink) seeLatency(p *partCount, value []byte) {
	if len(value) == 0 {
		return
	}
	switch value[0] {
	case valueWarmup:
		if !p.warm {
			p.warm = true
			if s.warm.Add(1) == int64(len(s.parts)) {
				// Every partition assigned and fetched: the orchestrator may
				// start the paced producer.
				s.readyOnce.Do(func() { s.readyErr = s.out.line("READY") })
			}
		}
	case valueLatency:
		if len(value) < 9 {
			return
		}
		sent := int64(binary.BigEndian.Uint64(value[1:9]))
		s.firstOnce.Do(s.begin)
		s.n.Add(1)
		i := s.latN.Add(1) - 1
		if i < int64(len(s.lat)) {
			s.lat[i] = time.Now().UnixNano() - sent
		}
		if i+1 == s.sp.Want {
			s.end()
		}
	}
}

// begin starts the measured window at the first message.
func (s *sink) begin() {
	if s.sp.CPUProfile != "" {
		s.prof, s.profErr = startProfile(s.sp.CPUProfile)
	}
	s.flush0 = s.flushCount()
	runtime.ReadMemStats(&s.mem0)
	s.cpu0 = selfCPU()
	s.t0 = time.Now()
	close(s.first)
}

// end closes the window, once: at the last wanted message, or at MaxWindow.
func (s *sink) end() {
	s.endOnce.Do(func() {
		s.t1 = time.Now()
		s.n1 = s.n.Load()
		s.cpu1 = selfCPU()
		s.flush1 = s.flushCount()
		s.fds = openFDs()
		s.windowRSS = peakRSS()
		runtime.ReadMemStats(&s.mem1)
		if s.prof != nil {
			writeHeapProfile(strings.TrimSuffix(s.sp.CPUProfile, ".pprof") + ".heap")
			pprof.StopCPUProfile()
			if err := s.prof.Close(); err != nil && s.profErr == nil {
				s.profErr = err
			}
		}
		close(s.done)
	})
}

// flushCount is the offset file's flushes so far if the spec counts its
// writes (flushes set), -1 otherwise.
func (s *sink) flushCount() int64 {
	if s.flushes == nil {
		return -1
	}
	return s.flushes()
}

// wait returns once the window closed, or with an error if the consumer
// returned first or ctx ended.
func (s *sink) wait(ctx context.Context, ran <-chan error) error {
	first := s.first
	var capped <-chan time.Time
	if s.latency {
		first = nil
	}
	for {
		select {
		case <-first:
			first = nil
			if s.sp.MaxWindow > 0 {
				t := time.NewTimer(s.sp.MaxWindow)
				defer t.Stop()
				capped = t.C
			}
		case <-capped:
			s.end()
			return nil
		case <-s.done:
			return nil
		case err := <-ran:
			if err == nil {
				err = errConsumerReturned
			} else {
				err = fmt.Errorf("%w: %w", errConsumerReturned, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("timed out after %s: %d of %d messages handled (latency: %d, warm partitions %d of %d)",
				s.sp.Timeout, s.n.Load(), s.sp.Want, s.latN.Load(), s.warm.Load(), len(s.parts))
		}
	}
}

func (s *sink) result() (childResult, error) {
	if s.profErr != nil {
		return childResult{}, s.profErr
	}
	if s.readyErr != nil {
		return childResult{}, s.readyErr
	}
	var r childResult
	for i := range s.parts {
		r.OutOfOrder += s.parts[i].bad
	}
	r.OutOfOrder += s.bad.Load()
	if s.sp.Keys > 0 {
		s.keyed.result(&r)
	}
	if s.latency {
		n := min(s.latN.Load(), int64(len(s.lat)))
		lat := s.lat[:n]
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		r.LatN = n
		if n > 0 {
			r.LatP50 = time.Duration(lat[(n-1)*50/100])
			r.LatP99 = time.Duration(lat[(n-1)*99/100])
			r.LatMax = time.Duration(lat[n-1])
		}
	}
	r.OpenFDs = s.fds
	r.Messages = s.n1
	r.Window = s.t1.Sub(s.t0)
	r.CPU = s.cpu1 - s.cpu0
	r.Mallocs = s.mem1.Mallocs - s.mem0.Mallocs
	r.Bytes = s.mem1.TotalAlloc - s.mem0.TotalAlloc
	r.WindowRSS = s.windowRSS
	r.MetricsScrapes = int(s.scrapes.Load())
	r.Aborted = s.aborted.Load()
	r.FileWrites = -1
	if s.flush0 >= 0 && s.flush1 >= 0 {
		r.FileWrites = s.flush1 - s.flush0
	}
	return r, nil
}

// peakRSS is this process's peak resident set size (VmHWM), in bytes, or 0
// where /proc does not tell. wait4's ru_maxrss would not do: Linux starts a
// child's from its parent's RSS at the fork, and the parent holds the
// in-process broker's data.
func peakRSS() int64 { return procHWM("/proc/self/status") }

func procHWM(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

// openFDs counts this process's open file descriptors, or -1 where /proc
// does not tell.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// selfCPU is the process's CPU time so far, user and system, every thread.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// writeHeapProfile writes the heap's live objects at path, beside the CPU
// profile: what the consumer holds at its last message. Best effort: a
// profile that cannot be written is left out.
func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = pprof.Lookup("heap").WriteTo(f, 0)
}

// startProfile starts a CPU profile into a new file at path; end stops it
// and closes the file.
func startProfile(path string) (*os.File, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}
