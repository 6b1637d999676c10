package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/offsetstore"
)

// Config is one chaos run.
type Config struct {
	// Broker is the broker to run against; the caller starts and closes
	// it. Required.
	Broker Broker
	// ConsumerCommand runs one consumer process: the program and its
	// leading arguments, to which the run appends ConsumerConfig.Args
	// (for example {"/path/tidemark-chaos", "consume"}). Required.
	ConsumerCommand []string
	// Dir is the work directory: offset files, ledgers, consumer logs, the
	// schedule. It must exist. Required.
	Dir string

	Duration time.Duration // fault phase; default 2m
	Seed     uint64
	// Consumers is the number of instances at the start (default 3);
	// joins and leaves keep the membership within [1, MaxConsumers]
	// (default Consumers+2).
	Consumers    int
	MaxConsumers int
	Partitions   int // default 8
	Rate         int // messages per second, all partitions together; default 200
	// TxnRate is the records per second a franz-go transactional producer
	// writes into the same topic, in transactions of a tenth of a second,
	// one in three aborted; the consumers then read at ReadCommitted, and
	// the checker fails the run on any aborted record or marker handled
	// and on any committed record lost. Default Rate/4; negative: none
	// (the consumers read uncommitted).
	TxnRate int
	Mix     Mix           // default DefaultMix
	Work    time.Duration // handler time per message; default 0
	// DrainTimeout bounds the wait, after the faults stop, for every
	// message to be handled; default 3m.
	DrainTimeout time.Duration
	// Static makes every consumer a static member of the group: each
	// instance (slot) has its own InstanceID, StaticID(name), which every
	// process of that instance reuses, so that a process restarted within
	// SessionTimeout (after a SIGKILL or a SIGTERM) gets its partitions
	// back without a rebalance. A stopped static member does not leave the
	// group: a retired instance's partitions move once SessionTimeout
	// expires. The harness never runs two processes of one instance at once
	// (each process is waited for before the next starts), so no process
	// is fenced.
	Static bool
	// Keys, when positive, runs the consumers with framework.OrderKey
	// (MaxInFlight KeyInFlight) and produces each partition's messages
	// with Keys keys, round robin (KeyOf); the checker then holds each
	// process to per-key order instead of per-partition order. 0: the
	// default OrderPartition.
	Keys int
	// GroupProtocol is the consumers' framework.Config.GroupProtocol:
	// empty or "classic" (tidemark's cooperative-sticky membership), or
	// "consumer" (KIP-848). With "consumer" the group's session timeout
	// and heartbeat interval, which such a member takes from the broker,
	// are set on the broker to SessionTimeout and HeartbeatInterval, so
	// that the faults play out on the classic run's clock.
	GroupProtocol string
	// State runs the consumers with a TxHandler that counts every message
	// under its StateKey in the partition's state, with a changelog
	// (StateChangelog) that carries the state to each partition's next
	// owner; the checker then reads the offset files: every file whose
	// watermark is a partition's log end must hold, for each key, exactly
	// the number of that partition's messages to handle under it.
	State bool
	// Out receives the schedule and the progress; nil discards them.
	Out io.Writer
}

func (c Config) withDefaults() (Config, error) {
	if c.Duration == 0 {
		c.Duration = 2 * time.Minute
	}
	if c.Consumers == 0 {
		c.Consumers = 3
	}
	if c.MaxConsumers == 0 {
		c.MaxConsumers = c.Consumers + 2
	}
	if c.Partitions == 0 {
		c.Partitions = 8
	}
	if c.Rate == 0 {
		c.Rate = 200
	}
	switch {
	case c.TxnRate == 0:
		c.TxnRate = max(c.Rate/4, 1)
	case c.TxnRate < 0:
		c.TxnRate = 0
	}
	if c.Mix == nil {
		c.Mix = DefaultMix()
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 3 * time.Minute
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	var errs []error
	if c.Broker == nil {
		errs = append(errs, errors.New("chaos: Config.Broker is required"))
	}
	if len(c.ConsumerCommand) == 0 {
		errs = append(errs, errors.New("chaos: Config.ConsumerCommand is required"))
	}
	if st, err := os.Stat(c.Dir); err != nil || !st.IsDir() {
		errs = append(errs, fmt.Errorf("chaos: Config.Dir %q must be an existing directory", c.Dir))
	}
	if c.Duration < 15*time.Second {
		errs = append(errs, fmt.Errorf("chaos: Config.Duration %s: at least 15s", c.Duration))
	}
	if c.Consumers < 1 || c.MaxConsumers < c.Consumers {
		errs = append(errs, fmt.Errorf("chaos: need 1 <= Consumers (%d) <= MaxConsumers (%d)", c.Consumers, c.MaxConsumers))
	}
	switch c.GroupProtocol {
	case "", framework.GroupProtocolClassic, framework.GroupProtocolConsumer:
	default:
		return c, fmt.Errorf("chaos: GroupProtocol %q: %q or %q", c.GroupProtocol, framework.GroupProtocolClassic, framework.GroupProtocolConsumer)
	}
	if c.Partitions < 1 || c.Rate < 1 || c.Work < 0 || c.DrainTimeout < 0 || c.Keys < 0 {
		errs = append(errs, fmt.Errorf("chaos: Partitions (%d) and Rate (%d) must be positive, Work and DrainTimeout not negative", c.Partitions, c.Rate))
	}
	return c, errors.Join(errs...)
}

// DefaultKeys is the keys per partition of an "-ordering key" run.
const DefaultKeys = 16

// StaticID is the InstanceID of instance name's processes in a Static run.
func StaticID(name string) string { return "chaos-" + name }

// Margin is how long after a fault ends its effects may still explain a
// duplicate. The longest: an OffsetCommit the proxy held when the fault
// ended reaches the broker up to a commit-delay later (under 4s). (Heartbeats
// no longer queue behind it: they have their own connection.)
const Margin = 5 * time.Second

// runner is one run in progress.
type runner struct {
	cfg          Config
	topic, group string
	admin        *admin
	t0           time.Time // start of the fault phase

	mu        sync.Mutex
	instances map[string]*instance
	incs      []*Incarnation
	faults    []Fault
	open      map[int]*openFault
	commits   []CommitSample
	lastC     []int64
	pollErrs  int

	wg sync.WaitGroup // process waiters
}

// instance is one consumer identity: its offset file and fault proxy
// outlive its processes.
type instance struct {
	name    string
	file    string
	proxy   *kafkaproxy.Proxy
	runs    int
	proc    *process // the current process; nil when down
	retired bool
	// latency and blackhole settings are per proxy: the fault that set
	// them last owns them.
	latencyOwner int
	blackholes   int
}

type process struct {
	inc    *Incarnation
	cmd    *exec.Cmd
	ledger string // created once the process handles signals
	done   chan struct{}
	// signalled is how the harness is ending it; guarded by runner.mu.
	signalled EndKind
	note      string
}

type openFault struct {
	fault Fault
	inst  *instance
	rule  *kafkaproxy.Rule
	// lingerUntil is set when the schedule ended a request fault that had
	// not acted on a request yet: it stays on until it has, or until then
	// (endLingering).
	lingerUntil time.Time
}

// maxLinger is how long a request fault that has not acted on a request
// (its consumer had nothing to commit while it lasted, or was rejoining
// after a broker restart) stays on past its scheduled end, not counting
// broker restarts, and past the end of the fault phase if need be.
const maxLinger = 15 * time.Second

// Run runs the chaos: a topic, a producer at a steady rate, consumer
// processes, the seeded fault schedule; then it stops the faults, lets the
// consumers drain, stops them gracefully and checks the ledgers against
// the log. The error reports a run that could not be carried out; broken
// promises are in the Report (Report.Failed).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	if cfg.Mix[BrokerRestart] > 0 && !cfg.Broker.CanRestart() {
		fmt.Fprintf(cfg.Out, "chaos: the broker at %s cannot be restarted: no broker restarts in this run\n", cfg.Broker.Addr())
		m := Mix{}
		for k, w := range cfg.Mix {
			m[k] = w
		}
		m[BrokerRestart] = 0
		cfg.Mix = m
	}
	name := fmt.Sprintf("chaos-%d-%d", cfg.Seed, time.Now().Unix())
	r := &runner{
		cfg:       cfg,
		topic:     name,
		group:     name,
		admin:     newAdmin(cfg.Broker.Addr()),
		instances: map[string]*instance{},
		open:      map[int]*openFault{},
		lastC:     make([]int64, cfg.Partitions),
	}
	for i := range r.lastC {
		r.lastC[i] = -2
	}
	defer r.admin.close()
	defer r.cleanup()

	actions, err := NewSchedule(runSchedule(cfg.Seed, cfg.Duration, cfg.Consumers, cfg.MaxConsumers, cfg.Mix, cfg.Broker.Name() != "kfake"))
	if err != nil {
		return nil, err
	}
	var sched strings.Builder
	fmt.Fprintf(&sched, "chaos: broker %s (%s), topic %s, seed %d, %s of faults, %d consumers (at most %d, %s), %d partitions, %d msg/s, mix %s\n",
		cfg.Broker.Name(), cfg.Broker.Addr(), r.topic, cfg.Seed, cfg.Duration, cfg.Consumers, cfg.MaxConsumers, membership(cfg.Static, cfg.GroupProtocol), cfg.Partitions, cfg.Rate, cfg.Mix)
	fmt.Fprintf(&sched, "chaos: schedule (replay with the same seed and flags):\n")
	for _, a := range actions {
		fmt.Fprintf(&sched, "  %s\n", a)
	}
	fmt.Fprint(cfg.Out, sched.String())
	if err := os.WriteFile(filepath.Join(cfg.Dir, "schedule.txt"), []byte(sched.String()), 0o644); err != nil {
		return nil, fmt.Errorf("chaos: writing the schedule: %w", err)
	}

	setupCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = r.admin.createTopic(setupCtx, r.topic, cfg.Partitions)
	if err == nil && cfg.GroupProtocol == framework.GroupProtocolConsumer {
		// the classic run's clock: the member takes both from the broker
		err = testsupport.SetGroupSession(setupCtx, []string{cfg.Broker.Addr()}, r.group, SessionTimeout, HeartbeatInterval)
	}
	cancel()
	if err != nil {
		return nil, err
	}

	// The fault phase starts now, with the producer and the poller.
	r.t0 = time.Now()
	prod := newProducer(cfg.Broker.Addr(), r.topic, cfg.Partitions, cfg.Rate, cfg.Keys)
	prodCtx, stopProd := context.WithCancel(ctx)
	pollCtx, stopPoll := context.WithCancel(ctx)
	var bg sync.WaitGroup
	prodDone := make(chan struct{})
	bg.Add(2)
	go func() { defer bg.Done(); defer close(prodDone); prod.run(prodCtx) }()
	var txn *txnProducer
	txnDone := make(chan struct{})
	if cfg.TxnRate > 0 {
		txn = newTxnProducer(cfg.Broker.Addr(), name+"-txn", r.topic, cfg.Partitions, cfg.TxnRate, cfg.Keys)
		bg.Add(1)
		go func() { defer bg.Done(); defer close(txnDone); txn.run(prodCtx) }()
	} else {
		close(txnDone)
	}
	go func() { defer bg.Done(); r.poll(pollCtx) }()
	// The janitor's bug is kfake's classic group; a consumer group has
	// no join barrier to get stuck in.
	if _, ok := cfg.Broker.(*FakeBroker); ok && cfg.GroupProtocol != framework.GroupProtocolConsumer {
		bg.Add(1)
		go func() { defer bg.Done(); r.janitor(pollCtx) }()
	}
	defer func() { stopProd(); stopPoll(); bg.Wait() }()

	// A broker that takes longer to come back than the schedule planned (a
	// real broker recovering its log after a SIGKILL: about 15 s) delays
	// the rest of the schedule by as much, so the actions after it keep
	// their spacing instead of running at once when it is back, all within
	// the restart's reach (a run could then have no clean hand-off left).
	var shift time.Duration
	for _, a := range actions {
		if !sleepCtx(ctx, time.Until(r.t0.Add(shift+a.At))) {
			return nil, ctx.Err()
		}
		r.endLingering()
		began := time.Now()
		if err := r.exec(ctx, a); err != nil {
			return nil, fmt.Errorf("chaos: %s: %w", a.Describe(), err)
		}
		if over := time.Since(began) - a.For; a.Op == Op(BrokerRestart) && over > 0 {
			shift += over
			r.progress("the schedule resumes %s late (the broker was down %s longer than planned)", shift.Round(time.Millisecond), over.Round(time.Millisecond))
		}
	}
	if !sleepCtx(ctx, time.Until(r.t0.Add(shift+cfg.Duration))) {
		return nil, ctx.Err()
	}
	// Request faults still waiting to act get their time (endLingering).
	for r.endLingering() > 0 {
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	r.progress("fault phase over: clearing every fault, stopping the producer, draining")
	r.clearFaults()
	for _, inst := range r.sorted() {
		if !inst.retired && !r.running(inst) {
			r.progress("%s is down (crashed?): starting it for the drain", inst.name)
			if err := r.start(inst); err != nil {
				return nil, err
			}
		}
	}
	stopProd()
	<-prodDone
	<-txnDone
	acked, prodErrs, prodLast := prod.snapshot()
	if prodErrs > 0 {
		r.progress("producer: %d writes retried; last failure: %v", prodErrs, prodLast)
	}
	var outcomes map[string]TxnOutcome
	var txns, txnErrs int
	if txn != nil {
		var txnLast error
		outcomes, txns, txnErrs, txnLast = txn.snapshot()
		if txnErrs > 0 {
			r.progress("transactional producer: %d of %d transactions failed; last failure: %v", txnErrs, txns, txnLast)
		}
	}

	// Drain: every message handled and, normally, committed.
	end, err := r.logEnd(ctx)
	if err != nil {
		return nil, err
	}
	r.drain(ctx, end)

	// Stop every consumer gracefully, all at once.
	var stops sync.WaitGroup
	for _, inst := range r.sorted() {
		if r.running(inst) {
			stops.Add(1)
			go func() { defer stops.Done(); r.stop(inst, syscall.SIGTERM) }()
		}
	}
	stops.Wait()
	stopPoll()
	bg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.mu.Lock()
	if r.pollErrs > 0 {
		r.progress("poller: %d readings of the committed offsets failed (broker restarts)", r.pollErrs)
	}
	r.mu.Unlock()

	// Collect and check.
	in, caughtUp, err := r.collect(ctx, end, acked)
	if err != nil {
		return nil, err
	}
	in.Txn = outcomes
	rep := Check(in)
	rep.Txns, rep.TxnErrors = txns, txnErrs
	rep.Broker, rep.Seed, rep.Duration = cfg.Broker.Name(), cfg.Seed, cfg.Duration
	rep.Consumers, rep.Partitions, rep.Rate, rep.Mix, rep.Dir = cfg.Consumers, cfg.Partitions, cfg.Rate, cfg.Mix, cfg.Dir
	rep.Static, rep.Keys, rep.GroupProtocol, rep.State = cfg.Static, cfg.Keys, cfg.GroupProtocol, cfg.State
	rep.Planned = map[Kind]int{}
	for _, a := range actions {
		if a.Op != OpInitial && a.Op != OpStart && a.Op != OpEnd {
			rep.Planned[Kind(a.Op)]++
		}
	}
	rep.CaughtUp = caughtUp
	rep.Elapsed = time.Since(began)
	if err := saveFacts(cfg.Dir, in, rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// runSchedule is the schedule a Run draws; brokerKill on a real broker.
func runSchedule(seed uint64, d time.Duration, consumers, max int, mix Mix, brokerKill bool) ScheduleConfig {
	return ScheduleConfig{
		Seed: seed, Duration: d, Consumers: consumers, MaxConsumers: max, Mix: mix,
		MinGap: time.Second, MaxGap: 4 * time.Second, BrokerKill: brokerKill,
		Cycle: DefaultCycle, Calm: DefaultCalm, CalmAfter: DefaultCalmAfter,
	}
}

func (r *runner) progress(format string, args ...any) {
	fmt.Fprintf(r.cfg.Out, "[%7.2fs] %s\n", time.Since(r.t0).Seconds(), fmt.Sprintf(format, args...))
}

func (r *runner) sorted() []*instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*instance, 0, len(r.instances))
	for _, inst := range r.instances {
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return instanceNumber(out[i].name) < instanceNumber(out[j].name) })
	return out
}

func (r *runner) running(inst *instance) bool {
	r.mu.Lock()
	p := inst.proc
	r.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exec carries out one action of the schedule.
func (r *runner) exec(ctx context.Context, a Action) error {
	r.progress("%s", a.Describe())
	r.mu.Lock()
	inst := r.instances[a.Target]
	r.mu.Unlock()
	needInst := func() error {
		if inst == nil {
			return fmt.Errorf("no instance %q", a.Target)
		}
		return nil
	}
	now := time.Now().UnixNano()
	switch a.Op {
	case OpInitial, Op(Join):
		inst, err := r.newInstance(a.Target)
		if err != nil {
			return err
		}
		if a.Op == Op(Join) {
			r.addFault(Fault{ID: a.ID, Kind: Join, Target: a.Target, Start: now, End: now})
		}
		return r.start(inst)
	case OpStart:
		if err := needInst(); err != nil {
			return err
		}
		return r.start(inst)
	case Op(SIGKILL):
		if err := needInst(); err != nil {
			return err
		}
		r.stop(inst, syscall.SIGKILL)
		r.addFault(Fault{ID: a.ID, Kind: SIGKILL, Target: a.Target, Start: now, End: now})
	case Op(SIGTERM), Op(Leave):
		if err := needInst(); err != nil {
			return err
		}
		r.stop(inst, syscall.SIGTERM)
		if a.Op == Op(Leave) {
			r.mu.Lock()
			inst.retired = true
			r.mu.Unlock()
		}
		r.addFault(Fault{ID: a.ID, Kind: Kind(a.Op), Target: a.Target, Start: now, End: time.Now().UnixNano()})
	case Op(Latency), Op(Reset), Op(Blackhole), Op(CommitDelay), Op(CommitError):
		if err := needInst(); err != nil {
			return err
		}
		of := &openFault{fault: Fault{ID: a.ID, Kind: a.Kind, Target: a.Target, Start: now}, inst: inst}
		var err error
		px := inst.proxy
		switch a.Kind {
		case Latency:
			px.Latency(a.Latency, a.Jitter)
			inst.latencyOwner = a.ID
			of.fault.Detail = fmt.Sprintf("%s±%s", a.Latency, a.Jitter)
		case Reset:
			of.fault.Applied = px.Stats().Open // the connections ResetAll tears down
			px.ResetAll()
			of.rule, err = px.ResetOn(kafkaproxy.AnyKey, kafkaproxy.Probability(a.Probability))
			of.fault.Detail = fmt.Sprintf("p=%.2f", a.Probability)
		case Blackhole:
			inst.blackholes++
			px.Blackhole(true)
		case CommitDelay:
			of.rule, err = px.Delay(kmsg.OffsetCommit, a.Delay)
			of.fault.Detail = a.Delay.String()
		case CommitError:
			of.rule, err = px.Fail(kmsg.OffsetCommit, a.Code, kafkaproxy.Probability(a.Probability))
			of.fault.Detail = fmt.Sprintf("code %d p=%.2f", a.Code, a.Probability)
		}
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.open[a.ID] = of
		r.mu.Unlock()
	case OpEnd:
		if r.linger(a.ID) {
			r.progress("end #%d deferred: it has not acted on a request yet (at most %s more)", a.ID, maxLinger)
			return nil
		}
		r.endFault(a.ID)
	case Op(BrokerRestart):
		err := r.cfg.Broker.Restart(ctx, a.Kill, a.For)
		r.extendLingering(time.Since(time.Unix(0, now))) // no request could act while the broker was down
		r.addFault(Fault{ID: a.ID, Kind: BrokerRestart, Start: now, End: time.Now().UnixNano(), Detail: fmt.Sprintf("kill=%v", a.Kill)})
		if err != nil {
			return err
		}
		r.progress("broker back after %s", time.Since(time.Unix(0, now)).Round(time.Millisecond))
	default:
		return fmt.Errorf("unknown action %q", a.Op)
	}
	return nil
}

func (r *runner) addFault(f Fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// linger reports whether the open request fault id has not acted on a
// request yet, and if so keeps it on (endLingering ends it).
func (r *runner) linger(id int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	of := r.open[id]
	if of == nil || of.rule == nil || of.fault.Applied+of.rule.Applied() > 0 {
		return false
	}
	of.lingerUntil = time.Now().Add(maxLinger)
	return true
}

// endLingering ends the lingering faults that have acted on a request
// since, or lingered maxLinger (of broker up time), and returns how many
// still linger.
func (r *runner) endLingering() int {
	r.mu.Lock()
	var ids []int
	left := 0
	for id, of := range r.open {
		if of.lingerUntil.IsZero() {
			continue
		}
		if of.rule.Applied() > 0 || time.Now().After(of.lingerUntil) {
			ids = append(ids, id)
		} else {
			left++
		}
	}
	r.mu.Unlock()
	sort.Ints(ids)
	for _, id := range ids {
		r.progress("end #%d (deferred)", id)
		r.endFault(id)
	}
	return left
}

// extendLingering moves the lingering faults' deadlines d later.
func (r *runner) extendLingering(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, of := range r.open {
		if !of.lingerUntil.IsZero() {
			of.lingerUntil = of.lingerUntil.Add(d)
		}
	}
}

// endFault undoes an open fault and records its end.
func (r *runner) endFault(id int) {
	r.mu.Lock()
	of := r.open[id]
	delete(r.open, id)
	r.mu.Unlock()
	if of == nil {
		return
	}
	px := of.inst.proxy
	switch of.fault.Kind {
	case Latency:
		if of.inst.latencyOwner == id {
			px.Latency(0, 0)
			of.inst.latencyOwner = 0
		}
	case Blackhole:
		of.inst.blackholes--
		if of.inst.blackholes == 0 {
			px.Blackhole(false)
		}
	}
	if of.rule != nil {
		of.rule.Remove()
		of.fault.Applied += of.rule.Applied()
	}
	of.fault.End = time.Now().UnixNano()
	r.addFault(of.fault)
}

// clearFaults ends every open fault and resets every proxy.
func (r *runner) clearFaults() {
	r.mu.Lock()
	var ids []int
	for id := range r.open {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	sort.Ints(ids)
	for _, id := range ids {
		r.endFault(id)
	}
	for _, inst := range r.sorted() {
		inst.proxy.ClearRules()
		inst.proxy.Latency(0, 0)
		inst.proxy.Blackhole(false)
		inst.blackholes, inst.latencyOwner = 0, 0
	}
}

func (r *runner) newInstance(name string) (*instance, error) {
	px, err := kafkaproxy.New(r.cfg.Broker.Addr(), kafkaproxy.WithSeed(r.cfg.Seed+uint64(instanceNumber(name))))
	if err != nil {
		return nil, err
	}
	inst := &instance{name: name, file: filepath.Join(r.cfg.Dir, "offsets-"+name+".db"), proxy: px}
	r.mu.Lock()
	r.instances[name] = inst
	r.mu.Unlock()
	return inst, nil
}

// start runs a new process of inst, after reading its offset file's
// watermarks and, with State, changelog positions (no process holds the
// file then).
func (r *runner) start(inst *instance) error {
	// One process per instance at a time: with static membership a second
	// one would fence the first (and both would want the offset file).
	if r.running(inst) {
		return fmt.Errorf("chaos: %s still has a process running", inst.name)
	}
	wm, next, err := readOffsetFile(inst.file, r.group, r.topic, r.cfg.State)
	if err != nil {
		return err
	}
	inst.runs++
	inc := Inc{Instance: inst.name, Run: inst.runs}
	cc := ConsumerConfig{
		Brokers:    []string{inst.proxy.Addr()},
		Group:      r.group,
		Topic:      r.topic,
		OffsetFile: inst.file,
		Ledger:     filepath.Join(r.cfg.Dir, fmt.Sprintf("ledger-%s-%d.log", inst.name, inc.Run)),
		Inc:        inc,
		Work:       r.cfg.Work,
		Keys:       r.cfg.Keys,
		Protocol:   r.cfg.GroupProtocol,
		State:      r.cfg.State,
		// ReadCommitted: the transactional producer writes into the topic.
		ReadCommitted: r.cfg.TxnRate > 0,
	}
	if r.cfg.Static {
		cc.InstanceID = StaticID(inst.name)
	}
	logPath := filepath.Join(r.cfg.Dir, fmt.Sprintf("consumer-%s-%d.log", inst.name, inc.Run))
	logf, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("chaos: consumer log: %w", err)
	}
	args := append(append([]string(nil), r.cfg.ConsumerCommand[1:]...), cc.Args()...)
	cmd := exec.Command(r.cfg.ConsumerCommand[0], args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	setParentDeath(cmd)
	err = cmd.Start()
	_ = logf.Close() // the process has its own descriptor
	if err != nil {
		return fmt.Errorf("chaos: starting consumer %s: %w", inc, err)
	}
	rec := &Incarnation{Inc: inc, Start: time.Now().UnixNano(), StartWatermarks: wm}
	if r.cfg.State {
		rec.StartChangelogNext = next
	}
	p := &process{inc: rec, cmd: cmd, ledger: cc.Ledger, done: make(chan struct{})}
	r.mu.Lock()
	r.incs = append(r.incs, rec)
	inst.proc = p
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := cmd.Wait()
		r.mu.Lock()
		rec.End = time.Now().UnixNano()
		switch p.signalled {
		case EndSIGKILL:
			rec.Ended = EndSIGKILL
			rec.ExitErr = p.note
		case EndSIGTERM:
			rec.Ended = EndSIGTERM
			if err != nil {
				rec.Ended = EndFailed
				rec.ExitErr = fmt.Sprintf("%v (see %s)", err, logPath)
			}
		default:
			rec.Ended = EndCrashed
			rec.ExitErr = fmt.Sprintf("%v (see %s)", err, logPath)
		}
		r.mu.Unlock()
		close(p.done)
	}()
	return nil
}

// gracefulStop bounds how long a SIGTERMed consumer may take to drain,
// commit and leave (the group may be in a rebalance that waits for others:
// up to a JoinGroup and a SyncGroup).
const gracefulStop = time.Minute

// stop ends inst's process with sig and waits for it. A SIGTERMed process
// that does not exit within gracefulStop is killed and reported. After a
// SIGKILL, the offset file's durable watermarks are recorded.
func (r *runner) stop(inst *instance, sig syscall.Signal) {
	r.mu.Lock()
	p := inst.proc
	inst.proc = nil
	if p != nil {
		p.signalled = EndSIGTERM
		if sig == syscall.SIGKILL {
			p.signalled = EndSIGKILL
		}
	}
	r.mu.Unlock()
	if p == nil {
		return
	}
	if sig == syscall.SIGTERM {
		// A SIGTERM before the consumer installed its handler would kill it
		// like a SIGKILL: wait until it opened its ledger, which it does
		// after.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(p.ledger); err == nil {
				break
			}
			select {
			case <-p.done:
			case <-time.After(5 * time.Millisecond):
				continue
			}
			break
		}
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		r.progress("signalling %s: %v", p.inc.Inc, err)
	}
	if sig == syscall.SIGTERM {
		select {
		case <-p.done:
		case <-time.After(gracefulStop):
			r.mu.Lock()
			p.signalled = EndSIGKILL
			p.note = fmt.Sprintf("still running %s after SIGTERM; killed", gracefulStop)
			r.mu.Unlock()
			r.progress("%s: %s", p.inc.Inc, p.note)
			_ = p.cmd.Process.Kill()
		}
	}
	<-p.done
	if sig == syscall.SIGKILL {
		wm, err := readWatermarks(inst.file, r.group, r.topic)
		if err != nil {
			r.progress("reading %s after the kill: %v", inst.file, err)
		}
		r.mu.Lock()
		p.inc.KillDurable = wm
		r.mu.Unlock()
	}
}

// cleanup kills whatever still runs and closes the proxies; it returns
// once every goroutine the run started has exited.
func (r *runner) cleanup() {
	for _, inst := range r.sorted() {
		r.mu.Lock()
		p := inst.proc
		inst.proc = nil
		if p != nil {
			p.signalled = EndSIGKILL
		}
		r.mu.Unlock()
		if p != nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	r.wg.Wait()
	for _, inst := range r.sorted() {
		_ = inst.proxy.Close()
	}
}

// poll reads the group's committed offsets and the log end every 200ms and
// keeps every change of a committed offset.
func (r *runner) poll(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		committed, err := r.admin.committed(rctx, r.group, r.topic, r.cfg.Partitions)
		arrived := time.Now().UnixNano()
		var end []int64
		if err == nil {
			_, end, err = r.admin.bounds(rctx, r.topic, r.cfg.Partitions)
		}
		cancel()
		r.mu.Lock()
		if err != nil {
			r.pollErrs++
		} else {
			for p, c := range committed {
				if c != r.lastC[p] {
					r.commits = append(r.commits, CommitSample{T: arrived, Partition: p, Committed: c, End: end[p]})
					r.lastC[p] = c
				}
			}
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// JanitorAfter is how long the kfake janitor lets the group stay out of
// the Stable state before it removes every member: longer than a
// rebalance takes on a correct broker (every member rejoins within the
// rebalance timeout, a member that does not is dropped then, and the
// members that did are given a session timeout to sync).
const JanitorAfter = RebalanceTimeout + SessionTimeout + 2*time.Second

// janitor works around a bug of the pinned kfake: a member whose
// JoinGroup response cannot be delivered (its connection died: a SIGKILL,
// a reset, a client timeout, a broker restart) stays in the group with no
// session timer, and every later join restarts the rebalance timer that
// would drop it; with members rejoining all the time the group stays in
// PreparingRebalance for good and nobody consumes. When the group has
// been out of Stable for JanitorAfter, the janitor removes every member
// (LeaveGroup on their behalf); the live ones rejoin at once. No member
// owns a partition then, so it cannot cause a duplicate; it is recorded
// as a fault of kind KfakeJanitor.
func (r *runner) janitor(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := r.admin.cl.DescribeGroups(rctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{r.group}})
		cancel()
		if err != nil || len(res.Groups) != 1 || res.Groups[0].Error != nil {
			continue
		}
		g := res.Groups[0]
		switch g.GroupState {
		case "PreparingRebalance", "CompletingRebalance":
		default:
			since = time.Time{}
			continue
		}
		if since.IsZero() {
			since = time.Now()
			continue
		}
		if time.Since(since) < JanitorAfter || len(g.Members) == 0 {
			continue
		}
		req := &kafka.LeaveGroupRequest{GroupID: r.group}
		for _, m := range g.Members {
			req.Members = append(req.Members, kafka.LeaveGroupRequestMember{ID: m.MemberID})
		}
		start := time.Now()
		rctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		_, err = r.admin.cl.LeaveGroup(rctx, req)
		cancel()
		detail := fmt.Sprintf("%s for %s with %d members", g.GroupState, time.Since(since).Round(time.Second), len(g.Members))
		if err != nil {
			r.progress("kfake janitor: group %s; removing its members failed: %v", detail, err)
			continue
		}
		r.progress("kfake janitor: group %s (members whose JoinGroup answer was lost linger); removed them all", detail)
		r.addFault(Fault{Kind: KfakeJanitor, Start: start.UnixNano(), End: time.Now().UnixNano(), Detail: detail})
		since = time.Time{}
	}
}

// logEnd reads the log end of every partition once the producer stopped,
// retrying for a minute (the broker may just have restarted). The
// producer's last write, cancelled in flight, may still land: the end is
// taken when two readings a second apart agree.
func (r *runner) logEnd(ctx context.Context) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var prev []int64
	for {
		_, end, err := r.admin.bounds(ctx, r.topic, r.cfg.Partitions)
		if err == nil && prev != nil && slices.Equal(prev, end) {
			return end, nil
		}
		if err == nil {
			prev = end
		}
		if !sleepCtx(ctx, time.Second) {
			if err == nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("chaos: the log end of %s did not settle: %w", r.topic, err)
		}
	}
}

// drain waits until Kafka's committed offset reaches end on every
// partition; if it does not within 30s (a generation that stopped
// committing), until every offset below end is in some ledger; at most
// DrainTimeout.
func (r *runner) drain(ctx context.Context, end []int64) {
	start := time.Now()
	deadline := start.Add(r.cfg.DrainTimeout)
	var total int64
	for _, e := range end {
		total += e
	}
	r.progress("draining: %d messages in the log", total)
	lastLedgerCheck := time.Time{}
	for time.Now().Before(deadline) {
		r.mu.Lock()
		caught := 0
		for p, c := range r.lastC {
			if c == end[p] {
				caught++
			}
		}
		r.mu.Unlock()
		if caught == len(end) {
			r.progress("drained in %s: Kafka's committed offsets are at the log end", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 30*time.Second && time.Since(lastLedgerCheck) > 5*time.Second {
			lastLedgerCheck = time.Now()
			missing, err := r.missing(end)
			if err != nil {
				r.progress("reading ledgers: %v", err)
			} else if missing == 0 {
				r.progress("drained in %s: every message is in a ledger (Kafka caught up on %d/%d partitions)",
					time.Since(start).Round(time.Millisecond), caught, len(end))
				return
			} else {
				r.progress("still draining: %d messages in no ledger; Kafka caught up on %d/%d partitions", missing, caught, len(end))
			}
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
	}
	r.progress("drain timed out after %s", r.cfg.DrainTimeout)
}

// missing counts the offsets below end that no ledger holds yet.
func (r *runner) missing(end []int64) (int64, error) {
	ledgers, err := r.readLedgers()
	if err != nil {
		return 0, err
	}
	seen := make([]map[int64]bool, len(end))
	for p := range seen {
		seen[p] = map[int64]bool{}
	}
	for _, l := range ledgers {
		for _, h := range l.Handlings {
			if h.Partition >= 0 && h.Partition < len(end) {
				seen[h.Partition][h.Offset] = true
			}
		}
	}
	var n int64
	for p, e := range end {
		for o := int64(0); o < e; o++ {
			if !seen[p][o] {
				n++
			}
		}
	}
	return n, nil
}

func (r *runner) readLedgers() ([]Ledger, error) {
	paths, err := filepath.Glob(filepath.Join(r.cfg.Dir, "ledger-*.log"))
	if err != nil {
		return nil, err
	}
	var out []Ledger
	for _, path := range paths {
		l, err := ReadLedger(path)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// collect gathers the checker's input once every consumer stopped.
func (r *runner) collect(ctx context.Context, end, acked []int64) (*Input, int, error) {
	ledgers, err := r.readLedgers()
	if err != nil {
		return nil, 0, err
	}
	in := &Input{Topic: r.topic, Partitions: r.cfg.Partitions, Keys: r.cfg.Keys, Acked: acked, Ledgers: ledgers, Margin: Margin}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for p := 0; p < r.cfg.Partitions; p++ {
		values, err := r.admin.readLog(rctx, r.topic, p, end[p])
		if err != nil {
			return nil, 0, err
		}
		in.Log = append(in.Log, values)
		if r.cfg.TxnRate > 0 {
			committed, err := r.admin.readCommitted(rctx, r.topic, p, end[p])
			if err != nil {
				return nil, 0, err
			}
			if in.LogCommitted == nil {
				in.LogCommitted = map[string]bool{}
			}
			for v := range committed {
				in.LogCommitted[v] = true
			}
		}
	}
	if r.cfg.State {
		in.State = true
		if in.ChangelogMarkers, err = r.admin.changelogMarkers(rctx, r.topic+StateChangelog, r.cfg.Partitions); err != nil {
			return nil, 0, err
		}
	}
	committed, err := r.admin.committed(rctx, r.group, r.topic, r.cfg.Partitions)
	if err != nil {
		return nil, 0, err
	}
	caughtUp := 0
	for p, c := range committed {
		if c == end[p] {
			caughtUp++
		}
	}
	for _, inst := range r.sorted() {
		wm, err := readWatermarks(inst.file, r.group, r.topic)
		if err != nil {
			return nil, 0, err
		}
		for p, w := range wm {
			in.Files = append(in.Files, FileWatermark{Instance: inst.name, Partition: p, Watermark: w})
		}
		if r.cfg.State {
			states, err := readStates(inst.file, inst.name, r.group, r.topic, wm)
			if err != nil {
				return nil, 0, err
			}
			in.States = append(in.States, states...)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, inc := range r.incs {
		in.Incarnations = append(in.Incarnations, *inc)
	}
	in.Faults = append(in.Faults, r.faults...)
	in.Commits = append(in.Commits, r.commits...)
	return in, caughtUp, nil
}

// readStates reads the state counters of every partition in wm from the
// offset file at path (Config.State), with the partition's watermark.
func readStates(path, instance, group, topic string, wm map[int]int64) ([]FileState, error) {
	if len(wm) == 0 {
		return nil, nil
	}
	f, err := offsetstore.Open(path)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading the state of %s: %w", path, err)
	}
	defer f.Close()
	var out []FileState
	for p, w := range wm {
		fs := FileState{Instance: instance, Partition: p, Watermark: w, Counts: map[int64]int64{}}
		err := f.ViewState(group, topic, p, func(st handler.State) error {
			return st.ForEach(func(k, v []byte) error {
				if len(k) != 8 || len(v) != 8 {
					return fmt.Errorf("key %x holds %x: not a counter", k, v)
				}
				fs.Counts[int64(binary.BigEndian.Uint64(k))] = int64(binary.BigEndian.Uint64(v))
				return nil
			})
		})
		if err != nil {
			return nil, fmt.Errorf("chaos: reading the state of %s/%d in %s: %w", topic, p, path, err)
		}
		out = append(out, fs)
	}
	return out, nil
}

// readWatermarks reads the durable watermarks of group/topic in an offset
// file, read-only; a file that does not exist yet has none.
func readWatermarks(path, group, topic string) (map[int]int64, error) {
	wm, _, err := readOffsetFile(path, group, topic, false)
	return wm, err
}

// readOffsetFile is readWatermarks, and with positions, for each partition
// with a watermark, the changelog position's Next the file records (the
// changelog offset after its last acknowledged write), where it has one.
func readOffsetFile(path, group, topic string, positions bool) (wm, next map[int]int64, err error) {
	wm, next = map[int]int64{}, map[int]int64{}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return wm, next, nil
	}
	s, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		return nil, nil, fmt.Errorf("chaos: reading offset file: %w", err)
	}
	for _, e := range s.Records() {
		if e.Group == group && e.Topic == topic && e.Watermark >= 0 {
			wm[int(e.Partition)] = e.Watermark
		}
	}
	if positions {
		for p := range wm {
			pos, perr := s.ChangelogPosition(offsetfile.Key{Group: group, Topic: topic, Partition: int32(p)})
			if perr != nil {
				err = fmt.Errorf("chaos: reading the changelog position of %s/%d in %s: %w", topic, p, path, perr)
				break
			}
			if pos.Epoch >= 0 {
				next[p] = pos.Next
			}
		}
	}
	if cerr := s.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("chaos: closing offset file %s: %w", path, cerr)
	}
	if err != nil {
		return nil, nil, err
	}
	return wm, next, nil
}
