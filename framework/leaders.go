package framework

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
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
	defer func() {
		f.wg.Wait()
		f.adminMu.Lock()
		for id, conn := range f.admin {
			conn.Close()
			delete(f.admin, id)
		}
		f.adminMu.Unlock()
	}()
	bo := newBackoff(100*time.Millisecond, 5*time.Second)
	// Kafka may name a dead leader for many seconds; the metadata is read
	// again at least twice a second until it names one that answers, so
	// that a partition moves within half a second of its new leader's
	// election, however long the old leader's broker loop backs off.
	look := newBackoff(50*time.Millisecond, 500*time.Millisecond)
	overdue := time.NewTicker(overdueCheck)
	defer overdue.Stop()
	age := time.NewTicker(f.c.cfg.MetadataMaxAge)
	defer age.Stop()
	var retry <-chan time.Time
	var lastOverdue time.Time
	for {
		f.c.live.fetcher.idle() // liveness (liveness.go)
		select {
		case <-f.ctx.Done():
			return
		case <-f.kick:
		case <-retry:
		case <-age.C:
			// Leaders that moved without a refused fetch (MetadataMaxAge).
			f.c.live.fetcher.busy()
			f.abandonMoved(false)
			continue
		case now := <-overdue.C:
			if now.Sub(lastOverdue) >= overdueLookup && f.overdue(now) {
				lastOverdue = now
				f.c.live.fetcher.busy()
				f.abandonMoved(true)
			}
			continue
		}
		f.c.live.fetcher.busy()
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
	f.mu.Lock()
	var late []string
	for _, b := range f.brokers {
		if b.inflight != nil && now.Sub(b.sent) > f.c.cfg.FetchMaxWait+overdueAfter {
			late = append(late, b.addr)
		}
	}
	f.mu.Unlock()
	for _, addr := range late {
		f.c.kafka.Suspect(addr, suspectFor)
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
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.brokers {
		if b.inflight == nil || overdueOnly && now.Sub(b.sent) <= f.c.cfg.FetchMaxWait+overdueAfter {
			continue
		}
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
}

// needLeaders says whether a partition has no leader, or one whose broker
// loop is failing (its broker may be down while Kafka still names it).
func (f *fetcher) needLeaders() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.leaderless) > 0 {
		return true
	}
	for _, b := range f.brokers {
		if b.failing && len(b.cursors) > 0 {
			return true
		}
	}
	return false
}

// refreshLeaders reads the consumed topics' metadata, moves partitions to
// their current leaders and starts a loop for each new broker.
func (f *fetcher) refreshLeaders(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.c.cfg.Timeout)
	defer cancel()
	md, err := f.c.metadata(ctx, f.c.cfg.Topics)
	if err != nil {
		return err
	}
	brokers := map[int32]string{}
	for _, b := range md.Brokers {
		brokers[b.NodeID] = wire.Addr(b)
	}
	leaders := map[topicPartition]int32{}
	addrs := map[int32]string{}
	var errs []error
	for _, t := range md.Topics {
		name := *t.Topic
		if err := wire.Error(t.ErrorCode); err != nil {
			errs = append(errs, fmt.Errorf("topic %q: %w", name, err))
			continue
		}
		for _, p := range t.Partitions {
			addr, ok := brokers[p.Leader]
			if p.ErrorCode != 0 || !ok {
				continue // no leader now: looked up again
			}
			leaders[topicPartition{name, p.Partition}] = p.Leader
			addrs[p.Leader] = addr
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leaders = leaders
	if f.ctx == nil || f.ctx.Err() != nil {
		return errors.Join(errs...) // not running: no loops to start
	}
	for id, addr := range addrs {
		if b := f.brokers[id]; b != nil {
			b.addr = addr // read by its loop at the next dial, under mu
			continue
		}
		b := &brokerLoop{id: id, addr: addr, wake: make(chan struct{}, 1)}
		f.brokers[id] = b
		f.wg.Add(1)
		go f.runBroker(b)
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
		if id >= 0 && fs.refused >= 0 && id != fs.refused {
			// Another broker than the one that refused it: fetched at once.
			fs.retryAt, fs.refused = time.Time{}, -1
		}
		if b := f.brokers[id]; b != nil {
			b.signal()
		}
	}
	return errors.Join(errs...)
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
		bounds := f.c.logBounds(f.ctx, []topicPartition{tp}, &f.c.live.fetcher)
		if bounds == nil {
			return // ctx ended
		}
		b := bounds[0]
		f.mu.Lock()
		if f.parts[tp] != fs {
			f.mu.Unlock()
			continue
		}
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
			if to, ok := f.c.outOfRangeTarget(b); ok {
				fs.p.q.push(&chunk{reset: &reset{from: from, to: to, first: b.first, last: b.last, reason: reason}, end: to})
				fs.next = to
			} else {
				fs.stalled = true
				fs.p.q.push(&chunk{stall: f.c.stallError(tp, from, b.first, b.last, reason)})
			}
		}
		if bl := f.brokers[fs.leader]; bl != nil {
			bl.signal()
		}
		f.mu.Unlock()
	}
}

// Log bounds (the first offset and the high watermark of partitions) are
// asked of each partition's leader in two ListOffsets requests per broker,
// on one connection per broker kept by the fetcher for that purpose, not
// one request per partition and offset on a connection of its own: a
// thousand partitions would mean hundreds of sockets at every assignment.

// listOffsets returns the log bounds of tps, in order.
func (f *fetcher) listOffsets(ctx context.Context, tps []topicPartition) ([]logBounds, error) {
	leaders, addrs, err := f.leadersOf(ctx, tps)
	if err != nil {
		return nil, err
	}
	byBroker := map[int32][]int{}
	for i := range tps {
		byBroker[leaders[i]] = append(byBroker[leaders[i]], i)
	}
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	out := make([]logBounds, len(tps))
	for id, idx := range byBroker {
		conn := f.admin[id]
		if conn == nil {
			if conn, err = f.c.dial(ctx, addrs[id]); err != nil {
				f.forgetLeaders(tps, idx)
				return nil, err
			}
			f.admin[id] = conn
		}
		asks := []listAsk{{ts: kafka.FirstOffset}, {ts: kafka.LastOffset}}
		if f.c.cfg.IsolationLevel == kafka.ReadCommitted {
			// The LSO before the log end: asked after it, it could pass it.
			asks = []listAsk{asks[0], {ts: kafka.LastOffset, committed: true}, asks[1]}
		}
		for _, ask := range asks {
			if err := listOffsets(ctx, conn, tps, idx, ask, out, f.c.cfg.Timeout); err != nil {
				if _, partial := err.(partitionErr); !partial {
					conn.Close()
					delete(f.admin, id)
				}
				f.forgetLeaders(tps, idx)
				return nil, fmt.Errorf("listing offsets on broker %d: %w", id, err)
			}
		}
	}
	for i, b := range out {
		if f.c.cfg.IsolationLevel != kafka.ReadCommitted {
			out[i].stable, b.stable = b.last, b.last
		}
		if b.first < 0 || b.last < b.first || b.stable < b.first || b.stable > b.last {
			return nil, fmt.Errorf("%s/%d: invalid log bounds [%d, %d] (last stable offset %d)", tps[i].topic, tps[i].partition, b.first, b.last, b.stable)
		}
	}
	return out, nil
}

// partitionErr is an error a broker answered for a partition: the
// connection is fine.
type partitionErr struct{ error }

// listAsk is one ListOffsets question: the first offset, the log end, or
// (committed) the last stable offset, the log end at read_committed.
type listAsk struct {
	ts        int64
	committed bool
}

// listOffsets asks conn ask of tps[idx...] and stores the answers in out.
func listOffsets(ctx context.Context, conn *wire.Conn, tps []topicPartition, idx []int, ask listAsk, out []logBounds, timeout time.Duration) error {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if ask.committed {
		req.IsolationLevel = 1
	}
	ts := ask.ts
	byTopic := map[string]int{}
	for _, i := range idx {
		tp := tps[i]
		ti, ok := byTopic[tp.topic]
		if !ok {
			ti = len(req.Topics)
			byTopic[tp.topic] = ti
			t := kmsg.NewListOffsetsRequestTopic()
			t.Topic = tp.topic
			req.Topics = append(req.Topics, t)
		}
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Partition, p.CurrentLeaderEpoch, p.Timestamp = tp.partition, -1, ts
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, p)
	}
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return err
	}
	got := map[topicPartition]kmsg.ListOffsetsResponseTopicPartition{}
	for _, t := range msg.(*kmsg.ListOffsetsResponse).Topics {
		for _, p := range t.Partitions {
			got[topicPartition{t.Topic, p.Partition}] = p
		}
	}
	for _, i := range idx {
		p, ok := got[tps[i]]
		switch {
		case !ok:
			return partitionErr{fmt.Errorf("%s/%d: no offset in the ListOffsets response", tps[i].topic, tps[i].partition)}
		case p.ErrorCode != 0:
			return partitionErr{fmt.Errorf("%s/%d: %w", tps[i].topic, tps[i].partition, kafka.Error(p.ErrorCode))}
		case ts == kafka.FirstOffset:
			out[i].first = p.Offset
		case ask.committed:
			out[i].stable = p.Offset
		default:
			out[i].last = p.Offset
		}
	}
	return nil
}

// leadersOf returns the leader of each of tps and the brokers' addresses,
// looking the metadata up again when one is not known.
func (f *fetcher) leadersOf(ctx context.Context, tps []topicPartition) ([]int32, map[int32]string, error) {
	for try := 0; ; try++ {
		f.mu.Lock()
		leaders := make([]int32, len(tps))
		addrs := map[int32]string{}
		missing := -1
		for i, tp := range tps {
			id, ok := f.leaders[tp]
			b := f.brokers[id]
			if !ok || b == nil {
				missing = i
				break
			}
			leaders[i], addrs[id] = id, b.addr
		}
		f.mu.Unlock()
		if missing < 0 {
			return leaders, addrs, nil
		}
		if try > 0 {
			return nil, nil, fmt.Errorf("%s/%d: no leader in the metadata", tps[missing].topic, tps[missing].partition)
		}
		if err := f.refreshLeaders(ctx); err != nil {
			return nil, nil, fmt.Errorf("metadata: %w", err)
		}
	}
}

// forgetLeaders drops what is known of the leaders of tps[idx...], so that
// the next lookup asks the metadata again.
func (f *fetcher) forgetLeaders(tps []topicPartition, idx []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, i := range idx {
		delete(f.leaders, tps[i])
	}
}
