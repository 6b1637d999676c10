package framework

import (
	"context"
	"fmt"
	"math"
	"slices"
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
// (tracker.go) → flush (internal/offsetfile) → commit (committer.go).
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
// Each broker loop owns the cursors (fetchState) of the partitions its
// broker leads, in brokerLoop.cursors; a request is built from that set
// alone, in a rotation that starts after the last partition that got data
// the time before, so no partition starves whatever the count. A cursor
// moves to another loop's set when its leader changes (setLeader). Each
// loop keeps an incremental fetch session with its broker (session.go):
// the request lists only the cursors whose position changed, and forgets
// those the loop stopped fetching.
// Partitions without a leader, and those whose position a broker refused
// (out of range), are also kept in small sets for run (leaders.go), which
// so never scans every partition.
//
// Locks: each broker loop's mu guards its cursors, its session and every
// field of the cursors in its set; it is all a loop takes to build a
// request and deliver its answer, so the loops of one broker and of many
// run side by side. fetcher.mu guards the sets themselves (which set holds
// each cursor) and the cursors in none; it is taken before a loop's mu,
// never while one is held. A cursor in a request in flight stays in that
// loop's set until the answer: a leader move or a lane change waits for
// it, and the loop makes the move (settle) after its answer, under
// fetcher.mu. The partition goroutines release bytes without a lock.
//
// Goroutines: Consumer.Run starts run, the fetcher's own goroutine (leader
// lookups and out-of-range positions), and cancels it after the last
// generation ended; run starts one brokerLoop goroutine per broker that
// leads an owned partition and waits for all of them before it returns.
// Partition goroutines call add, remove and release, which never wait on the
// network.
type fetcher struct {
	cfg       *Config
	log       *zap.Logger
	cl        *cluster
	leaders   *leaderTable
	positions *positions
	watch     *loopWatch // the fetcher goroutine's liveness (liveness.go)
	ctx       context.Context

	requests      atomic.Uint64
	sessionResets atomic.Uint64 // fetch sessions a broker refused (session.go)
	// paused counts the partitions paused now (Consumer.Pause): while
	// none is, build reads no partition's gate (at 10,000 partitions, the
	// reads through three pointers were most of an idle request's build).
	paused   atomic.Int32
	buffered atomic.Int64 // fetched or decoded, not yet handled, across partitions
	// decoded is the part of buffered that partitions hold decompressed
	// (inflate); ratio is the inflation seen last, in 16ths, for a
	// partition that has not decompressed a batch yet; compressed is set
	// once any partition has, and from then on requests leave decoding
	// room (headroom). freed wakes the partitions waiting to inflate.
	decoded    atomic.Int64
	wanted     atomic.Int64 // what the partitions waiting in inflate ask for
	ratio      atomic.Int64
	compressed atomic.Bool
	freedMu    sync.Mutex
	freed      chan struct{}

	kick chan struct{} // wakes run

	// mu guards the sets: parts, brokers, leaderless, outOfRange, which
	// set holds each cursor, and the cursors in none (see Locks above).
	mu    sync.Mutex
	parts map[topicPartition]*fetchState
	// brokers are each broker's loops, its lanes (fetchLanes); loops is
	// every loop, for the wakes that take no lock.
	brokers map[int32][]*brokerLoop
	loops   atomic.Pointer[[]*brokerLoop]
	// leaderless holds the owned partitions in no broker loop's set
	// (leader -1), outOfRange those waiting for the OutOfRange policy:
	// what run looks for, without a scan of parts.
	leaderless map[*fetchState]struct{}
	outOfRange map[*fetchState]struct{}
	leading    atomic.Int32 // broker loops whose set is not empty: they share the budget
	// reserved is the budget held by requests in flight; starved is set
	// when a broker loop found no budget left (brokerLoop.starved says
	// which), so that releases wake it; shareBytes is share(), for the
	// loops and release. Atomic: neither takes mu.
	reserved   atomic.Int64
	starved    atomic.Bool
	shareBytes atomic.Int64
	// addBurst and lastAdd are when (UnixNano) the partitions being added
	// began to come and when the last one came: a request waits for a
	// burst to end (addQuiet without an add, at most coalesce), so that
	// the partitions of one assignment go in one request rather than the
	// first few in one and the rest after its answer. coalesce is
	// addCoalesce (0 in the internal tests that build requests by hand).
	addBurst, lastAdd atomic.Int64
	coalesce          time.Duration
	wg                sync.WaitGroup // broker loops
}

// addQuiet and addCoalesce bound how long a request waits for partitions
// still being added (fetcher.addBurst): at 10,000 partitions the first
// request held 1 of them and the second 4,162, and the rest waited for its
// answer, 0.2 s.
const (
	addQuiet    = time.Millisecond
	addCoalesce = 100 * time.Millisecond
)

// fetchState is the fetcher's view of one owned partition, its cursor.
// Its fields are guarded by the mu of the broker loop whose set holds it
// (loop), or by fetcher.mu while it is in none; leader by fetcher.mu. While
// inflight it stays in the set of the loop whose request holds it.
type fetchState struct {
	p    *partition
	next int64
	// leader is the broker whose loops should fetch it (-1: none known),
	// under fetcher.mu; the cursor is in that broker's lane for it, at
	// index slot, or in fetcher.leaderless (slot -1), or, while in flight,
	// still where it was until the answer (settle). gone: removed, in no
	// set any more; atomic, for a loop whose request held it reads it.
	leader   int32
	slot     int
	gone     atomic.Bool
	inflight bool
	// lost: the loop's broker refused it, or the request holding it
	// failed; settle looks its leader up again. resettle: its leader
	// changed while in flight; settle moves it.
	lost, resettle bool
	// idle: the last fetch returned nothing for it, and it had reached
	// the log's end (or the LSO); a partition left out of a full answer
	// has more and is not idle. behind: the last answer for it ended below
	// the log's end (or the LSO), or none came yet; it is fetched in its
	// own lane (laneFor).
	idle   bool
	behind bool
	// outOfRange waits for run to apply the OutOfRange policy; stalled
	// ends fetching until the partition is reassigned.
	outOfRange bool
	stalled    bool
	retryAt    time.Time // after a partition error: not fetched before
	bo         backoff   // between partition errors
	// refused is the broker that last answered that it does not lead the
	// partition (-1: none): a lookup naming another leader ends retryAt,
	// for the new leader has no reason to be waited for.
	refused int32
	// buffered is what the partition holds of the budget: charged by the
	// broker loop, released by the partition's goroutine, both without
	// fetcher.mu; decoded is the part of it the partition's goroutine holds
	// decompressed (fetcher.inflate). loop is the broker loop whose set
	// holds it (nil: none), for release to wake.
	buffered atomic.Int64
	decoded  atomic.Int64
	loop     atomic.Pointer[brokerLoop]
	// need is the size of a batch the last answer cut short because it
	// was larger than asked for: the next request asks for that much.
	// perOffset is the bytes per offset of its last chunk (expect).
	need      int32
	perOffset int32
	// inSession, sessOffset and sessMax are what the broker loop's fetch
	// session holds for it (session.go); at is its index in the request in
	// flight.
	inSession  bool
	sessOffset int64
	sessMax    int32
	at         int
}

// brokerLoop is one of a broker's fetch loops (its lanes: fetchLanes); see
// fetcher.runBroker. Its goroutine owns its connection, ends and moves;
// mu guards the rest and the cursors in its set.
type brokerLoop struct {
	id   int32
	wake chan struct{}

	mu   sync.Mutex
	addr string // read at the next dial
	// cursors are the owned partitions of this lane of the broker; the
	// next request looks at them from start on. index finds one by name,
	// for an answer that lists partitions in its own order.
	cursors []*fetchState
	index   map[topicPartition]*fetchState
	start   int
	// session is the loop's fetch session with its broker (session.go).
	session fetchSession
	// failing is set from a failed request to the next answered one: the
	// fetcher keeps looking up the leaders of the partitions Kafka says it
	// leads.
	failing bool
	// inflight is the request waiting for its answer, sent at sent;
	// abandon cancels it: for the fetcher's check of requests overdue at
	// a broker that may have handed its partitions on (leaders.go).
	inflight *request
	sent     time.Time
	abandon  context.CancelFunc
	// burst is the add burst (fetcher.addBurst) the loop was woken for,
	// under fetcher.mu: once woken, it looks again every addQuiet until
	// the burst ends, so the other adds of the burst need not wake it
	// (10,000 wakes at 10,000 partitions).
	burst int64
	// starved: the loop found no budget left (fetcher.starved).
	starved atomic.Bool
	// ends is deliver's buffer for scanAnswer; moves are the cursors the
	// last answer left for settle (a lane change, a leader refused or
	// moved, a position out of range). Both reused.
	ends  []int64
	moves []*fetchState
}

// newBrokerLoop makes broker id's loop for one lane.
func newBrokerLoop(id int32, addr string) *brokerLoop {
	return &brokerLoop{id: id, addr: addr, wake: make(chan struct{}, 1), index: map[topicPartition]*fetchState{}}
}

// newFetcher makes the Consumer's fetcher; Run sets its ctx and starts it.
// It fetches from the leaders the table names, asks positions what to do
// with a position a broker refused, and stamps watch.
func newFetcher(cfg *Config, log *zap.Logger, cl *cluster, leaders *leaderTable, ps *positions, watch *loopWatch) *fetcher {
	return &fetcher{
		cfg:       cfg,
		log:       log.Named("fetch"),
		cl:        cl,
		leaders:   leaders,
		positions: ps,
		watch:     watch,
		kick:      make(chan struct{}, 1),
		parts:     map[topicPartition]*fetchState{},
		brokers:   map[int32][]*brokerLoop{},

		leaderless: map[*fetchState]struct{}{},
		outOfRange: map[*fetchState]struct{}{},
		coalesce:   addCoalesce,
	}
}

// fetchLanes is how many loops fetch from each broker, each with its own
// connection and fetch session. With one, the budget freed while a request
// is in flight waits for its answer: on Kafka 4.4.0 a 1,000-partition
// backlog arrived in answers of 15-20 MB that took 33-66 ms, and the
// partitions had handled the last one before each came (the consumer idle
// 40% of the time). With two, one lane's request is in flight while
// another's answer is handled. A partition sits in lane 0 unless it is
// behind (laneFor): at a steady low rate each lane's long poll would
// return with its own few records, twice the fetches for the same
// messages (Kafka 4.4.0 at 2,446 msgs/s: 14-16% of a CPU against 16-18%).
// A partition is behind until its first answer: a wide backlog whose
// partitions each come whole in one answer was otherwise fetched by lane 0
// alone, the broker idle while each answer was read (kfake, 10,000
// partitions: 1.14 s against 0.95 s with both lanes).
const fetchLanes = 2

// laneOf is which of n lanes fetches tp while it is behind: spread over
// the lanes for partitions of one topic and of many.
func laneOf(tp topicPartition, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261) // FNV-1a of the topic, then the partition
	for i := 0; i < len(tp.topic); i++ {
		h = (h ^ uint32(tp.topic[i])) * 16777619
	}
	return int((h + uint32(tp.partition)) % uint32(n))
}

// laneFor is broker id's loop that fetches a cursor of tp, behind or not;
// nil if id has none. f.mu is held.
func (f *fetcher) laneFor(id int32, tp topicPartition, behind bool) *brokerLoop {
	lanes := f.brokers[id]
	if len(lanes) == 0 {
		return nil
	}
	if !behind {
		return lanes[0]
	}
	return lanes[laneOf(tp, len(lanes))]
}

// setLeader makes id fs's leader and moves it to the set that should hold
// it (place). f.mu is held.
func (f *fetcher) setLeader(fs *fetchState, id int32) {
	fs.leader = id
	f.place(fs)
}

// place moves fs to the set that should hold it: its leader's lane for it
// (laneFor), or leaderless (no leader, or a broker without a loop yet: run
// looks the leaders up again and starts it). A cursor in a request in
// flight stays in its loop, marked resettle: its position belongs to that
// request until the answer, after which the loop calls settle. f.mu is
// held.
func (f *fetcher) place(fs *fetchState) {
	if fs.gone.Load() {
		return
	}
	if from := fs.loop.Load(); from != nil {
		from.mu.Lock()
		if fs.inflight {
			fs.resettle = true
			from.mu.Unlock()
			return
		}
		if f.laneFor(fs.leader, fs.p.tp, fs.behind) == from {
			from.mu.Unlock()
			return
		}
		f.unlead(fs, from)
		from.mu.Unlock()
	}
	// In no set now: fs's fields are under f.mu. What its old broker
	// refused is no concern of the new one.
	fs.lost = false
	to := f.laneFor(fs.leader, fs.p.tp, fs.behind)
	if to == nil {
		fs.leader = -1
		f.leaderless[fs] = struct{}{}
		return
	}
	delete(f.leaderless, fs)
	to.mu.Lock()
	f.insert(fs, to)
	to.mu.Unlock()
}

// insert puts fs, in no set, into loop b's cursors. b.mu is held.
func (f *fetcher) insert(fs *fetchState, b *brokerLoop) {
	fs.loop.Store(b)
	fs.slot = len(b.cursors)
	b.cursors = append(b.cursors, fs)
	b.index[fs.p.tp] = fs
	if len(b.cursors) == 1 {
		f.leading.Add(1)
	}
}

// unlead takes fs out of loop b's cursors, which hold it; its session
// forgets it. b.mu is held.
func (f *fetcher) unlead(fs *fetchState, b *brokerLoop) {
	fs.loop.Store(nil)
	b.session.left(fs)
	delete(b.index, fs.p.tp)
	last := len(b.cursors) - 1
	b.cursors[fs.slot] = b.cursors[last]
	b.cursors[fs.slot].slot = fs.slot
	b.cursors[last] = nil
	b.cursors = b.cursors[:last]
	if last == 0 {
		f.leading.Add(-1)
	}
	fs.slot = -1
}

// settle makes the moves b's last answer left (b.moves): a cursor whose
// lane changed, whose leader the broker refused or changed while in flight,
// or whose position is out of range. b's goroutine calls it without b.mu.
func (f *fetcher) settle(b *brokerLoop) {
	if len(b.moves) == 0 {
		return
	}
	kick := false
	f.mu.Lock()
	for _, fs := range b.moves {
		if fs.gone.Load() {
			continue
		}
		// Run may have moved it since the answer (it was not in flight
		// then): its new loop has it, and may hold it in flight already.
		cur := f.lockCursor(fs)
		oor, lost := fs.outOfRange, false
		if cur == b {
			lost = fs.lost
			fs.lost, fs.resettle = false, false
		}
		if cur != nil {
			cur.mu.Unlock()
		}
		if _, ok := f.outOfRange[fs]; oor && !ok {
			f.outOfRange[fs] = struct{}{}
			kick = true
		}
		if cur != b {
			continue
		}
		if lost {
			fs.leader = -1
			kick = true
		}
		f.place(fs)
		if nb := fs.loop.Load(); nb != nil && nb != b {
			nb.signal()
		}
	}
	f.mu.Unlock()
	clear(b.moves)
	b.moves = b.moves[:0]
	if kick {
		f.signal()
	}
}

// reserve makes room for n more partitions (see reserved).
func (f *fetcher) reserve(n int) {
	f.mu.Lock()
	f.parts = reserved(f.parts, n)
	f.mu.Unlock()
}

// add starts fetching p at offset next.
func (f *fetcher) add(p *partition, next int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := &fetchState{p: p, next: next, leader: -1, slot: -1, at: -1, refused: -1, behind: true, bo: newBackoff(50*time.Millisecond, 5*time.Second)}
	if old := f.parts[p.tp]; old != nil {
		f.drop(old)
	}
	id, addr, ok := f.leaders.leader(p.tp)
	if !ok {
		id = -1
	} else {
		f.loopLocked(id, addr)
	}
	f.setLeader(fs, id)
	f.parts[p.tp] = fs
	p.fetch = fs
	now := time.Now().UnixNano()
	if now-f.lastAdd.Load() > int64(addQuiet) {
		f.addBurst.Store(now)
	}
	f.lastAdd.Store(now)
	f.shareBytes.Store(f.share())
	if b := fs.loop.Load(); b == nil {
		f.signal()
	} else if burst := f.addBurst.Load(); b.burst != burst {
		b.burst = burst
		b.signal()
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
	f.drop(fs)
	f.shareBytes.Store(f.share())
	if n := fs.decoded.Swap(0); n != 0 {
		f.decoded.Add(-n)
		f.wakeInflating()
	}
	f.buffered.Add(-fs.buffered.Swap(0))
	p.st.buffered.Store(0)
	f.wakeStarved()
}

// drop takes fs out of every set for good. f.mu is held.
func (f *fetcher) drop(fs *fetchState) {
	b := f.lockCursor(fs)
	if b != nil {
		f.unlead(fs, b)
	}
	// Under b.mu: b's answer in flight for fs either queued and charged
	// its part before (remove gives it back) or sees it gone.
	fs.gone.Store(true)
	if b != nil {
		b.mu.Unlock()
	}
	delete(f.leaderless, fs)
	delete(f.outOfRange, fs)
}

// release gives back n bytes of the budget: a batch was handled. Only the
// partition's goroutine calls it, between add and remove, and it takes no
// lock: a wide topic's partitions release a batch each at once.
func (f *fetcher) release(p *partition, n int64) {
	fs := p.fetch
	if n == 0 || fs == nil {
		return
	}
	left := fs.buffered.Add(-n)
	f.buffered.Add(-n)
	p.st.buffered.Add(-n)
	if left < f.shareBytes.Load() {
		if b := fs.loop.Load(); b != nil {
			b.signal()
		}
	}
	f.wakeStarved()
}

// hold counts n more bytes that p's goroutine holds in the budget:
// messages copied out of their response to wait for their key. release
// gives them back.
func (f *fetcher) hold(p *partition, n int64) {
	if fs := p.fetch; fs != nil && n != 0 {
		f.charge(fs, n)
	}
}

// room says whether the budget has at least minAsk left for a request. A
// request for the last few KiB would hold the broker loop's one request
// slot for a round trip while the partitions free far more (Kafka 4.4.0,
// 10,000 partitions: answers of 6 KiB taking 0.5 s).
func (f *fetcher) room() bool {
	return f.avail() >= minAsk(int64(f.cfg.MaxBufferedBytes))
}

// avail is what a request may reserve: the budget less what is buffered,
// reserved by requests in flight, and kept for decoding: what partitions
// wait to decompress (wanted) comes before fetching more, since only
// decoding frees what is fetched.
func (f *fetcher) avail() int64 {
	return int64(f.cfg.MaxBufferedBytes) - f.buffered.Load() - f.reserved.Load() - max(f.headroom(), f.wanted.Load())
}

// headroom is the part of the budget fetching leaves to decompressed
// batches, once a topic has shown compressed ones: an eighth of it (at most
// 1 MiB, as minAsk), less what they hold. Without it a backlog would keep
// the budget full of fetched bytes and every partition would wait for the
// one allowed to decompress beyond the budget (inflate).
func (f *fetcher) headroom() int64 {
	if !f.compressed.Load() {
		return 0
	}
	return max(minAsk(int64(f.cfg.MaxBufferedBytes))-f.decoded.Load(), 0)
}

// inflate takes est bytes of the budget for a batch p's goroutine is about
// to decompress, waiting while they do not fit: decompressed records count
// in MaxBufferedBytes as fetched ones do, so a topic of highly compressible
// batches is held to the budget, not to the budget times its compression
// ratio. A batch within the partition's share of the budget always goes,
// so that fetched and decompressed bytes together stay within twice the
// budget at worst; a batch that fits nowhere still goes when no partition
// holds a decompressed batch, so one always makes progress (decompress
// bounds it to the budget). false when ctx ended first.
func (f *fetcher) inflate(ctx context.Context, p *partition, est int64) bool {
	fs := p.fetch
	if fs == nil {
		return true
	}
	f.compressed.Store(true)
	budget := int64(f.cfg.MaxBufferedBytes)
	for waiting := false; ; waiting = true {
		f.freedMu.Lock()
		// Until a batch showed the ratio, est is a guess: one at a time.
		// Then a batch goes while it fits, and one of up to the
		// partition's share always does: partitions holding batches in
		// slow handlers take the budget, not the others' turn.
		d := f.decoded.Load()
		if d == 0 || f.ratio.Load() > 0 && (f.buffered.Load()+f.reserved.Load()+est <= budget ||
			fs.decoded.Load() == 0 && est <= f.shareBytes.Load()) {
			f.holdDecoded(fs, est) // under freedMu: two partitions never both take the last room
			f.freedMu.Unlock()
			if waiting {
				f.wanted.Add(-est)
			}
			return true
		}
		if f.freed == nil {
			f.freed = make(chan struct{})
		}
		freed := f.freed
		f.freedMu.Unlock()
		if !waiting {
			f.wanted.Add(est) // requests leave it room from now on
		}
		select {
		case <-freed:
		case <-ctx.Done():
			f.wanted.Add(-est)
			return false
		}
	}
}

// holdDecoded counts n more decompressed bytes held by fs's partition
// (n < 0 gives them back, and wakes the partitions waiting in inflate).
func (f *fetcher) holdDecoded(fs *fetchState, n int64) {
	if n == 0 || fs == nil {
		return
	}
	fs.decoded.Add(n)
	f.decoded.Add(n)
	f.charge(fs, n)
	if n < 0 {
		f.wakeInflating()
		f.wakeStarved()
	}
}

// unreserve gives back a request's reserve, and wakes the partitions
// waiting for room to decompress.
func (f *fetcher) unreserve(r *request) {
	f.reserved.Add(-r.reserve)
	if f.wanted.Load() > 0 {
		f.wakeInflating()
	}
}

// wakeInflating wakes the partitions waiting in inflate.
func (f *fetcher) wakeInflating() {
	f.freedMu.Lock()
	if f.freed != nil {
		close(f.freed)
		f.freed = nil
	}
	f.freedMu.Unlock()
}

// inflation is the ratio of decompressed to compressed bytes, in 16ths,
// that a partition expects of its next batch: its last one's, or the
// consumer's last one's (16, 1:1, before any).
func (f *fetcher) inflation() int64 {
	if r := f.ratio.Load(); r > 0 {
		return r
	}
	return 16
}

// minAsk is the least a request asks for: an eighth of the budget, at most
// 1 MiB, at least a byte (a whole budget, with nothing buffered or in
// flight, is always as much).
func minAsk(budget int64) int64 { return max(min(budget/8, 1<<20), 1) }

// wakeAll wakes every broker loop, for a partition resumed after a pause.
func (f *fetcher) wakeAll() {
	for _, b := range f.allLoops() {
		b.signal()
	}
}

// allLoops is every broker loop, every lane of every broker.
func (f *fetcher) allLoops() []*brokerLoop {
	if loops := f.loops.Load(); loops != nil {
		return *loops
	}
	return nil
}

// wakeStarved wakes the broker loops that found no budget left, once there
// is some. build sets starved before it looks at the budget a last time,
// and the callers give bytes back before this reads it: one of the two
// sees the other.
func (f *fetcher) wakeStarved() {
	if f.starved.Load() && f.room() && f.starved.CompareAndSwap(true, false) {
		for _, b := range f.allLoops() {
			if b.starved.CompareAndSwap(true, false) {
				b.signal()
			}
		}
	}
}

// share is each partition's part of the budget: a partition is fetched while
// it holds less than this.
func (f *fetcher) share() int64 {
	n := max(len(f.parts), 1)
	return min(max(int64(f.cfg.MaxBufferedBytes)/int64(n), 4<<10), int64(f.cfg.FetchMaxBytes))
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

// request is one Fetch request in flight and what it holds: every
// partition it fetches, listed in it or held by the fetch session.
type request struct {
	req     *kmsg.FetchRequest
	states  []*fetchState // in the request's order; fetchState.at indexes it
	offsets []int64       // each state's position when the request was built
	reserve int64
	full    bool // the request lists every partition: so does its answer
	// sessionless: the request is outside the loop's fetch session
	// (backlogFill), which it leaves as it was.
	sessionless bool
}

// find returns the index in r.states of topic/partition (-1: not fetched
// by r), next being where a full answer's order says it should be. b.mu is
// held.
func (b *brokerLoop) find(r *request, next *int, topic string, partition int32) int {
	if j := *next; j < len(r.states) {
		if tp := r.states[j].p.tp; tp.partition == partition && tp.topic == topic {
			*next = j + 1
			return j
		}
	}
	fs := b.index[topicPartition{topic, partition}]
	if fs == nil || fs.at < 0 || fs.at >= len(r.states) || r.states[fs.at] != fs {
		return -1
	}
	*next = fs.at + 1
	return fs.at
}

// build makes the next request for broker b. It returns nil and how long
// to wait (0: until woken) when nothing should be fetched now. waited says
// the loop already waited once for partitions whose buffers are full.
func (f *fetcher) build(b *brokerLoop, waited bool) (*request, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cfg := f.cfg
	share := f.shareBytes.Load()
	now := time.Now()
	n := len(b.cursors)
	if n == 0 {
		return nil, 0
	}
	if quiet := time.Duration(now.UnixNano() - f.lastAdd.Load()); quiet < addQuiet && time.Duration(now.UnixNano()-f.addBurst.Load()) < f.coalesce {
		return nil, addQuiet - quiet // more partitions are being added
	}
	var ready []*fetchState
	var wait time.Duration
	full, allIdle := false, true
	behind := false // a partition left out for its full buffer has more to fetch
	anyPaused := f.paused.Load() > 0
	start := b.start % n
	for i := range n {
		fs := b.cursors[(start+i)%n]
		if fs.outOfRange || fs.stalled || (anyPaused && fs.p.st.gate.paused.Load()) {
			b.session.skip(fs)
			continue
		}
		if d := fs.retryAt.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			b.session.skip(fs)
			continue
		}
		if fs.buffered.Load() >= share {
			full = true
			behind = behind || fs.next < fs.p.st.hwm.Load()
			b.session.skip(fs)
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
	if !f.room() {
		b.starved.Store(true)
		f.starved.Store(true)
		// A release between the two reads saw starved unset: look again.
		// The fetcher's flag stays, for other loops that may have set it.
		if !f.room() {
			return nil, wait
		}
		b.starved.Store(false)
	}
	avail := f.avail()
	// At most half the budget per request: the next request is in flight
	// while the partitions handle the last answer, rather than waiting for
	// them to free the whole budget.
	reserve := min(avail/int64(max(f.leading.Load(), 1)), int64(cfg.MaxBufferedBytes)/2)
	if reserve < share {
		reserve = min(avail, share)
	}
	f.reserved.Add(reserve)
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
	// A backlog wider than the reserve can fill is fetched in requests
	// outside the fetch session (backlogFill).
	sessionless := false
	if n := backlogFill(ready, reserve, partMax); n < len(ready) {
		ready, sessionless = ready[:n], true
	}

	// ready is in the rotation's order (deliver moves its start): the
	// broker fills the response in request order.
	r := &request{states: make([]*fetchState, 0, len(ready)), offsets: make([]int64, len(ready)), reserve: reserve,
		full: sessionless || b.session.full(), sessionless: sessionless}
	maxWait := cfg.FetchMaxWait
	if behind || sessionless {
		// The broker would hold a long poll on these partitions until one
		// has data or FetchMaxWait passed, and the partition left out for
		// its full buffer, with more to fetch, would wait that long for
		// its next fetch once it made room. A backlog request leaves out
		// partitions that may have data: it does not wait either.
		maxWait = 0
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(maxWait / time.Millisecond)
	req.MinBytes = 1
	req.MaxBytes = maxBytes
	req.IsolationLevel = int8(cfg.IsolationLevel)
	// The partitions grouped by topic, in the order of each topic's first
	// partition; r.states follows the request's order.
	grouped := ready
	if multi := topicsOf(ready); multi {
		grouped = make([]*fetchState, 0, len(ready))
		done := map[string]bool{}
		for i, fs := range ready {
			t := fs.p.tp.topic
			if done[t] {
				continue
			}
			done[t] = true
			for _, o := range ready[i:] {
				if o.p.tp.topic == t {
					grouped = append(grouped, o)
				}
			}
		}
	}
	for _, fs := range grouped {
		fs.inflight = true
		fs.at = len(r.states)
		r.offsets[fs.at] = fs.next
		r.states = append(r.states, fs)
		pm := max(partMax, fs.need)
		if !sessionless && !b.session.list(fs, pm) {
			continue // the session holds it as it is
		}
		if ti := len(req.Topics) - 1; ti < 0 || req.Topics[ti].Topic != fs.p.tp.topic {
			t := kmsg.NewFetchRequestTopic()
			t.Topic = fs.p.tp.topic
			req.Topics = append(req.Topics, t)
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = fs.p.tp.partition
		rp.CurrentLeaderEpoch = -1
		rp.FetchOffset = fs.next
		rp.LogStartOffset = -1
		rp.PartitionMaxBytes = pm
		ti := len(req.Topics) - 1
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, rp)
	}
	if sessionless {
		req.SessionID, req.SessionEpoch = 0, -1
	} else {
		b.session.stamp(req)
	}
	r.req = req
	return r, 0
}

// backlogFill is how many of ready, in order, a request of reserve bytes
// lists when they have a backlog wider than it can fill: those expected to
// fill it twice over; len(ready) otherwise. A broker reads every partition
// of a request's fetch session for each request, those past its MaxBytes
// too, so a backlog fetched through a session of thousands of partitions
// costs it (requests) x (partitions): Kafka 4.4.0, 5,000 partitions, a
// request every 4-16 MB, its CPU was twice franz-go's (which asks for 50
// MB at a time). Listing only what fills the request, outside the session
// (which keeps what it holds for the long polls once the backlog is
// fetched), costs it what the answer holds.
func backlogFill(ready []*fetchState, reserve int64, partMax int32) int {
	var want, behind int64
	for i, fs := range ready {
		if fs.behind {
			behind++
		}
		if want += fs.expect(partMax); want >= 2*reserve {
			if behind == 0 {
				return len(ready) // nothing waits to be fetched: a long poll
			}
			return i + 1
		}
	}
	return len(ready)
}

// expect is what fs is likely to return when asked for up to partMax (or
// the batch it needs whole): the records between its position and the
// log's end as last seen (an answer, or the assignment's ListOffsets), at
// the size per offset of its last chunk; partMax before it had one; at
// least minExpect, as a partition listed costs the broker a read whatever
// it returns. The broker loop's mu is held.
func (fs *fetchState) expect(partMax int32) int64 {
	pm := int64(max(partMax, fs.need))
	hwm := fs.p.st.hwm.Load()
	switch lag := hwm - fs.next; {
	case hwm >= 0 && lag <= 0:
		return minExpect
	case fs.perOffset <= 0 || hwm < 0:
		return pm
	default:
		return min(max(lag*int64(fs.perOffset), minExpect), pm)
	}
}

// minExpect is the least expect counts for a partition.
const minExpect = 1 << 10

// topicsOf says whether states hold partitions of more than one topic.
func topicsOf(states []*fetchState) bool {
	for _, fs := range states[1:] {
		if fs.p.tp.topic != states[0].p.tp.topic {
			return true
		}
	}
	return false
}

// runBroker is fetch loop b: build a request for the partitions of b's
// lane that may be fetched, send it on b's connection, hand the answer to
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
			b.mu.Lock()
			addr := b.addr
			b.mu.Unlock()
			var err error
			if conn, err = f.cl.dial(f.ctx, addr); err != nil {
				f.failed(b, r, err, &bo)
				continue
			}
		}
		f.requests.Add(1)
		rctx, abandon := context.WithCancel(f.ctx)
		b.mu.Lock()
		b.inflight, b.sent, b.abandon = r, time.Now(), abandon
		b.mu.Unlock()
		msg, err := conn.Do(rctx, r.req, f.cfg.FetchMaxWait+f.cfg.Timeout)
		b.mu.Lock()
		b.inflight, b.abandon = nil, nil
		b.mu.Unlock()
		abandon()
		var res *kmsg.FetchResponse
		if err == nil {
			res = msg.(*kmsg.FetchResponse)
			if endsSession(res.ErrorCode) && !r.sessionless {
				f.sessionRefused(b, r, res.ErrorCode)
				continue
			}
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
			b.mu.Lock()
			b.failing = false
			b.mu.Unlock()
		}
		f.deliver(b, r, res)
	}
}

// failed handles a request that got no answer: its partitions are looked up
// again (their leader may have moved) and the loop backs off.
func (f *fetcher) failed(b *brokerLoop, r *request, err error, bo *backoff) {
	b.mu.Lock()
	f.unreserve(r)
	// Whether the broker saw the request is unknown: the next one starts
	// a session afresh, closing this one.
	b.session.reset(true)
	stopping := f.ctx.Err() != nil // a stop is not an error of the partitions
	for _, fs := range r.states {
		fs.inflight, fs.lost = false, true
		if !stopping {
			fs.p.st.setError(fmt.Errorf("fetch %s/%d at offset %d from broker %d: %w", fs.p.tp.topic, fs.p.tp.partition, fs.next, b.id, err))
		}
		b.moves = append(b.moves, fs)
	}
	b.failing = true
	addr := b.addr
	b.mu.Unlock()
	f.settle(b)
	f.wakeStarved()
	f.cl.client.Suspect(addr, suspectFor)
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

// sessionRefused handles a broker's refusal of the loop's fetch session:
// it evicted it (its cache is full of others) or the epochs went out of
// step. Nothing was fetched; the next request, at once, is full and opens
// a new session.
func (f *fetcher) sessionRefused(b *brokerLoop, r *request, code int16) {
	b.mu.Lock()
	f.unreserve(r)
	b.landed(r)
	b.session.reset(kafka.Error(code) != kafka.FetchSessionIDNotFound)
	b.mu.Unlock()
	f.settle(b)
	f.sessionResets.Add(1)
	f.log.Debug("fetch session refused; starting a new one", zap.Int32("broker", b.id), zap.Error(kafka.Error(code)))
	f.wakeStarved()
}

// landed ends r's hold on its cursors: a move that waited for its answer
// (resettle) is settle's to make. b.mu is held.
func (b *brokerLoop) landed(r *request) {
	for _, fs := range r.states {
		fs.inflight = false
		if fs.resettle {
			b.moves = append(b.moves, fs)
		}
	}
}

// deliver queues each partition's record batches from a response. Only
// the batch headers are read here, for the next position: the partition's
// goroutine decodes the records (records.go), so decoding runs on as many
// cores as there are busy partitions and the next fetch leaves at once.
func (f *fetcher) deliver(b *brokerLoop, r *request, res *kmsg.FetchResponse) {
	// Every partition's batches are scanned first, at once and outside the
	// lock: deliverPartition takes its end from b.ends.
	b.ends = scanAnswer(res, b.ends)
	b.mu.Lock()
	if !r.sessionless {
		b.session.answered(res.SessionID)
	}
	b.landed(r)
	for _, fs := range r.states {
		// An incremental answer leaves out the partitions with no news,
		// and those it had no room for: one behind its log's end at its
		// last answer has more, so it is not idle.
		fs.idle = !r.full && !fs.behind
	}
	next, last := 0, -1 // last: the last partition in the request's order that got data
	k := 0              // the partition's place in the answer, and in b.ends
	for ti := range res.Topics {
		for pi := range res.Topics[ti].Partitions {
			j := b.find(r, &next, res.Topics[ti].Topic, res.Topics[ti].Partitions[pi].Partition)
			if j >= 0 && f.deliverPartition(b, r, j, &res.Topics[ti].Partitions[pi], b.ends[k]) {
				last = max(last, j)
			}
			k++
		}
	}
	// The next request starts after the last partition served: those the
	// broker had no room for come first.
	if last >= 0 {
		if fs := r.states[last]; fs.loop.Load() == b && fs.slot >= 0 {
			b.start = fs.slot + 1
		}
	}
	b.mu.Unlock()
	// What is left of the reserve goes once the answer's bytes are
	// charged: partitions decompressing meanwhile (inflate) must not take
	// the room they need.
	f.unreserve(r)
	f.settle(b)
	f.wakeStarved()
}

// scanLanes is how many partitions' batches scanAnswer walks at once.
const scanLanes = 8

// scanMalformed is scanAnswer's end for a partition whose batches are
// malformed: scanBatches says where and why.
const scanMalformed = -2

// scanAnswer sets ends[k] (reused, returned) to the offset after the last
// complete record batch of the answer's k-th partition, in the answer's
// order: scanBatches(batches, -1), reading only the batches' headers, or
// scanMalformed. Each header is a likely cache miss in a fresh answer, and
// within a partition each read waits for the last (the length says where
// the next header is), while other partitions' do not. So it walks
// scanLanes partitions in lockstep, and their misses overlap: at 10,000
// partitions, one partition after the other took 40 ms of the broker loop
// per 1,000,000 messages, 3.5 times what this takes.
func scanAnswer(res *kmsg.FetchResponse, ends []int64) []int64 {
	n := 0
	for ti := range res.Topics {
		n += len(res.Topics[ti].Partitions)
	}
	ends = slices.Grow(ends[:0], n)[:n]
	type lane struct {
		k   int
		b   []byte
		end int64
	}
	var lanes [scanLanes]lane
	k, ti, pi := 0, 0, 0 // the next partition: its place in ends, its topic and its place there
	// more takes the next partition that may hold a batch into l; the
	// others (an idle partition's part is empty) end at -1.
	more := func(l *lane) bool {
		for ti < len(res.Topics) {
			ps := res.Topics[ti].Partitions
			if pi == len(ps) {
				ti, pi = ti+1, 0
				continue
			}
			b := ps[pi].RecordBatches
			pi, k = pi+1, k+1
			if len(b) > frameSize+batchMagic {
				*l = lane{k - 1, b, -1}
				return true
			}
			ends[k-1] = -1
		}
		return false
	}
	live := 0
	for live < scanLanes && more(&lanes[live]) {
		live++
	}
	for live > 0 {
		for i := 0; i < live; {
			l := &lanes[i]
			end, size, err := batchEnd(l.b)
			if err == nil && size > 0 {
				l.end = max(l.end, end)
				l.b = l.b[size:]
				i++
				continue
			}
			ends[l.k] = l.end
			if err != nil {
				ends[l.k] = scanMalformed
			}
			if more(l) {
				i++
				continue
			}
			live--
			lanes[i] = lanes[live] // the last lane's turn, in this round
		}
	}
	return ends
}

// deliverPartition queues one partition's part of a response, r.states[j]'s,
// whose batches end at scannedEnd (scanAnswer); it says whether the
// partition got data.
func (f *fetcher) deliverPartition(b *brokerLoop, r *request, j int, fr *kmsg.FetchResponseTopicPartition, scannedEnd int64) bool {
	fs := r.states[j]
	topic := fs.p.tp.topic
	if fs.gone.Load() {
		return false // revoked while in flight
	}
	if fr.ErrorCode != 0 {
		f.partitionError(b, fs, kafka.Error(fr.ErrorCode))
		return false
	}
	// The partition is served again: the next error (a leader move)
	// backs off from the start, not from where the last one left off.
	fs.bo.reset()
	st := fs.p.st
	if fr.HighWatermark >= 0 {
		st.hwm.Store(fr.HighWatermark)
	}
	from := r.offsets[j]
	end, err := max(scannedEnd, from), error(nil)
	if scannedEnd == scanMalformed {
		end, err = scanBatches(fr.RecordBatches, from) // again, for where and why
	}
	rc := f.cfg.IsolationLevel == kafka.ReadCommitted
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
		return false
	}
	if fs.behind != (end < min(fr.HighWatermark, lso)) {
		fs.behind = !fs.behind
		b.moves = append(b.moves, fs) // to its lane for it (laneFor)
	}
	if end == from {
		fs.idle = !fs.behind
		// A batch larger than the partition was asked for comes whole only
		// first in an answer: ask for all of it.
		fs.need = batchWanted(fr.RecordBatches)
		return false
	}
	fs.need, fs.idle = 0, false
	fs.perOffset = int32(min(int64(len(fr.RecordBatches))/(end-from), math.MaxInt32))
	ch := &chunk{from: from, raw: fr.RecordBatches, hwm: fr.HighWatermark, end: end, bytes: int64(len(fr.RecordBatches)),
		lso: lso}
	if rc {
		ch.aborted = abortedTxns(fr.AbortedTransactions)
	}
	fs.next = end
	f.charge(fs, ch.bytes)
	// The request's reserve becomes the bytes charged, so that another
	// loop building meanwhile sees the budget as it is, not these bytes
	// counted twice.
	if take := min(ch.bytes, r.reserve); take > 0 {
		r.reserve -= take
		f.reserved.Add(-take)
	}
	fs.p.q.push(ch)
	return true
}

// charge counts n more bytes buffered for fs (n < 0 returns them).
func (f *fetcher) charge(fs *fetchState, n int64) {
	fs.buffered.Add(n)
	f.buffered.Add(n)
	fs.p.st.buffered.Add(n)
}

// stall ends fetching p: its goroutine met records it cannot decode.
func (f *fetcher) stall(p *partition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fs := f.parts[p.tp]; fs != nil && fs.p == p {
		b := f.lockCursor(fs)
		fs.stalled = true
		if b != nil {
			b.mu.Unlock()
		}
	}
}

// lockCursor locks what guards fs's fields besides f.mu: the mu of the
// loop whose set holds it, which it returns (nil: in none). f.mu is held.
func (f *fetcher) lockCursor(fs *fetchState) *brokerLoop {
	b := fs.loop.Load()
	if b != nil {
		b.mu.Lock()
	}
	return b
}

// leaderRetryMax caps the wait after a broker said it does not lead a
// partition that the metadata still names it for.
const leaderRetryMax = 250 * time.Millisecond

// partitionError handles an error code a broker answered for one partition.
// b.mu is held; settle moves the partition after the answer.
func (f *fetcher) partitionError(b *brokerLoop, fs *fetchState, code kafka.Error) {
	tp := fs.p.tp
	err := fmt.Errorf("fetch %s/%d at offset %d from broker %d: %w", tp.topic, tp.partition, fs.next, b.id, code)
	fs.p.st.setError(err)
	switch code {
	case kafka.OffsetOutOfRange:
		fs.outOfRange = true // for run, which settle tells
		b.moves = append(b.moves, fs)
	case kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.UnknownTopicOrPartition,
		kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch, kafka.ReplicaNotAvailable,
		kafka.KafkaStorageError, kafka.OffsetNotAvailable, kafka.NotCoordinatorForGroup:
		f.log.Info("partition is not led by this broker now; looking up its leader", zap.String("topic", tp.topic),
			zap.Int32("partition", tp.partition), zap.Int32("broker", b.id), zap.Error(code))
		fs.lost, fs.refused = true, b.id
		b.moves = append(b.moves, fs)
		// A leader just elected may refuse until it has applied its
		// election: retried soon, not after a backoff grown to seconds.
		fs.retryAt = time.Now().Add(min(fs.bo.next(), leaderRetryMax))
	default:
		d := fs.bo.next()
		if logWorthy(fs.bo.n) {
			f.log.Warn("fetch failed for a partition; retrying it", zap.String("topic", tp.topic), zap.Int32("partition", tp.partition),
				zap.Int64("offset", fs.next), zap.Duration("backoff", d), zap.Error(err))
		}
		fs.retryAt = time.Now().Add(d)
	}
}
