package framework

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/wire"
)

// The fetcher's own goroutine (run): it looks up the leaders of the
// partitions that need one (Metadata), applies the OutOfRange policy to the
// positions a broker refused, and asks leaders for log bounds
// (ListOffsets). The broker loops (fetch.go) only fetch.

// run is the fetcher's goroutine: it looks up the leaders of partitions
// that need one, applies the OutOfRange policy to positions the brokers
// refused, and owns the broker loops. It returns after ctx ended and every
// broker loop exited.
func (f *fetcher) run() {
	defer f.wg.Wait()
	bo := newBackoff(100*time.Millisecond, 5*time.Second)
	// Kafka may name a dead leader for many seconds; the metadata is read
	// again at least twice a second until it names one that answers, so
	// that a partition moves within half a second of its new leader's
	// election, however long the old leader's broker loop backs off.
	look := newBackoff(50*time.Millisecond, 500*time.Millisecond)
	overdue := time.NewTicker(overdueCheck)
	defer overdue.Stop()
	age := time.NewTicker(f.cfg.MetadataMaxAge)
	defer age.Stop()
	var retry <-chan time.Time
	var lastOverdue time.Time
	// The leaders are read once while the group is joined: the first
	// assignment then asks its partitions' leaders for their bounds
	// without waiting for the metadata first (at 5,000 partitions on
	// Kafka, 10-20 ms of the start). A failure is left to the lookups.
	f.watch.busy()
	if _, _, err := f.leaders.refresh(f.ctx); err != nil && f.ctx.Err() == nil {
		f.log.Debug("reading the leaders at the start failed; they are read again when needed", zap.Error(err))
	}
	for {
		f.watch.idle() // liveness (liveness.go)
		select {
		case <-f.ctx.Done():
			return
		case <-f.kick:
		case <-retry:
		case <-age.C:
			// Leaders that moved without a refused fetch (MetadataMaxAge).
			f.watch.busy()
			f.abandonMoved(false)
			continue
		case now := <-overdue.C:
			if now.Sub(lastOverdue) >= overdueLookup && f.overdue(now) {
				lastOverdue = now
				f.watch.busy()
				f.abandonMoved(true)
			}
			continue
		}
		f.watch.busy()
		retry = nil
		if f.needLeaders() {
			if err := f.refreshLeaders(f.ctx); err != nil {
				if f.ctx.Err() != nil {
					return
				}
				d := bo.next()
				if logWorthy(bo.n) {
					f.log.Warn("looking up partition leaders failed; retrying", zap.Duration("backoff", d), zap.Error(err))
				}
				retry = time.After(d)
				continue
			}
			bo.reset()
			if f.needLeaders() {
				retry = time.After(look.next())
			} else {
				look.reset()
			}
		}
		f.resolveOutOfRange()
	}
}

// A fetch a broker has not answered within FetchMaxWait plus overdueAfter
// may be held by a broker that is shutting down: it hands its partitions
// to other leaders first and answers nothing more until its process exits,
// a second or two later. The metadata is then read again (at most every
// overdueLookup), and the request is abandoned if a partition in it has
// moved, so the partition resumes at its new leader at once. A broker
// merely slow keeps its request.
// The lookup avoids the broker: one shutting down would hold it as long
// (wire.Client.Suspect), as it does after a failed fetch.
const (
	overdueCheck  = 100 * time.Millisecond
	overdueAfter  = 250 * time.Millisecond
	overdueLookup = 500 * time.Millisecond
	suspectFor    = 10 * time.Second
)

// overdue says whether a broker loop's request is overdue at now, and
// makes the metadata lookups avoid the brokers of those that are.
func (f *fetcher) overdue(now time.Time) bool {
	var late []string
	for _, b := range f.allLoops() {
		b.mu.Lock()
		if b.inflight != nil && now.Sub(b.sent) > f.cfg.FetchMaxWait+overdueAfter {
			late = append(late, b.addr)
		}
		b.mu.Unlock()
	}
	for _, addr := range late {
		f.cl.client.Suspect(addr, suspectFor)
	}
	return len(late) > 0
}

// abandonMoved reads the metadata and abandons every request in flight
// (only the overdue ones with overdueOnly) holding a partition that has
// moved to another leader: the old one may answer nothing, or nothing
// useful, until it is gone.
func (f *fetcher) abandonMoved(overdueOnly bool) {
	if err := f.refreshLeaders(f.ctx); err != nil {
		if f.ctx.Err() == nil {
			f.log.Debug("reading the metadata failed", zap.Error(err))
		}
		return // the request's own deadline still stands
	}
	now := time.Now()
	f.mu.Lock() // for the cursors' leaders
	defer f.mu.Unlock()
	for _, b := range f.allLoops() {
		b.mu.Lock()
		if b.inflight != nil && (!overdueOnly || now.Sub(b.sent) > f.cfg.FetchMaxWait+overdueAfter) {
			for _, fs := range b.inflight.states {
				if fs.leader != b.id {
					f.log.Info("a fetch in flight at a broker that no longer leads a partition in it; abandoning it",
						zap.Int32("broker", b.id), zap.String("topic", fs.p.tp.topic), zap.Int32("partition", fs.p.tp.partition),
						zap.Int32("leader", fs.leader), zap.Duration("waited", now.Sub(b.sent)))
					b.abandon()
					break
				}
			}
		}
		b.mu.Unlock()
	}
}

// needLeaders says whether a partition has no leader, or one whose broker
// loop is failing (its broker may be down while Kafka still names it).
func (f *fetcher) needLeaders() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.leaderless) > 0 {
		return true
	}
	for _, b := range f.allLoops() {
		b.mu.Lock()
		failing := b.failing && len(b.cursors) > 0
		b.mu.Unlock()
		if failing {
			return true
		}
	}
	return false
}

// refreshLeaders reads the consumed topics' metadata, moves partitions to
// their current leaders and starts a loop for each new broker.
func (f *fetcher) refreshLeaders(ctx context.Context) error {
	leaders, addrs, errs := f.leaders.refresh(ctx)
	if leaders == nil {
		return errs
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx == nil || f.ctx.Err() != nil {
		return errs // not running: no loops to start
	}
	for id, addr := range addrs {
		f.loopLocked(id, addr)
	}
	for tp, fs := range f.parts {
		id, ok := leaders[tp]
		if !ok {
			id = -1
		}
		if id != fs.leader {
			if fs.leader >= 0 {
				f.log.Info("partition leader moved", zap.String("topic", tp.topic), zap.Int32("partition", tp.partition),
					zap.Int32("from", fs.leader), zap.Int32("to", id))
			}
			f.setLeader(fs, id)
		}
	}
	for _, b := range f.allLoops() {
		b.mu.Lock()
		for _, fs := range b.cursors {
			if fs.refused >= 0 && fs.leader >= 0 && fs.leader != fs.refused {
				// Another broker than the one that refused it: fetched at once.
				fs.retryAt, fs.refused = time.Time{}, -1
			}
		}
		b.mu.Unlock()
		b.signal()
	}
	return errs
}

// loopLocked starts broker id's loops (fetchLanes of them) if the fetcher
// runs and they do not, with addr as their address from now on. f.mu is
// held.
func (f *fetcher) loopLocked(id int32, addr string) {
	if lanes := f.brokers[id]; lanes != nil {
		for _, b := range lanes {
			b.mu.Lock()
			b.addr = addr
			b.mu.Unlock()
		}
		return
	}
	if f.ctx == nil || f.ctx.Err() != nil {
		return
	}
	lanes := make([]*brokerLoop, fetchLanes)
	for i := range lanes {
		lanes[i] = newBrokerLoop(id, addr)
	}
	f.addLoops(id, lanes)
	for _, b := range lanes {
		f.wg.Add(1)
		go f.runBroker(b)
	}
}

// addLoops makes lanes broker id's loops. f.mu is held.
func (f *fetcher) addLoops(id int32, lanes []*brokerLoop) {
	f.brokers[id] = lanes
	all := append(slices.Clip(f.allLoops()), lanes...)
	f.loops.Store(&all)
}

// resolveOutOfRange applies the OutOfRange policy to the partitions whose
// position a broker refused, queueing the reset (or stall) for their
// goroutines, which record it after the messages before it.
func (f *fetcher) resolveOutOfRange() {
	f.mu.Lock()
	todo := make([]*fetchState, 0, len(f.outOfRange))
	for fs := range f.outOfRange {
		todo = append(todo, fs)
	}
	f.mu.Unlock()
	for _, fs := range todo {
		tp := fs.p.tp
		bounds := f.positions.bounds(f.ctx, []topicPartition{tp}, f.watch)
		if bounds == nil {
			return // ctx ended
		}
		b := bounds[0]
		f.mu.Lock()
		if f.parts[tp] != fs {
			f.mu.Unlock()
			continue
		}
		bl := f.lockCursor(fs)
		fs.outOfRange = false
		delete(f.outOfRange, fs)
		from := fs.next
		switch {
		case from >= b.first && from <= b.last:
			f.log.Warn("fetch out of range, but the position is inside the log now; fetching again",
				zap.String("topic", tp.topic), zap.Int32("partition", tp.partition), zap.Int64("offset", from),
				zap.Int64("log_start", b.first), zap.Int64("log_end", b.last))
		default:
			reason := fmt.Sprintf("fetch at %d out of the log [%d, %d]", from, b.first, b.last)
			if to, ok := f.positions.target(b); ok {
				fs.p.q.push(&chunk{reset: &reset{from: from, to: to, first: b.first, last: b.last, reason: reason}, end: to})
				fs.next = to
			} else {
				fs.stalled = true
				fs.p.q.push(&chunk{stall: stallError(tp, from, b.first, b.last, reason)})
			}
		}
		if bl != nil {
			bl.mu.Unlock()
			bl.signal()
		}
		f.mu.Unlock()
	}
}

// leaderTable is which broker leads each partition of the consumed topics,
// and the brokers' addresses, as the last metadata read said: the fetcher
// places its cursors by it, positions asks the leaders it names. Each
// read replaces the maps whole (a snapshot never changes once made). Safe
// for concurrent use.
type leaderTable struct {
	cl     *cluster
	topics []string

	mu      sync.Mutex
	leaders map[topicPartition]int32
	addrs   map[int32]string
}

func newLeaderTable(cl *cluster, topics []string) *leaderTable {
	return &leaderTable{cl: cl, topics: topics, leaders: map[topicPartition]int32{}, addrs: map[int32]string{}}
}

// refresh reads the consumed topics' metadata and makes it the table. It
// returns the new snapshot, nil if the read failed, and the errors of the
// read or of topics it could not describe.
func (t *leaderTable) refresh(ctx context.Context) (map[topicPartition]int32, map[int32]string, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cl.cfg.Timeout)
	defer cancel()
	md, err := t.cl.metadata(ctx, t.topics)
	if err != nil {
		return nil, nil, err
	}
	brokers := map[int32]string{}
	for _, b := range md.Brokers {
		brokers[b.NodeID] = wire.Addr(b)
	}
	leaders := map[topicPartition]int32{}
	addrs := map[int32]string{}
	var errs []error
	for _, tm := range md.Topics {
		name := *tm.Topic
		if err := wire.Error(tm.ErrorCode); err != nil {
			errs = append(errs, fmt.Errorf("topic %q: %w", name, err))
			continue
		}
		for _, p := range tm.Partitions {
			addr, ok := brokers[p.Leader]
			if p.ErrorCode != 0 || !ok {
				continue // no leader now: looked up again
			}
			leaders[topicPartition{name, p.Partition}] = p.Leader
			addrs[p.Leader] = addr
		}
	}
	t.mu.Lock()
	t.leaders, t.addrs = leaders, addrs
	t.mu.Unlock()
	return leaders, addrs, errors.Join(errs...)
}

// leader is tp's leader and its address, if known.
func (t *leaderTable) leader(tp topicPartition) (int32, string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.leaders[tp]
	return id, t.addrs[id], ok
}

// of returns the leader of each of tps and the brokers' addresses, reading
// the metadata again when one is not known.
func (t *leaderTable) of(ctx context.Context, tps []topicPartition) ([]int32, map[int32]string, error) {
	for try := 0; ; try++ {
		t.mu.Lock()
		leaders := make([]int32, len(tps))
		addrs := map[int32]string{}
		missing := -1
		for i, tp := range tps {
			id, ok := t.leaders[tp]
			if !ok {
				missing = i
				break
			}
			leaders[i], addrs[id] = id, t.addrs[id]
		}
		t.mu.Unlock()
		if missing < 0 {
			return leaders, addrs, nil
		}
		if try > 0 {
			return nil, nil, fmt.Errorf("%s/%d: no leader in the metadata", tps[missing].topic, tps[missing].partition)
		}
		if _, _, err := t.refresh(ctx); err != nil {
			return nil, nil, fmt.Errorf("metadata: %w", err)
		}
	}
}

// forget drops what is known of the leaders of tps[idx...], so that the
// next lookup reads the metadata again.
func (t *leaderTable) forget(tps []topicPartition, idx []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	leaders := maps.Clone(t.leaders)
	for _, i := range idx {
		delete(leaders, tps[i])
	}
	t.leaders = leaders
}
