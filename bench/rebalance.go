package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// The rebalance section: how long a partition takes to move from one
// member to another, and how long the partitions that stay go without a
// message, when a member joins a group and when one leaves (gracefully),
// with the classic protocol (tidemark's cooperative-sticky membership) and
// the consumer protocol (KIP-848: the broker assigns). Every member is a
// tidemark Consumer at its defaults in this process, each with its own
// offset file; a producer writes to every partition in turn at a steady
// pace. A timing, not a CPU, measurement.

// rebalanceProtocols are the protocols of the section, in their order.
var rebalanceProtocols = []string{framework.GroupProtocolClassic, framework.GroupProtocolConsumer}

const (
	rebalancePartitions = 30
	rebalanceTick       = time.Millisecond // a record every tick, to the partitions in turn
)

// rebalanceEvent is one join or leave measured.
type rebalanceEvent struct {
	moves []time.Duration // per partition that moved: from the event to its first message at its new owner
	stall time.Duration   // the longest time a partition that stayed went without a message
	twice int             // messages handled again (none expected: the hand-offs are graceful)
}

type rebalanceKey struct {
	protocol string
	members  int
	event    string // "join" or "leave"
}

type rebalanceRuns struct {
	runs map[rebalanceKey][]rebalanceEvent
	took time.Duration
	skip string
}

func (b *bench) rebalancePhase(ctx context.Context) error {
	rb := &b.rebalance
	start := time.Now()
	rb.runs = map[rebalanceKey][]rebalanceEvent{}
	for _, n := range b.o.rebalanceMembers {
		for _, proto := range rebalanceProtocols {
			join, leave, err := b.rebalanceRun(ctx, proto, n)
			if err != nil {
				return fmt.Errorf("rebalance, %s protocol, %d members: %w", proto, n, err)
			}
			rb.runs[rebalanceKey{proto, n, "join"}] = join
			rb.runs[rebalanceKey{proto, n, "leave"}] = leave
		}
	}
	rb.took = time.Since(start)
	return nil
}

// rebalanceRun starts members-1 members on a fresh topic, then, each round,
// starts one more and stops it again, measuring both changes.
func (b *bench) rebalanceRun(ctx context.Context, proto string, members int) (join, leave []rebalanceEvent, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	topic := fmt.Sprintf("tidemark-bench-%s-rebalance-%s-%d", b.runID, proto, members)
	if err := b.broker.createTopic(ctx, topic, rebalancePartitions); err != nil {
		return nil, nil, err
	}
	w := newGroupWatch(rebalancePartitions, b.o.rebalanceSettle)
	stopProducer, perr := startSteadyProducer(ctx, b.broker.addrs, topic, rebalancePartitions)
	defer stopProducer()
	group := b.group("rebalance-" + proto + "-" + fmt.Sprint(members))
	var ms []*benchMember
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	for i := 0; i < members-1; i++ {
		m, err := startBenchMember(ctx, b.tmp, b.broker.addrs, topic, group, proto, i, w)
		if err != nil {
			return nil, nil, err
		}
		ms = append(ms, m)
	}
	if err := w.settle(ctx, perr, func(o []int) bool { return owned(o, -1) == 0 }); err != nil {
		return nil, nil, fmt.Errorf("the first %d members: %w", members-1, err)
	}
	for r := 0; r < b.o.rebalanceRounds; r++ {
		id := members - 1 + r
		if err := sleepCtx(ctx, eventPhase(b.o.rebalanceSettle)); err != nil {
			return nil, nil, err
		}
		w.mark()
		t0 := time.Now()
		m, err := startBenchMember(ctx, b.tmp, b.broker.addrs, topic, group, proto, id, w)
		if err != nil {
			return nil, nil, err
		}
		share := rebalancePartitions / members
		if err := w.settle(ctx, perr, func(o []int) bool { return owned(o, id) >= share }); err != nil {
			m.stop()
			return nil, nil, fmt.Errorf("member %d joining: %w", id, err)
		}
		join = append(join, w.measure(t0, func(p, from, to int) bool { return to == id }))
		b.logf("rebalance %-8s %2d members: join %d/%d: %s", proto, members, r+1, b.o.rebalanceRounds, join[len(join)-1])

		if err := sleepCtx(ctx, eventPhase(b.o.rebalanceSettle)); err != nil {
			m.stop()
			return nil, nil, err
		}
		w.mark()
		t1 := time.Now()
		m.stop()
		if err := w.settle(ctx, perr, func(o []int) bool { return owned(o, id) == 0 }); err != nil {
			return nil, nil, fmt.Errorf("member %d leaving: %w", id, err)
		}
		leave = append(leave, w.measure(t1, func(p, from, to int) bool { return from == id }))
		b.logf("rebalance %-8s %2d members: leave %d/%d: %s", proto, members, r+1, b.o.rebalanceRounds, leave[len(leave)-1])
	}
	return join, leave, nil
}

// eventPhase is how long an event waits after the group settled: a
// random time within the settle. Settling ends a fixed time after the last
// change, which a heartbeat answer brought; an event at once would then
// always come at the same phase of the members' heartbeats (a classic
// member's next one a whole interval away, a consumer-protocol member's
// one second before its next, at the defaults), and the move times would
// measure that phase, not the protocols.
func eventPhase(settle time.Duration) time.Duration {
	return rand.N(settle)
}

func (e rebalanceEvent) String() string {
	return fmt.Sprintf("%d partitions moved, median %s, max %s; longest stall of the others %s; %d handled twice",
		len(e.moves), medianDur(e.moves).Round(time.Millisecond), maxDur(e.moves).Round(time.Millisecond),
		e.stall.Round(time.Millisecond), e.twice)
}

func maxDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}

// owned counts the partitions member id handled last (-1: none yet).
func owned(owners []int, id int) int {
	n := 0
	for _, o := range owners {
		if o == id {
			n++
		}
	}
	return n
}

// groupWatch sees every message every member handles: per partition its
// owner (the member that handled its last message), its next offset, and,
// since mark, the owner then, the first message at another owner and the
// longest gap between two messages.
type groupWatch struct {
	settled time.Duration // how long no owner may change for a change of the group to be done

	mu      sync.Mutex
	owner   []int
	next    []int64
	last    []time.Time
	changed time.Time // the last change of any partition's owner
	twice   int
	// since mark
	before  []int
	moved   []time.Time // first message at an owner other than before's
	movedTo []int
	gap     []time.Duration
}

func newGroupWatch(parts int, settled time.Duration) *groupWatch {
	w := &groupWatch{settled: settled, owner: make([]int, parts), next: make([]int64, parts), last: make([]time.Time, parts)}
	for i := range w.owner {
		w.owner[i] = -1
	}
	w.mark()
	return w
}

func (w *groupWatch) handled(member int, m kafka.Message) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	p := m.Partition
	if m.Offset < w.next[p] {
		w.twice++
	}
	w.next[p] = max(w.next[p], m.Offset+1)
	if !w.last[p].IsZero() {
		w.gap[p] = max(w.gap[p], now.Sub(w.last[p]))
	}
	w.last[p] = now
	if w.owner[p] != member {
		w.owner[p], w.changed = member, now
	}
	if member != w.before[p] && w.moved[p].IsZero() {
		w.moved[p], w.movedTo[p] = now, member
	}
}

// mark starts a measurement: the owners now, no move or gap yet.
func (w *groupWatch) mark() {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.owner)
	w.before = slices.Clone(w.owner)
	w.moved, w.movedTo, w.gap = make([]time.Time, n), make([]int, n), make([]time.Duration, n)
	now := time.Now()
	for i := range w.last {
		if !w.last[i].IsZero() {
			w.last[i] = now // a gap counts from the mark, not from before it
		}
	}
	w.twice = 0
}

// settle waits until done holds for the owners and no owner changed for
// w.settled (-rebalance-settle).
func (w *groupWatch) settle(ctx context.Context, failed <-chan error, done func(owners []int) bool) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		w.mu.Lock()
		ok := done(w.owner) && time.Since(w.changed) >= w.settled
		owners := slices.Clone(w.owner)
		w.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not settled: partitions' owners %v: %w", owners, ctx.Err())
		case err := <-failed:
			return err
		case <-t.C:
		}
	}
}

// measure is the event since mark, at t: the moves of the partitions that
// moves says moved (from their owner at mark to their first other one),
// and the longest gap of the others.
func (w *groupWatch) measure(t time.Time, moves func(p, from, to int) bool) rebalanceEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := rebalanceEvent{twice: w.twice}
	for p := range w.owner {
		if !w.moved[p].IsZero() && moves(p, w.before[p], w.movedTo[p]) {
			e.moves = append(e.moves, w.moved[p].Sub(t))
			continue
		}
		if w.moved[p].IsZero() {
			// Stayed: its longest gap, up to now for one still waiting.
			e.stall = max(e.stall, w.gap[p], time.Since(w.last[p]))
		}
	}
	return e
}

// benchMember is one tidemark member of the group, running until stop.
type benchMember struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (m *benchMember) stop() {
	if m.cancel != nil {
		m.cancel()
		<-m.done
		m.cancel = nil
	}
}

func startBenchMember(ctx context.Context, tmp string, addrs []string, topic, group, proto string, id int, w *groupWatch) (*benchMember, error) {
	dir, err := os.MkdirTemp(tmp, "rebalance-")
	if err != nil {
		return nil, err
	}
	c, err := framework.New(framework.Config{
		Brokers: addrs, GroupID: group, Topics: []string{topic}, OffsetFile: filepath.Join(dir, "offsets.db"),
		GroupProtocol: proto,
		Handler:       handler.HandlerFunc(func(_ context.Context, m kafka.Message) error { w.handled(id, m); return nil }),
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &benchMember{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		defer os.RemoveAll(dir)
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "bench: rebalance member %d: %v\n", id, err)
		}
	}()
	return m, nil
}

// startSteadyProducer writes a record every rebalanceTick to the topic's
// partitions in turn until stopped; failed gets its first error.
func startSteadyProducer(ctx context.Context, addrs []string, topic string, parts int) (stop func(), failed <-chan error) {
	errs := make(chan error, 1)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	kc, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		fail(err)
		return func() {}, errs
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(rebalanceTick)
		defer t.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			kc.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(i % parts), Value: fmt.Appendf(nil, "r%08d", i)},
				func(_ *kgo.Record, err error) {
					if err != nil && ctx.Err() == nil {
						fail(fmt.Errorf("producing to %s: %w", topic, err))
					}
				})
		}
	}()
	return func() { cancel(); <-done; kc.Close() }, errs
}

// rebalanceReport renders the section in a block of its own (markers
// bench:KEY:rebalance) that a run of this section alone replaces.
func (b *bench) rebalanceReport(w *strings.Builder, standalone bool) {
	rb := &b.rebalance
	if rb.skip == "" && len(rb.runs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	key := b.sectionKey()
	p("<!-- bench:%s:%s:begin (written by bench/, do not edit by hand) -->\n", key, sectionRebalance)
	p("### Rebalances: a member joins, a member leaves\n\n")
	defer p("<!-- bench:%s:%s:end -->\n", key, sectionRebalance)
	if rb.skip != "" {
		p("Not run: %s.\n\n", rb.skip)
		return
	}
	if standalone {
		p("Written by a run of this section alone, which replaces only this part of the %s section:\n\n", key)
		b.runHeader(w)
		p("\n")
	}
	p("A group of tidemark members at their defaults, all in this process, consumes a topic of %d partitions that a "+
		"producer writes a record to every %s, to the partitions in turn. Once the group is settled (no partition changed "+
		"owner for %s) and a random time within that more has passed (so that events come at any phase of the members' "+
		"heartbeats), a member joins; once it has its share and the group is settled again (and the random wait), it leaves (its Run's context "+
		"ends: a graceful hand-off). A partition's move time runs from the join (the new member's start) or the leave (the "+
		"cancel) to the first message its new owner handled; the stall is the longest any partition that did not move went "+
		"without a message from the event until the group settled. %d round(s) per group size; the section took %s. "+
		"classic: tidemark's cooperative-sticky membership (JoinGroup/SyncGroup); consumer: KIP-848's ConsumerGroupHeartbeat, "+
		"the broker's assignor and heartbeat interval. A consumer-protocol member heartbeats at a tenth of the broker's "+
		"interval after its assignment changed (docs/membership.md); with the settle (%s) above the broker's interval (5 s by "+
		"default) each event here is an isolated one: the members that must see it do so at their next heartbeat at the "+
		"broker's pace. Events less than an interval apart (a rolling restart; -rebalance-settle 3s) find them at the faster "+
		"pace.\n\n",
		rebalancePartitions, rebalanceTick, b.o.rebalanceSettle, b.o.rebalanceRounds, rb.took.Round(time.Second), b.o.rebalanceSettle)
	p("| members | event | protocol | partitions moved | move time median | move time max | longest stall of the others | handled twice |\n")
	p("|---:|---|---|---:|---:|---:|---:|---:|\n")
	for _, n := range b.o.rebalanceMembers {
		for _, ev := range []string{"join", "leave"} {
			for _, proto := range rebalanceProtocols {
				var moves []time.Duration
				var stall time.Duration
				moved, twice := 0, 0
				for _, e := range rb.runs[rebalanceKey{proto, n, ev}] {
					moves = append(moves, e.moves...)
					stall = max(stall, e.stall)
					moved += len(e.moves)
					twice += e.twice
				}
				p("| %d | %s | %s | %d | %s | %s | %s | %d |\n", n, ev, proto, moved, fmtMs(medianDur(moves)), fmtMs(maxDur(moves)), fmtMs(stall), twice)
			}
		}
	}
	p("\nThe consumer protocol against classic (median move time; longest stall):\n\n")
	for _, n := range b.o.rebalanceMembers {
		for _, ev := range []string{"join", "leave"} {
			c, k := pooledMoves(rb.runs[rebalanceKey{framework.GroupProtocolClassic, n, ev}]), pooledMoves(rb.runs[rebalanceKey{framework.GroupProtocolConsumer, n, ev}])
			p("- %d members, %s: move time **%s**, stall %s\n", n, ev, ratioDur(medianDur(k.moves), medianDur(c.moves)), ratioDur(k.stall, c.stall))
		}
	}
	p("\n")
	p("### Targets: rebalances (ratios from this run)\n\n| target | measured | |\n|---|---:|---|\n")
	for _, n := range b.o.rebalanceMembers {
		for _, ev := range []string{"join", "leave"} {
			c, k := pooledMoves(rb.runs[rebalanceKey{framework.GroupProtocolClassic, n, ev}]), pooledMoves(rb.runs[rebalanceKey{framework.GroupProtocolConsumer, n, ev}])
			cm, km := medianDur(c.moves), medianDur(k.moves)
			if cm <= 0 || km <= 0 {
				continue
			}
			verdict := "met"
			if float64(km) > 0.5*float64(cm) {
				verdict = "**missed**"
			}
			p("| %d members, a member %ss: the consumer protocol's median move time <= 0.5x classic's | %s (%s against %s) | %s |\n",
				n, ev, ratioDur(km, cm), fmtMs(km), fmtMs(cm), verdict)
		}
	}
	p("\n")
}

func pooledMoves(es []rebalanceEvent) rebalanceEvent {
	var out rebalanceEvent
	for _, e := range es {
		out.moves = append(out.moves, e.moves...)
		out.stall = max(out.stall, e.stall)
	}
	return out
}

func fmtMs(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func ratioDur(a, b time.Duration) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}
