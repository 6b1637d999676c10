package framework

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/wire"
)

// Fetching is the first stage of the data path: fetch → decode
// (partition.go) → dispatch (dispatch.go) → invoke (invoke.go) → mark
// (tracker.go) → flush (offsetstore) → commit (committer.go).
//
// fetcher fetches every partition this consumer owns. One loop per broker
// sends multi-partition Fetch requests for the partitions that broker leads,
// splits each answer per partition and queues the messages on the
// partition (a chunk per partition and response), where the partition's
// goroutine handles them in offset order. One budget, MaxBufferedBytes,
// bounds the fetched but not yet handled bytes across all partitions; a
// partition is fetched while it holds less than its share of it, so a slow
// partition never holds back the others.
//
// Goroutines: Consumer.Run starts run, the fetcher's own goroutine (leader
// lookups and out-of-range positions), and cancels it after the last
// generation ended; run starts one brokerLoop goroutine per broker that
// leads an owned partition and waits for all of them before it returns.
// Partition goroutines call add, remove and release, which never wait on the
// network.
type fetcher struct {
	c   *Consumer
	log *zap.Logger
	ctx context.Context

	requests atomic.Uint64
	buffered atomic.Int64 // fetched, not yet handled, across partitions

	kick chan struct{} // wakes run

	mu      sync.Mutex
	parts   map[topicPartition]*fetchState
	brokers map[int32]*brokerLoop
	leaders map[topicPartition]int32 // from the last metadata
	// reserved is the budget held by requests in flight; starved is set
	// when a broker loop found no budget left, so that releases wake it.
	reserved int64
	starved  bool
	wg       sync.WaitGroup // broker loops

	// admin holds a connection per broker for ListOffsets (leaders.go),
	// one request at a time; closed when run returns.
	adminMu sync.Mutex
	admin   map[int32]*wire.Conn
}

// fetchState is the fetcher's view of one owned partition, guarded by
// fetcher.mu. While inflight, next belongs to the broker loop whose request
// holds the partition.
type fetchState struct {
	p        *partition
	next     int64
	leader   int32 // -1 while unknown
	inflight bool
	idle     bool // the last fetch returned nothing for it
	// outOfRange waits for run to apply the OutOfRange policy; stalled
	// ends fetching until the partition is reassigned.
	outOfRange bool
	stalled    bool
	retryAt    time.Time // after a partition error: not fetched before
	bo         backoff   // between partition errors
	// refused is the broker that last answered that it does not lead the
	// partition (-1: none): a lookup naming another leader ends retryAt,
	// for the new leader has no reason to be waited for.
	refused  int32
	buffered int64
}

// brokerLoop is one broker's fetch loop; see fetcher.runBroker.
type brokerLoop struct {
	id   int32
	addr string
	wake chan struct{}
	turn int // rotates the partitions' order across requests
	// failing is set (under fetcher.mu) from a failed request to the next
	// answered one: the fetcher keeps looking up the leaders of the
	// partitions Kafka says it leads.
	failing bool
	// inflight is the request waiting for its answer, sent at sent;
	// abandon cancels it. Set by the loop under fetcher.mu, for the
	// fetcher's check of requests overdue at a broker that may have handed
	// its partitions on (leaders.go).
	inflight *request
	sent     time.Time
	abandon  context.CancelFunc
}

// newFetcher makes the Consumer's fetcher; Run sets its ctx and starts it.
func newFetcher(c *Consumer) *fetcher {
	return &fetcher{
		c:       c,
		log:     c.log.Named("fetch"),
		kick:    make(chan struct{}, 1),
		parts:   map[topicPartition]*fetchState{},
		brokers: map[int32]*brokerLoop{},
		leaders: map[topicPartition]int32{},
		admin:   map[int32]*wire.Conn{},
	}
}

// add starts fetching p at offset next.
func (f *fetcher) add(p *partition, next int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := &fetchState{p: p, next: next, leader: -1, refused: -1, bo: newBackoff(50*time.Millisecond, 5*time.Second)}
	if id, ok := f.leaders[p.tp]; ok {
		fs.leader = id
	}
	f.parts[p.tp] = fs
	if b := f.brokers[fs.leader]; b != nil {
		b.signal()
	} else {
		f.signal()
	}
}

// remove stops fetching p and drops what is buffered for it. The partition
// goroutine calls it as it exits.
func (f *fetcher) remove(p *partition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.parts[p.tp]
	if fs == nil || fs.p != p {
		return
	}
	delete(f.parts, p.tp)
	f.buffered.Add(-fs.buffered)
	p.st.buffered.Store(0)
	f.wakeStarved()
}

// release gives back n bytes of the budget: a batch was handled.
func (f *fetcher) release(p *partition, n int64) {
	if n == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.parts[p.tp]
	if fs == nil || fs.p != p {
		return
	}
	fs.buffered -= n
	f.buffered.Add(-n)
	p.st.buffered.Add(-n)
	if fs.buffered < f.share() {
		if b := f.brokers[fs.leader]; b != nil {
			b.signal()
		}
	}
	f.wakeStarved()
}

// wakeAll wakes every broker loop, for a partition resumed after a pause.
func (f *fetcher) wakeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.brokers {
		b.signal()
	}
}

func (f *fetcher) wakeStarved() {
	if f.starved && f.buffered.Load()+f.reserved < int64(f.c.cfg.MaxBufferedBytes) {
		f.starved = false
		for _, b := range f.brokers {
			b.signal()
		}
	}
}

// share is each partition's part of the budget: a partition is fetched while
// it holds less than this.
func (f *fetcher) share() int64 {
	n := max(len(f.parts), 1)
	return min(max(int64(f.c.cfg.MaxBufferedBytes)/int64(n), 4<<10), int64(f.c.cfg.FetchMaxBytes))
}

func (f *fetcher) signal() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// pause waits until b is woken (true), d passed (false; d 0 waits for a
// wake only), or ctx ended (ok false).
func (b *brokerLoop) pause(ctx context.Context, d time.Duration) (woken, ok bool) {
	var timer <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return false, false
	case <-b.wake:
		return true, true
	case <-timer:
		return false, true
	}
}

func (b *brokerLoop) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// request is one Fetch request in flight and what it holds.
type request struct {
	req     *kmsg.FetchRequest
	states  []*fetchState
	offsets []int64 // each state's position when the request was built
	reserve int64
}

// build makes the next request for broker b. It returns nil and how long
// to wait (0: until woken) when nothing should be fetched now. waited says
// the loop already waited once for partitions whose buffers are full.
func (f *fetcher) build(b *brokerLoop, waited bool) (*request, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cfg := &f.c.cfg
	share := f.share()
	now := time.Now()
	var ready []*fetchState
	var wait time.Duration
	full, allIdle := false, true
	behind := false             // a partition left out for its full buffer has more to fetch
	leading := map[int32]bool{} // brokers that lead an owned partition: the budget is shared among their loops
	for _, fs := range f.parts {
		if fs.leader >= 0 {
			leading[fs.leader] = true
		}
		if fs.leader != b.id || fs.inflight || fs.outOfRange || fs.stalled || fs.p.st.held.Load() {
			continue
		}
		if d := fs.retryAt.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		if fs.buffered >= share {
			full = true
			behind = behind || fs.next < fs.p.st.hwm.Load()
			continue
		}
		allIdle = allIdle && fs.idle
		ready = append(ready, fs)
	}
	if len(ready) == 0 {
		return nil, wait
	}
	if full && allIdle && !waited {
		// A partition with a full buffer is being handled: give it up to
		// FetchMaxWait to make room rather than start a long poll on idle
		// partitions that it would then have to wait out.
		return nil, cfg.FetchMaxWait
	}
	avail := int64(cfg.MaxBufferedBytes) - f.buffered.Load() - f.reserved
	if avail <= 0 {
		f.starved = true
		return nil, wait
	}
	reserve := avail / int64(max(len(leading), 1))
	if reserve < share {
		reserve = min(avail, share)
	}
	f.reserved += reserve
	// A partition asks for half its share, so that it is fetched again
	// while the other half is handled: the next chunk arrives before the
	// last one runs out. It asks for at least 64 KiB (or FetchMaxBytes),
	// whatever its share: a broker returns a batch larger than asked for
	// only for the first partition of a response, so asking for less than a
	// producer's batch would move one partition per request. The request's
	// total, from the budget, still bounds what comes back.
	maxBytes := int32(min(reserve, 1<<30))
	fmb := int64(cfg.FetchMaxBytes)
	partMax := int32(min(max(share/2, min(64<<10, fmb)), fmb))

	// Rotate so that partitions late in one request come first in the next:
	// the broker fills the response in request order.
	b.turn++
	k := b.turn % len(ready)
	ready = append(ready[k:], ready[:k]...)
	r := &request{states: ready, offsets: make([]int64, len(ready)), reserve: reserve}
	maxWait := cfg.FetchMaxWait
	if behind {
		// The broker would hold a long poll on these partitions until one
		// has data or FetchMaxWait passed, and the partition left out for
		// its full buffer, with more to fetch, would wait that long for
		// its next fetch once it made room.
		maxWait = 0
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(maxWait / time.Millisecond)
	req.MinBytes = 1
	req.MaxBytes = maxBytes
	req.SessionEpoch = -1 // no fetch session: every request is complete
	req.IsolationLevel = int8(cfg.IsolationLevel)
	byTopic := map[string]int{}
	for i, fs := range ready {
		fs.inflight = true
		r.offsets[i] = fs.next
		ti, ok := byTopic[fs.p.tp.topic]
		if !ok {
			ti = len(req.Topics)
			byTopic[fs.p.tp.topic] = ti
			t := kmsg.NewFetchRequestTopic()
			t.Topic = fs.p.tp.topic
			req.Topics = append(req.Topics, t)
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = fs.p.tp.partition
		rp.CurrentLeaderEpoch = -1
		rp.FetchOffset = fs.next
		rp.LogStartOffset = -1
		rp.PartitionMaxBytes = partMax
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, rp)
	}
	r.req = req
	return r, 0
}

// runBroker is broker b's fetch loop: build a request for the partitions b
// leads that may be fetched, send it on b's connection, hand the answer to
// the partitions, and again. It exits when the fetcher's ctx ends.
func (f *fetcher) runBroker(b *brokerLoop) {
	defer f.wg.Done()
	var conn *wire.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	bo := newBackoff(50*time.Millisecond, 5*time.Second)
	waited := false
	for f.ctx.Err() == nil {
		r, wait := f.build(b, waited)
		if r == nil {
			woken, ok := b.pause(f.ctx, wait)
			if !ok {
				return
			}
			waited = !woken
			continue
		}
		waited = false
		if conn == nil {
			f.mu.Lock()
			addr := b.addr
			f.mu.Unlock()
			var err error
			if conn, err = f.c.dial(f.ctx, addr); err != nil {
				f.failed(b, r, err, &bo)
				continue
			}
		}
		f.requests.Add(1)
		rctx, abandon := context.WithCancel(f.ctx)
		f.mu.Lock()
		b.inflight, b.sent, b.abandon = r, time.Now(), abandon
		f.mu.Unlock()
		msg, err := conn.Do(rctx, r.req, f.c.cfg.FetchMaxWait+f.c.cfg.Timeout)
		f.mu.Lock()
		b.inflight, b.abandon = nil, nil
		f.mu.Unlock()
		abandon()
		var res *kmsg.FetchResponse
		if err == nil {
			res = msg.(*kmsg.FetchResponse)
			if kerr := wire.Error(res.ErrorCode); kerr != nil {
				err = fmt.Errorf("fetch from broker %d: %w", b.id, kerr)
			}
		}
		if err != nil {
			conn.Close()
			conn = nil
			f.failed(b, r, err, &bo)
			continue
		}
		if bo.n > 0 {
			bo.reset()
			f.mu.Lock()
			b.failing = false
			f.mu.Unlock()
		}
		f.deliver(b, r, res)
	}
}

// failed handles a request that got no answer: its partitions are looked up
// again (their leader may have moved) and the loop backs off.
func (f *fetcher) failed(b *brokerLoop, r *request, err error, bo *backoff) {
	f.mu.Lock()
	f.reserved -= r.reserve
	stopping := f.ctx.Err() != nil // a stop is not an error of the partitions
	for _, fs := range r.states {
		fs.inflight = false
		if !stopping {
			fs.p.st.setError(fmt.Errorf("fetch %s/%d at offset %d from broker %d: %w", fs.p.tp.topic, fs.p.tp.partition, fs.next, b.id, err))
		}
		fs.leader = -1
	}
	b.failing = true
	addr := b.addr
	f.wakeStarved()
	f.mu.Unlock()
	f.c.kafka.Suspect(addr, suspectFor)
	if f.ctx.Err() != nil {
		return
	}
	d := bo.next()
	if logWorthy(bo.n) {
		f.log.Warn("fetch failed; looking up leaders again and retrying", zap.Int32("broker", b.id),
			zap.Int("partitions", len(r.states)), zap.Duration("backoff", d), zap.Error(err))
	}
	f.signal()
	sleep(f.ctx, d)
}

// deliver queues each partition's record batches from a response. Only
// the batch headers are read here, for the next position: the partition's
// goroutine decodes the records (records.go), so decoding runs on as many
// cores as there are busy partitions and the next fetch leaves at once.
func (f *fetcher) deliver(b *brokerLoop, r *request, res *kmsg.FetchResponse) {
	index := make(map[topicPartition]int, len(r.states))
	for i, fs := range r.states {
		index[fs.p.tp] = i
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserved -= r.reserve
	for _, fs := range r.states {
		fs.inflight = false
	}
	for ti := range res.Topics {
		for pi := range res.Topics[ti].Partitions {
			f.deliverPartition(b, r, index, res.Topics[ti].Topic, &res.Topics[ti].Partitions[pi])
		}
	}
	for _, fs := range r.states {
		if fs.leader != b.id && f.parts[fs.p.tp] == fs {
			if nb := f.brokers[fs.leader]; nb != nil {
				nb.signal() // moved while this request held it
			}
		}
	}
	f.wakeStarved()
}

// deliverPartition queues one partition's part of a response.
func (f *fetcher) deliverPartition(b *brokerLoop, r *request, index map[topicPartition]int, topic string, fr *kmsg.FetchResponseTopicPartition) {
	j, ok := index[topicPartition{topic, fr.Partition}]
	if !ok {
		return
	}
	fs := r.states[j]
	if f.parts[fs.p.tp] != fs {
		return // revoked while in flight
	}
	if fr.ErrorCode != 0 {
		f.partitionError(b, fs, kafka.Error(fr.ErrorCode))
		return
	}
	// The partition is served again: the next error (a leader move)
	// backs off from the start, not from where the last one left off.
	fs.bo.reset()
	st := fs.p.st
	if fr.HighWatermark >= 0 {
		st.hwm.Store(fr.HighWatermark)
	}
	from := r.offsets[j]
	end, err := scanBatches(fr.RecordBatches, from)
	rc := f.c.cfg.IsolationLevel == kafka.ReadCommitted
	lso := int64(math.MaxInt64) // a broker that sends none returns decided records only
	if rc && fr.LastStableOffset >= 0 {
		lso = fr.LastStableOffset
		end = max(min(end, lso), from)
		st.observeLSO(lso, fr.HighWatermark, end, time.Now())
	}
	if err != nil {
		err = fmt.Errorf("fetch %s/%d at offset %d from broker %d: %w", topic, fr.Partition, from, b.id, err)
		st.setError(err)
		fs.stalled = true
		fs.p.q.push(&chunk{from: from, end: from, stall: err})
		return
	}
	fs.idle = end == from
	if end == from {
		return
	}
	ch := &chunk{from: from, raw: fr.RecordBatches, hwm: fr.HighWatermark, end: end, bytes: int64(len(fr.RecordBatches)),
		lso: lso}
	if rc {
		ch.aborted = abortedTxns(fr.AbortedTransactions)
	}
	fs.next = end
	f.charge(fs, ch.bytes)
	fs.p.q.push(ch)
}

// charge counts n more bytes buffered for fs (n < 0 returns them).
func (f *fetcher) charge(fs *fetchState, n int64) {
	fs.buffered += n
	f.buffered.Add(n)
	fs.p.st.buffered.Add(n)
}

// stall ends fetching p: its goroutine met records it cannot decode.
func (f *fetcher) stall(p *partition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fs := f.parts[p.tp]; fs != nil && fs.p == p {
		fs.stalled = true
	}
}

// leaderRetryMax caps the wait after a broker said it does not lead a
// partition that the metadata still names it for.
const leaderRetryMax = 250 * time.Millisecond

// partitionError handles an error code a broker answered for one partition.
func (f *fetcher) partitionError(b *brokerLoop, fs *fetchState, code kafka.Error) {
	tp := fs.p.tp
	err := fmt.Errorf("fetch %s/%d at offset %d from broker %d: %w", tp.topic, tp.partition, fs.next, b.id, code)
	fs.p.st.setError(err)
	switch code {
	case kafka.OffsetOutOfRange:
		fs.outOfRange = true
		f.signal()
	case kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.UnknownTopicOrPartition,
		kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch, kafka.ReplicaNotAvailable,
		kafka.KafkaStorageError, kafka.OffsetNotAvailable, kafka.NotCoordinatorForGroup:
		f.log.Info("partition is not led by this broker now; looking up its leader", zap.String("topic", tp.topic),
			zap.Int32("partition", tp.partition), zap.Int32("broker", b.id), zap.Error(code))
		fs.leader, fs.refused = -1, b.id
		// A leader just elected may refuse until it has applied its
		// election: retried soon, not after a backoff grown to seconds.
		fs.retryAt = time.Now().Add(min(fs.bo.next(), leaderRetryMax))
		f.signal()
	default:
		d := fs.bo.next()
		if logWorthy(fs.bo.n) {
			f.log.Warn("fetch failed for a partition; retrying it", zap.String("topic", tp.topic), zap.Int32("partition", tp.partition),
				zap.Int64("offset", fs.next), zap.Duration("backoff", d), zap.Error(err))
		}
		fs.retryAt = time.Now().Add(d)
	}
}
