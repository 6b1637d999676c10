package framework

import (
	"context"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fakeSession is a broker's side of one fetch session, as Kafka keeps it
// (FetchSession.scala): a full request (epoch 0) replaces the session, an
// incremental one must carry the session's id and epoch, adds or updates
// the partitions it lists and drops those it forgets; a sessionless one
// (epoch -1) fetches what it lists, closing the session it names (none:
// id 0, the session is left as it was).
type fakeSession struct {
	t       *testing.T
	nextID  int32
	id      int32
	epoch   int32
	held    map[topicPartition]int64 // partition: fetch offset
	decline bool                     // a full request opens no session (a full cache)
}

// apply takes req as the broker would and returns the error code of its
// answer, and the partitions the broker fetches, at their offsets.
func (s *fakeSession) apply(req *kmsg.FetchRequest) (int16, map[topicPartition]int64) {
	s.t.Helper()
	if req.SessionEpoch == -1 && req.SessionID == 0 {
		if len(req.ForgottenTopics) != 0 {
			s.t.Fatalf("a sessionless request forgets partitions")
		}
		fetched := map[topicPartition]int64{}
		for _, t := range req.Topics {
			for _, p := range t.Partitions {
				fetched[topicPartition{t.Topic, p.Partition}] = p.FetchOffset
			}
		}
		return 0, fetched
	}
	if req.SessionEpoch == 0 || req.SessionEpoch == -1 {
		s.held = map[topicPartition]int64{}
		s.id, s.epoch = 0, 0
		if req.SessionEpoch == 0 && !s.decline {
			s.nextID++
			s.id, s.epoch = s.nextID, 1
		}
	} else {
		if s.id == 0 || req.SessionID != s.id {
			return int16(kafka.FetchSessionIDNotFound), nil
		}
		if req.SessionEpoch != s.epoch {
			return int16(kafka.InvalidFetchSessionEpoch), nil
		}
		s.epoch++
	}
	listed := map[topicPartition]bool{}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			tp := topicPartition{t.Topic, p.Partition}
			if listed[tp] {
				s.t.Fatalf("%v listed twice in one request", tp)
			}
			listed[tp] = true
			s.held[tp] = p.FetchOffset
		}
	}
	for _, t := range req.ForgottenTopics {
		for _, p := range t.Partitions {
			tp := topicPartition{t.Topic, p}
			if listed[tp] {
				// Kafka and kfake apply the two lists in opposite orders.
				s.t.Fatalf("%v both listed and forgotten", tp)
			}
			delete(s.held, tp)
		}
	}
	if req.SessionEpoch == -1 {
		return 0, nil // closed: what it listed is fetched, the test sends none such
	}
	return 0, maps.Clone(s.held)
}

// The model test of the fetch session: random histories of partitions
// added, removed, moved between brokers, paused, filled and handled,
// answered with data or not (to the high watermark or short of it, so
// partitions move between a broker's lanes both ways), sessions evicted or
// declined and requests lost, on three brokers of fetchLanes loops each.
// A request stays in flight for some steps, while the others go on:
// partitions in it are moved, removed and added again, and other lanes
// fetch. When a request is sent, what its loop's session makes the broker
// fetch must be exactly what the request means to fetch, each partition at
// the position the request recorded: a partition the broker fetches but
// the loop does not expect would be fetched twice or at an old position,
// one it leaves out would starve. After every step each partition is in
// exactly one set, its lane the one laneFor names, or, while in flight,
// still in its request's loop and marked to move after the answer
// (checkSets), and each partition's chunks follow on from each other.
//
// Half the histories run on a budget small enough that a request's reserve
// fills with a few partitions: a backlog is then fetched in requests
// outside the session (backlogFill), which must leave the session as the
// loop's next incremental request expects it.
func TestFetchSessionModel(t *testing.T) {
	var sessionless int
	for seed := uint64(1); seed <= 200; seed++ {
		sessionless += sessionHistory(t, seed, 400)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
	if sessionless == 0 {
		t.Fatalf("no history sent a request outside the session")
	}
	t.Logf("%d requests outside the session", sessionless)
}

// sent is a request in flight to a fake broker: lost, or the error code
// the broker answers it with.
type sent struct {
	r       *request
	lost    bool
	code    int16
	session int32 // the session the answer names
}

// sessionHistory runs one history and returns how many requests it sent
// outside the session.
func sessionHistory(t *testing.T, seed uint64, steps int) (sessionless int) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	const brokers, parts = 3, 12
	budget := 1 << 20
	if seed%2 == 0 {
		budget = 96 << 10 // a reserve of at most 48 KiB: under a partition's 64 KiB
	}
	f := newTestFetcher(Config{MaxBufferedBytes: budget, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	f.ctx = stopped // failed returns without its backoff sleep
	// Each lane has a connection, and so a session, of its own.
	side := map[*brokerLoop]*fakeSession{}
	for id := range int32(brokers) {
		for _, b := range testLanes(f, id) {
			side[b] = &fakeSession{t: t, held: map[topicPartition]int64{}}
		}
	}
	owned := map[int32]*partition{}
	hwm := map[int32]int64{}
	flight := map[*brokerLoop]*sent{}
	next := map[*partition]int64{} // where each partition's next chunk starts
	for step := range steps {
		p := int32(rng.IntN(parts))
		tp := topicPartition{"t", p}
		if p%5 == 4 {
			tp.topic = "u" // a second topic
		}
		switch op := rng.IntN(12); {
		case op == 0 && owned[p] == nil:
			f.leaders.put(tp, int32(rng.IntN(brokers)))
			owned[p] = &partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}
			f.add(owned[p], hwm[p]/2)
			next[owned[p]] = hwm[p] / 2
		case op == 1 && owned[p] != nil:
			f.remove(owned[p])
			delete(owned, p)
		case op == 2 && owned[p] != nil:
			f.mu.Lock()
			f.leaders.put(tp, int32(rng.IntN(brokers)))
			f.setLeader(f.parts[tp], f.leaders.leaders[tp])
			f.mu.Unlock()
		case op == 3 && owned[p] != nil:
			owned[p].st.gate.paused.Store(!owned[p].st.gate.paused.Load()) // Pause, Resume
		case op == 4 && owned[p] != nil:
			f.release(owned[p], f.parts[tp].buffered.Load()) // handled
		case op == 5:
			hwm[p] += int64(1 + rng.IntN(3)) // produced
		case op == 6:
			lanes := f.brokers[int32(rng.IntN(brokers))]
			side[lanes[rng.IntN(len(lanes))]].decline = rng.IntN(2) == 0
		default:
			lanes := f.brokers[int32(rng.IntN(brokers))]
			b := lanes[rng.IntN(len(lanes))]
			if flight[b] == nil {
				flight[b] = sessionSend(t, rng, f, b, side[b])
				if flight[b] != nil && flight[b].r.sessionless {
					sessionless++
				}
			} else {
				sessionAnswer(t, rng, f, b, flight[b], hwm)
				delete(flight, b)
			}
			if t.Failed() {
				t.Logf("step %d", step)
				return sessionless
			}
		}
		// Partitions a failure left without a leader find it again.
		f.mu.Lock()
		for fs := range f.leaderless {
			f.setLeader(fs, f.leaders.leaders[fs.p.tp])
		}
		f.mu.Unlock()
		checkSets(t, f)
		// Each partition's chunks follow on from each other: none twice,
		// none from a position the partition has left.
		for _, op := range owned {
			for _, c := range op.q.take(nil) {
				if c.from != next[op] {
					t.Fatalf("%v: a chunk of [%d, %d) after one that ended at %d", op.tp, c.from, c.end, next[op])
				}
				next[op] = c.end
			}
		}
		if t.Failed() {
			t.Logf("step %d", step)
			return sessionless
		}
	}
	return sessionless
}

// sessionSend builds loop b's next request and sends it to the broker side
// s, which may lose it, evict the session first, or refuse it. nil: no
// request.
func sessionSend(t *testing.T, rng *rand.Rand, f *fetcher, b *brokerLoop, s *fakeSession) *sent {
	t.Helper()
	r, _ := f.build(b, true)
	if r == nil {
		return nil
	}
	if rng.IntN(10) == 0 {
		// Lost: the broker may or may not have seen it.
		if rng.IntN(2) == 0 {
			s.apply(r.req)
		}
		return &sent{r: r, lost: true}
	}
	if rng.IntN(15) == 0 {
		s.id = 0 // evicted by the broker
	}
	code, fetched := s.apply(r.req)
	if kafka.Error(code) == kafka.InvalidFetchSessionEpoch {
		// The broker moves the epoch on only for requests the loop sent
		// in it, and a request lost restarts the session.
		t.Fatalf("request (session %d epoch %d): the broker is at epoch %d", r.req.SessionID, r.req.SessionEpoch, s.epoch)
	}
	if code != 0 {
		return &sent{r: r, code: code}
	}
	want := map[topicPartition]int64{}
	for i, fs := range r.states {
		want[fs.p.tp] = r.offsets[i]
	}
	if len(want) != len(r.states) {
		t.Fatalf("a partition twice in one request")
	}
	for tp, off := range want {
		if got, ok := fetched[tp]; !ok || got != off {
			t.Fatalf("request (session %d epoch %d) means to fetch %v at %d; the broker fetches it: %v at %d", r.req.SessionID, r.req.SessionEpoch, tp, off, ok, got)
		}
	}
	for tp, off := range fetched {
		if _, ok := want[tp]; !ok {
			t.Fatalf("the broker fetches %v at %d, which the request (session %d epoch %d) does not expect", tp, off, r.req.SessionID, r.req.SessionEpoch)
		}
	}
	if r.sessionless {
		return &sent{r: r} // its answer names no session
	}
	return &sent{r: r, session: s.id}
}

// sessionAnswer answers loop b's request in flight: data for some
// partitions, a refusal of the session, or a failure.
func sessionAnswer(t *testing.T, rng *rand.Rand, f *fetcher, b *brokerLoop, in *sent, hwm map[int32]int64) {
	t.Helper()
	r := in.r
	switch {
	case in.lost:
		f.failed(b, r, context.DeadlineExceeded, &backoff{})
	case in.code != 0:
		f.sessionRefused(b, r, in.code)
	default:
		f.deliver(b, r, sessionData(rng, r, &kmsg.FetchResponse{SessionID: in.session}, hwm))
	}
	for _, fs := range r.states {
		if fs.inflight {
			t.Fatalf("%v still in flight after the answer", fs.p.tp)
		}
	}
}

// sessionData fills res with r's answer: data for some partitions, to the
// high watermark or short of it.
func sessionData(rng *rand.Rand, r *request, res *kmsg.FetchResponse, hwm map[int32]int64) *kmsg.FetchResponse {
	for i, fs := range r.states {
		p := fs.p.tp.partition
		data := r.offsets[i] < hwm[p] && rng.IntN(3) > 0
		if !data && !r.full && rng.IntN(2) == 0 {
			continue // an incremental answer leaves it out
		}
		rp := kmsg.FetchResponseTopicPartition{Partition: p, HighWatermark: hwm[p], LastStableOffset: -1}
		if data {
			n := int32(hwm[p] - r.offsets[i])
			if n > 1 && rng.IntN(3) == 0 {
				n = 1 + rng.Int32N(n-1) // the answer ends short of the high watermark: behind
			}
			rp.RecordBatches = frameBatch(r.offsets[i], 0, n, n-1, nil)
		}
		ti := len(res.Topics) - 1
		if ti < 0 || res.Topics[ti].Topic != fs.p.tp.topic {
			res.Topics = append(res.Topics, kmsg.FetchResponseTopic{Topic: fs.p.tp.topic})
			ti++
		}
		res.Topics[ti].Partitions = append(res.Topics[ti].Partitions, rp)
	}
	// An incremental answer lists partitions in the session's order, not
	// the request's.
	for i := range res.Topics {
		ps := res.Topics[i].Partitions
		rng.Shuffle(len(ps), func(a, b int) { ps[a], ps[b] = ps[b], ps[a] })
	}
	return res
}

// An idle wide topic costs requests of no partitions once the session is
// open: the first request lists every partition, the next none.
func TestFetchSessionIdleRequestIsEmpty(t *testing.T) {
	// The assignment's ListOffsets found empty logs.
	f, b := oneLoop(Config{MaxBufferedBytes: 32 << 20, FetchMaxBytes: 50 << 20, FetchMaxWait: 250 * time.Millisecond}, 1000, 0)
	r, _ := f.build(b, false)
	if r.req.SessionEpoch != 0 || listed(r) != 1000 {
		t.Fatalf("first request: epoch %d, %d partitions listed; want a full request opening a session", r.req.SessionEpoch, listed(r))
	}
	full := &kmsg.FetchResponse{SessionID: 42, Topics: []kmsg.FetchResponseTopic{{Topic: "t"}}}
	for _, fs := range r.states {
		full.Topics[0].Partitions = append(full.Topics[0].Partitions, kmsg.FetchResponseTopicPartition{Partition: fs.p.tp.partition, LastStableOffset: -1})
	}
	f.deliver(b, r, full)
	for epoch := int32(1); epoch <= 3; epoch++ {
		r, _ = f.build(b, false)
		if r.req.SessionID != 42 || r.req.SessionEpoch != epoch || listed(r) != 0 || len(r.req.ForgottenTopics) != 0 || len(r.states) != 1000 {
			t.Fatalf("idle request: session %d epoch %d, %d listed, %d topics forgotten, %d fetched; want session 42 epoch %d, none listed, 1000 fetched",
				r.req.SessionID, r.req.SessionEpoch, listed(r), len(r.req.ForgottenTopics), len(r.states), epoch)
		}
		f.deliver(b, r, &kmsg.FetchResponse{SessionID: 42})
	}
}

// A backlog wider than a request can fill is fetched in requests outside
// the session, each listing what fills it twice over, in the rotation, not
// waiting for a long poll; every partition gets its data once. What is
// left once it fits one request goes through the session, which then
// stays open for the long polls: an idle request lists nothing.
func TestFetchBacklogOutsideSession(t *testing.T) {
	const parts, hwm = 2000, 100
	f, b := oneLoop(Config{MaxBufferedBytes: 32 << 20, FetchMaxBytes: 50 << 20, FetchMaxWait: 250 * time.Millisecond}, parts, hwm)
	// A request of 16 MiB (half the budget), partitions of unknown size
	// counted at 64 KiB each: 512 fill it twice over.
	const perRequest = 2 * (16 << 20) / (64 << 10)
	data := map[int32]int{} // answers with data, per partition
	sessionless, requests := 0, 0
	for {
		requests++
		if requests > 10 {
			t.Fatalf("no idle request after %d requests (%d outside the session)", requests-1, sessionless)
		}
		r, _ := f.build(b, false)
		if r == nil {
			t.Fatalf("request %d: none", requests)
		}
		if r.sessionless {
			sessionless++
			if r.req.SessionID != 0 || r.req.SessionEpoch != -1 || r.req.MaxWaitMillis != 0 {
				t.Fatalf("backlog request %d: session %d epoch %d, waits %d ms; want one outside the session that does not wait",
					requests, r.req.SessionID, r.req.SessionEpoch, r.req.MaxWaitMillis)
			}
			if n := listed(r); n != len(r.states) || n > perRequest {
				t.Fatalf("backlog request %d lists %d partitions, fetches %d; want at most %d, each listed", requests, n, len(r.states), perRequest)
			}
		} else if r.req.SessionEpoch > 0 && listed(r) == 0 {
			break // idle, in the session
		}
		res := &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: "t"}}}
		if !r.sessionless {
			res.SessionID = 7
		}
		for i, fs := range r.states {
			rp := kmsg.FetchResponseTopicPartition{Partition: fs.p.tp.partition, HighWatermark: hwm, LastStableOffset: -1}
			if n := int32(hwm - r.offsets[i]); n > 0 {
				data[fs.p.tp.partition]++
				rp.RecordBatches = frameBatch(r.offsets[i], 0, n, n-1, make([]byte, 64))
			}
			res.Topics[0].Partitions = append(res.Topics[0].Partitions, rp)
		}
		f.deliver(b, r, res)
	}
	if sessionless < parts/perRequest {
		t.Fatalf("%d requests outside the session for %d partitions, %d per request", sessionless, parts, perRequest)
	}
	for p := range int32(parts) {
		if data[p] != 1 {
			t.Fatalf("partition %d got data in %d answers, want 1", p, data[p])
		}
	}
}

// oneLoop is a fetcher with one loop, broker 1's, fetching partitions 0 to
// parts-1 of topic "t" from offset 0; hwm is where the assignment found
// each log's end (-1: not known).
func oneLoop(cfg Config, parts int32, hwm int64) (*fetcher, *brokerLoop) {
	f := newTestFetcher(cfg)
	b := newBrokerLoop(1, "")
	f.addLoops(1, []*brokerLoop{b})
	for p := range parts {
		tp := topicPartition{"t", p}
		f.leaders.put(tp, 1)
		st := newPartitionStats(tp)
		st.hwm.Store(hwm)
		f.add(&partition{tp: tp, st: st, q: newInbox[*chunk]()}, 0)
	}
	return f, b
}

// listed is how many partitions r's request lists.
func listed(r *request) int {
	n := 0
	for _, t := range r.req.Topics {
		n += len(t.Partitions)
	}
	return n
}
