package framework

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/testsupport"
)

// A partition left out of a request because its buffer is full, with more
// to fetch, must not wait behind a long poll on the others: once it made
// room it is fetched again at once. So the request does not long-poll
// then; it does when the full partition has fetched everything there is.
func TestFetchNoLongPollWhileAPartitionWaitsForRoom(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hwm      int64 // the full partition's high watermark; it is at 100
		wantWait int32 // MaxWaitTime, ms
	}{
		{"full partition behind its log end", 500, 0},
		{"full partition at its log end", 100, 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
			b := newBrokerLoop(1, "")
			f.addLoops(1, []*brokerLoop{b})
			state := func(p int32, hwm int64) *fetchState {
				tp := topicPartition{"t", p}
				st := newPartitionStats(tp)
				st.hwm.Store(hwm)
				f.leaders.put(tp, 1)
				f.add(&partition{tp: tp, st: st}, 100)
				return f.parts[tp]
			}
			full := state(0, tc.hwm)
			state(1, 100) // at its log end, not yet seen idle
			full.buffered.Store(f.share())
			r, _ := f.build(b, false)
			if r == nil {
				t.Fatal("no request for the partition with room")
			}
			if len(r.states) != 1 || r.states[0] == full {
				t.Fatalf("request for %d partitions, the full one included: %v", len(r.states), r.states[0] == full)
			}
			if r.req.MaxWaitMillis != tc.wantWait {
				t.Fatalf("MaxWaitTime %d ms, want %d", r.req.MaxWaitMillis, tc.wantWait)
			}
		})
	}
}

// A partition the broker left out of an answer that was full (MaxBytes
// reached) still has a backlog: it is not idle, so a partition waiting for
// room does not make the loop hold it back for FetchMaxWait. A partition
// left out at its log end is idle.
func TestFetchLeftOutOfAFullAnswerIsNotIdle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hwm      int64 // the left-out partition's log end; it is at 100
		wantSent bool  // a request leaves at once for it
	}{
		{"left out with a backlog", 5000, true},
		{"left out at its log end", 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
			b := newBrokerLoop(1, "")
			f.addLoops(1, []*brokerLoop{b})
			add := func(p int32) *fetchState {
				tp := topicPartition{"t", p}
				f.leaders.put(tp, 1)
				f.add(&partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}, 100)
				return f.parts[tp]
			}
			served, left := add(0), add(1)
			r, _ := f.build(b, false)
			if r == nil || len(r.states) != 2 {
				t.Fatal("no request for both partitions")
			}
			res := kmsg.NewFetchResponse()
			topic := kmsg.NewFetchResponseTopic()
			topic.Topic = "t"
			for _, fs := range r.states {
				part := kmsg.NewFetchResponseTopicPartition()
				part.Partition = fs.p.tp.partition
				part.HighWatermark = tc.hwm
				if fs == served {
					part.HighWatermark = 5000
					part.RecordBatches = testBatch(100, -1, 0, [2][]byte{nil, []byte("v")})
				}
				topic.Partitions = append(topic.Partitions, part)
			}
			res.Topics = append(res.Topics, topic)
			f.deliver(b, r, &res)
			if left.idle == tc.wantSent {
				t.Fatalf("left-out partition idle %v, want %v", left.idle, !tc.wantSent)
			}
			// The served partition now holds its share: it waits for room.
			served.buffered.Store(f.share())
			r, wait := f.build(b, false)
			if sent := r != nil; sent != tc.wantSent {
				t.Fatalf("request sent %v (wait %s), want %v", sent, wait, tc.wantSent)
			}
			if r != nil && (len(r.states) != 1 || r.states[0] != left) {
				t.Fatalf("request for %d partitions, want the left-out one only", len(r.states))
			}
		})
	}
}

// An incremental answer leaves out the partitions it had no room for as
// well as those with no news: one behind its log's end at its last answer
// is not idle then, so a partition waiting for room does not hold the
// loop back for FetchMaxWait while another has data to fetch.
func TestFetchLeftOutOfAnIncrementalAnswer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hwm      int64 // the left-out partition's log end at its first answer; it is at 101 then
		wantSent bool
	}{
		{"behind its log's end", 5000, true},
		{"at its log's end", 101, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
			b := newBrokerLoop(1, "")
			f.addLoops(1, []*brokerLoop{b})
			for p := range int32(2) {
				tp := topicPartition{"t", p}
				f.leaders.put(tp, 1)
				f.add(&partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}, 100)
			}
			served, left := f.parts[topicPartition{"t", 0}], f.parts[topicPartition{"t", 1}]
			// The first answer opens the session and serves both.
			r, _ := f.build(b, false)
			res := answerOne(r, 5000)
			res.Topics[0].Partitions[1].HighWatermark = tc.hwm
			res.SessionID = 9
			f.deliver(b, r, res)
			served.buffered.Store(0)
			left.buffered.Store(0)
			// The incremental answer serves one and leaves the other out.
			r, _ = f.build(b, false)
			if r == nil || r.full {
				t.Fatal("no incremental request")
			}
			res = answerOne(r, 5000)
			res.SessionID = 9
			res.Topics[0].Partitions = res.Topics[0].Partitions[:1]
			if res.Topics[0].Partitions[0].Partition != served.p.tp.partition {
				res.Topics[0].Partitions[0] = answerOne(r, 5000).Topics[0].Partitions[1]
			}
			f.deliver(b, r, res)
			if left.idle == tc.wantSent {
				t.Fatalf("left-out partition idle %v, want %v", left.idle, !tc.wantSent)
			}
			served.buffered.Store(f.share())
			r, wait := f.build(b, false)
			if sent := r != nil; sent != tc.wantSent {
				t.Fatalf("request sent %v (wait %s), want %v", sent, wait, tc.wantSent)
			}
		})
	}
}

// A partition's retry backoff starts over once a fetch of it succeeds: a
// leader move late in a consumer's life waits as little as the first one.
// Without the reset every move after the seventh or so cost 2.5-5 s.
func TestFetchPartitionBackoffResetsAfterSuccess(t *testing.T) {
	f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	b := newBrokerLoop(1, "")
	f.addLoops(1, []*brokerLoop{b})
	tp := topicPartition{"t", 0}
	p := &partition{tp: tp, st: newPartitionStats(topicPartition{"t", int32(0)}), q: newInbox[*chunk]()}
	f.add(p, 0)
	fs := f.parts[tp]
	moved := kafka.NotLeaderForPartition
	retryIn := func() time.Duration { return time.Until(fs.retryAt) }
	// Many leader moves, each followed by a successful fetch from the new
	// leader.
	var first time.Duration
	for move := 1; move <= 20; move++ {
		f.setLeader(fs, 1)
		f.partitionError(b, fs, moved)
		f.settle(b)
		d := retryIn()
		if move == 1 {
			first = d
		}
		if d > 60*time.Millisecond {
			t.Fatalf("move %d: retry in %s (the first move's: %s): the backoff grew across moves", move, d, first)
		}
		f.setLeader(fs, 1)
		fs.retryAt, fs.inflight = time.Time{}, true
		r := &request{states: []*fetchState{fs}, offsets: []int64{fs.next}}
		ok := kmsg.NewFetchResponseTopic()
		ok.Topic = "t"
		ok.Partitions = []kmsg.FetchResponseTopicPartition{{Partition: 0}}
		f.deliver(b, r, &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{ok}})
	}
	// Errors in a row still back off more and more, up to leaderRetryMax:
	// a leader just elected refuses until it has applied its election.
	for range 5 {
		f.partitionError(b, fs, moved)
		f.settle(b)
	}
	if d := retryIn(); d < 200*time.Millisecond || d > leaderRetryMax {
		t.Fatalf("retry in %s after 5 errors in a row, want the backoff grown to 200ms-%s", d, leaderRetryMax)
	}
}

// checkSets fails t unless every owned partition is in exactly one set:
// its leader's lane for it (laneOf), at its slot, or leaderless; and
// leading counts the loops whose set is not empty.
func checkSets(t *testing.T, f *fetcher) {
	t.Helper()
	in := 0
	leading := 0
	for id, lanes := range f.brokers {
		for lane, b := range lanes {
			if len(b.cursors) > 0 {
				leading++
			}
			for i, fs := range b.cursors {
				in++
				want := 0 // lane 0 unless behind
				if fs.behind {
					want = laneOf(fs.p.tp, len(lanes))
				}
				if fs.inflight && fs.resettle && fs.slot == i && !fs.gone.Load() && f.parts[fs.p.tp] == fs && fs.loop.Load() == b {
					continue // moves after its request's answer (settle)
				}
				if fs.leader != id || fs.slot != i || fs.gone.Load() || f.parts[fs.p.tp] != fs || fs.loop.Load() != b || want != lane {
					t.Fatalf("broker %d lane %d slot %d holds %v (leader %d, slot %d, gone %v, behind %v, lane %d)", id, lane, i,
						fs.p.tp, fs.leader, fs.slot, fs.gone.Load(), fs.behind, want)
				}
			}
		}
	}
	for fs := range f.leaderless {
		in++
		if fs.leader != -1 || fs.slot != -1 || f.parts[fs.p.tp] != fs {
			t.Fatalf("leaderless holds %v (leader %d, slot %d)", fs.p.tp, fs.leader, fs.slot)
		}
	}
	if in != len(f.parts) {
		t.Fatalf("%d partitions in the sets, %d owned", in, len(f.parts))
	}
	if leading != int(f.leading.Load()) {
		t.Fatalf("leading %d, %d loops with partitions", f.leading.Load(), leading)
	}
	for fs := range f.outOfRange {
		if !fs.outOfRange || f.parts[fs.p.tp] != fs {
			t.Fatalf("outOfRange holds %v (flag %v)", fs.p.tp, fs.outOfRange)
		}
	}
}

// laneOf spreads a broker's partitions evenly over its lanes, those of one
// topic of many partitions and those of many topics of one partition each.
func TestFetchLanesShareTheirBroker(t *testing.T) {
	for _, tc := range []struct {
		name string
		tp   func(i int) topicPartition
	}{
		{"one topic", func(i int) topicPartition { return topicPartition{"orders", int32(i)} }},
		{"a topic per partition", func(i int) topicPartition { return topicPartition{fmt.Sprintf("orders-%d", i), 0} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const parts = 1000
			count := make([]int, fetchLanes)
			for i := range parts {
				lane := laneOf(tc.tp(i), fetchLanes)
				if lane != laneOf(tc.tp(i), fetchLanes) {
					t.Fatal("laneOf is not stable")
				}
				count[lane]++
			}
			for lane, n := range count {
				if n < parts/fetchLanes*8/10 {
					t.Fatalf("lane %d fetches %d of %d partitions (%v)", lane, n, parts, count)
				}
			}
		})
	}
}

// The tests outside the package bound what passes the budget by the fetch
// loops per broker.
func TestFetchLanesMatchTheTests(t *testing.T) {
	if fetchLanes != testsupport.FetchLanes {
		t.Fatalf("fetchLanes %d, testsupport.FetchLanes %d", fetchLanes, testsupport.FetchLanes)
	}
}

// testLanes gives broker id fetchLanes loops that do not run.
func testLanes(f *fetcher, id int32) []*brokerLoop {
	lanes := make([]*brokerLoop, fetchLanes)
	for i := range lanes {
		lanes[i] = newBrokerLoop(id, "")
	}
	f.addLoops(id, lanes)
	return lanes
}

// cursorsOf lists the cursors of broker id's lanes.
func cursorsOf(f *fetcher, id int32) []*fetchState {
	var out []*fetchState
	for _, b := range f.brokers[id] {
		out = append(out, b.cursors...)
	}
	return out
}

// Each broker loop's set holds the partitions it leads, in lane 0 unless
// behind, and a partition moves between sets as its leader changes, is
// refused, fails, or is removed; the partitions without a leader and those
// out of range are found without a scan of every partition.
func TestFetchCursorsMoveWithTheirLeader(t *testing.T) {
	f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	for id := range int32(3) {
		testLanes(f, id)
	}
	ps := map[int32]*partition{}
	for p := range int32(30) {
		tp := topicPartition{"t", p}
		if p < 27 {
			f.leaders.put(tp, p%3) // the last three: no leader known
		}
		ps[p] = &partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}
		f.add(ps[p], 0)
	}
	checkSets(t, f)
	if len(f.leaderless) != 3 || len(cursorsOf(f, 0)) != 9 || !f.needLeaders() {
		t.Fatalf("%d leaderless, %d at broker 0, needLeaders %v", len(f.leaderless), len(cursorsOf(f, 0)), f.needLeaders())
	}
	// Broker 0's partitions stay behind: they stay spread over its lanes.
	r, _ := f.build(f.brokers[0][0], false)
	f.deliver(f.brokers[0][0], r, answerOne(r, 1<<20))
	checkSets(t, f)
	for _, b := range f.brokers[0] {
		if len(b.cursors) == 0 {
			t.Fatal("a lane of broker 0 has none of its 9 partitions, all behind")
		}
	}
	for p := int32(27); p < 30; p++ {
		f.setLeader(f.parts[ps[p].tp], 2)
	}
	if f.needLeaders() {
		t.Fatal("needLeaders with every partition led")
	}
	// A leader unknown to the fetcher (no loop yet): leaderless.
	f.setLeader(f.parts[ps[0].tp], 7)
	checkSets(t, f)
	if _, ok := f.leaderless[f.parts[ps[0].tp]]; !ok {
		t.Fatal("a partition led by a broker without a loop is not leaderless")
	}
	// Every partition of broker 1 moves to broker 0.
	for _, fs := range cursorsOf(f, 1) {
		f.setLeader(fs, 0)
	}
	checkSets(t, f)
	// Broker 0's partitions are behind after their answer, broker 2's
	// before their first: both brokers' lanes lead.
	if f.leading.Load() != 2*fetchLanes {
		t.Fatalf("leading %d after broker 1 lost its partitions, want %d", f.leading.Load(), 2*fetchLanes)
	}
	// A refusal, an out-of-range position, a broker refusing all, a removal.
	b0 := f.brokers[0][0]
	f.partitionError(b0, b0.cursors[0], kafka.NotLeaderForPartition)
	f.settle(b0)
	oor := b0.cursors[0]
	f.partitionError(b0, oor, kafka.OffsetOutOfRange)
	f.settle(b0)
	checkSets(t, f)
	if b0.cursors[0] != oor || len(f.outOfRange) != 1 {
		t.Fatal("a partition out of range left its loop, or is not in outOfRange")
	}
	for _, b := range f.brokers[2] {
		r, _ := f.build(b, false)
		if r == nil {
			continue // a lane of no partitions
		}
		res := &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: "t"}}}
		for _, fs := range r.states {
			if fs == oor {
				t.Fatal("a partition out of range was fetched")
			}
			res.Topics[0].Partitions = append(res.Topics[0].Partitions,
				kmsg.FetchResponseTopicPartition{Partition: fs.p.tp.partition, ErrorCode: int16(kafka.NotLeaderForPartition)})
		}
		f.deliver(b, r, res)
		checkSets(t, f)
	}
	if n := len(cursorsOf(f, 2)); n != 0 || len(f.outOfRange) != 1 {
		t.Fatalf("%d at the refusing broker, %d out of range", n, len(f.outOfRange))
	}
	f.remove(oor.p)
	f.remove(ps[0])
	checkSets(t, f)
	if len(f.outOfRange) != 0 {
		t.Fatal("a removed partition is still out of range")
	}
}

// answerOne answers request r with one record for each partition, at a
// high watermark of hwm: below it, the partition is behind.
func answerOne(r *request, hwm int64) *kmsg.FetchResponse {
	res := &kmsg.FetchResponse{}
	for i, fs := range r.states {
		if len(res.Topics) == 0 || res.Topics[len(res.Topics)-1].Topic != fs.p.tp.topic {
			res.Topics = append(res.Topics, kmsg.FetchResponseTopic{Topic: fs.p.tp.topic})
		}
		t := &res.Topics[len(res.Topics)-1]
		t.Partitions = append(t.Partitions, kmsg.FetchResponseTopicPartition{Partition: fs.p.tp.partition,
			HighWatermark: hwm, LastStableOffset: -1, RecordBatches: frameBatch(r.offsets[i], 0, 1, 0, nil)})
	}
	return res
}

// A partition is fetched in lane 0 while it keeps up with its log, so a
// steady low rate costs one long poll per broker; until its first answer,
// and once an answer ends below its high watermark, it is in the lane
// laneOf names, so a backlog is fetched by both lanes, and back in lane 0
// when it catches up. Each move leaves the old lane's session, which
// forgets the partition.
func TestFetchLanesFollowTheBacklog(t *testing.T) {
	f := newTestFetcher(Config{MaxBufferedBytes: 1 << 30, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	lanes := testLanes(f, 1)
	const parts = 40
	for p := range int32(parts) {
		tp := topicPartition{"t", p}
		f.leaders.put(tp, 1)
		f.add(&partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}, 0)
	}
	checkSets(t, f)
	for i, b := range lanes {
		if len(b.cursors) == 0 {
			t.Fatalf("lane %d holds none of %d new partitions; want them spread", i, parts)
		}
	}
	// Answers that reach the high watermark bring every partition to
	// lane 0.
	for _, b := range lanes {
		r, _ := f.build(b, false)
		f.deliver(b, r, answerOne(r, 1))
		checkSets(t, f)
	}
	if len(lanes[0].cursors) != parts {
		t.Fatalf("caught up, lane 0 holds %d of %d partitions", len(lanes[0].cursors), parts)
	}
	for _, fs := range f.parts {
		f.release(fs.p, fs.buffered.Load())
	}
	// The next answer opens lane 0's session and ends below the high
	// watermark for every partition: they spread over the lanes.
	r, _ := f.build(lanes[0], false)
	res := answerOne(r, 100)
	res.SessionID = 9
	f.deliver(lanes[0], r, res)
	checkSets(t, f)
	moved := parts - len(lanes[0].cursors)
	if moved == 0 || len(lanes[0].cursors) == 0 {
		t.Fatalf("after a backlog answer lane 0 holds %d of %d partitions; want them spread", len(lanes[0].cursors), parts)
	}
	if len(lanes[0].session.forget) != moved {
		t.Fatalf("lane 0's session forgets %d partitions, %d left it", len(lanes[0].session.forget), moved)
	}
	for _, fs := range f.parts {
		f.release(fs.p, fs.buffered.Load())
	}
	// Each lane fetches its own; answers that reach the high watermark
	// bring every partition back to lane 0.
	for _, b := range lanes {
		r, _ := f.build(b, false)
		if r == nil || len(r.states) != len(b.cursors) {
			t.Fatalf("a lane of %d partitions built no request of them", len(b.cursors))
		}
		f.deliver(b, r, answerOne(r, 2))
		checkSets(t, f)
	}
	if len(lanes[0].cursors) != parts {
		t.Fatalf("caught up, lane 0 holds %d of %d partitions", len(lanes[0].cursors), parts)
	}
	if n := len(lanes[1].session.forget); n != moved {
		t.Fatalf("lane 1's session forgets %d partitions, %d left it", n, moved)
	}
}

// A request the broker fills only in part (its MaxBytes) is followed by
// one that starts with the partitions it had no room for: every partition
// is served in turn, whatever the count.
func TestFetchRotationServesEveryPartition(t *testing.T) {
	const parts, room = 98, 7 // the broker answers data for the first 7 partitions of a request
	f, b := oneLoop(Config{MaxBufferedBytes: 1 << 30, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond}, parts, -1)
	served := map[int32]int{}
	for range (parts + room - 1) / room {
		r, _ := f.build(b, false)
		if r == nil {
			t.Fatal("no request")
		}
		res := &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: "t"}}}
		for i, fs := range r.states {
			rp := kmsg.FetchResponseTopicPartition{Partition: fs.p.tp.partition, HighWatermark: 1 << 20, LastStableOffset: -1}
			if i < room {
				rp.RecordBatches = frameBatch(r.offsets[i], 0, 1, 0, nil)
				served[fs.p.tp.partition]++
			}
			res.Topics[0].Partitions = append(res.Topics[0].Partitions, rp)
		}
		f.deliver(b, r, res)
		for _, fs := range r.states { // handled at once
			f.release(fs.p, fs.buffered.Load())
		}
	}
	for p := range int32(parts) {
		if served[p] != 1 {
			t.Fatalf("partition %d served %d times in %d requests of room %d, want once: %v", p, served[p], (parts+room-1)/room, room, served)
		}
	}
}

// newTestFetcher is a fetcher of cfg that does not run: its leaders are
// what a test puts in its table.
func newTestFetcher(cfg Config) *fetcher {
	f := newFetcher(&cfg, zap.NewNop(), newCluster(&cfg), newLeaderTable(nil, nil), nil, &loopWatch{})
	f.coalesce = 0 // requests are built right after the adds
	return f
}

// put makes id tp's leader.
func (t *leaderTable) put(tp topicPartition, id int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leaders[tp] = id
	t.addrs[id] = ""
}

// Partitions added in a burst (an assignment's goroutines starting) go in
// one request: while they keep coming, build waits for a pause of
// addQuiet, and at most the fetcher's coalesce from the burst's first.
func TestFetchWaitsForAddsToPause(t *testing.T) {
	f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	f.coalesce = addCoalesce
	b := newBrokerLoop(1, "")
	f.addLoops(1, []*brokerLoop{b})
	add := func(p int32) {
		tp := topicPartition{"t", p}
		f.leaders.put(tp, 1)
		f.add(&partition{tp: tp, st: newPartitionStats(tp)}, 0)
	}
	add(0)
	add(1)
	r, wait := f.build(b, false)
	if r != nil || wait <= 0 || wait > addQuiet {
		t.Fatalf("build during the adds: request %v, wait %v; want none, and a wait of at most %v", r != nil, wait, addQuiet)
	}
	time.Sleep(2 * addQuiet)
	if r, _ = f.build(b, false); r == nil || len(r.states) != 2 {
		t.Fatalf("after the adds paused: want a request for both partitions, got %v", r)
	}
	// A burst that never pauses waits no longer than coalesce.
	f = newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	f.coalesce = 20 * time.Millisecond
	b = newBrokerLoop(1, "")
	f.addLoops(1, []*brokerLoop{b})
	deadline := time.Now().Add(time.Second)
	for p := int32(0); ; p++ {
		add(p)
		if r, _ := f.build(b, false); r != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request after %d partitions added back to back for 1 s; want one after at most %v", p+1, f.coalesce)
		}
	}
}

// Decompressed batches count in the budget: a partition waits in inflate
// while its batch does not fit, the requests leave room for what it waits
// for, and a release (or a request's reserve coming back) lets it go. One
// partition always goes when none holds a decompressed batch, and the
// first decompressions, whose size is a guess, go one at a time.
func TestInflateWaitsForRoom(t *testing.T) {
	const budget = 1 << 20
	f := newTestFetcher(Config{MaxBufferedBytes: budget, FetchMaxBytes: budget})
	b := newBrokerLoop(1, "")
	f.addLoops(1, []*brokerLoop{b})
	parts := make([]*partition, 3)
	for i := range parts {
		tp := topicPartition{"t", int32(i)}
		f.leaders.put(tp, 1)
		parts[i] = &partition{tp: tp, st: newPartitionStats(tp)}
		f.add(parts[i], 0)
	}
	ctx := t.Context()
	went := func(p *partition, est int64) chan bool {
		ch := make(chan bool, 1)
		go func() { ch <- f.inflate(ctx, p, est) }()
		return ch
	}
	waits := func(ch chan bool, what string) {
		t.Helper()
		select {
		case ok := <-ch:
			t.Fatalf("%s: inflate returned %v, want it to wait", what, ok)
		case <-time.After(50 * time.Millisecond): // it waits: nothing to wait for
		}
	}
	goes := func(ch chan bool, what string) {
		t.Helper()
		select {
		case ok := <-ch:
			if !ok {
				t.Fatalf("%s: inflate returned false", what)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: inflate still waits", what)
		}
	}

	// Nothing decompressed yet: the first goes whatever its size, and the
	// second waits for the ratio, however small.
	goes(went(parts[0], 2*budget), "the first batch, larger than the budget")
	second := went(parts[1], 10)
	waits(second, "a batch before any ratio is known")
	f.ratio.Store(4 * 16)
	f.holdDecoded(parts[0].fetch, -2*budget)
	goes(second, "a batch once the first released")

	// Room is the budget less what is buffered and reserved.
	f.reserved.Add(budget / 2)
	third := went(parts[2], budget/2)
	waits(third, "a batch that fits only without the reserve")
	if got := f.wanted.Load(); got != budget/2 {
		t.Fatalf("wanted = %d while a partition waits for %d bytes", got, budget/2)
	}
	if f.room() {
		t.Fatalf("room() with %d buffered, %d reserved and %d wanted of a %d budget: requests would take what decoding waits for",
			f.buffered.Load(), f.reserved.Load(), f.wanted.Load(), budget)
	}
	f.unreserve(&request{reserve: budget / 2})
	goes(third, "a batch once the reserve came back")
	if got := f.wanted.Load(); got != 0 {
		t.Fatalf("wanted = %d after the waiting partition went", got)
	}
	if got, want := f.buffered.Load(), int64(10+budget/2); got != want {
		t.Fatalf("buffered = %d, want the two held batches' %d", got, want)
	}
	if got := parts[2].st.buffered.Load(); got != budget/2 {
		t.Fatalf("partition 2's BufferedBytes = %d, want its decompressed %d", got, budget/2)
	}

	// A wait ends with its partition's context.
	cctx, cancel := context.WithCancel(ctx)
	ch := make(chan bool, 1)
	go func() { ch <- f.inflate(cctx, parts[0], budget) }()
	waits(ch, "a batch with no room")
	cancel()
	if ok := <-ch; ok {
		t.Fatal("inflate returned true after its context ended")
	}
	if got := f.wanted.Load(); got != 0 {
		t.Fatalf("wanted = %d after the waiting partition's context ended", got)
	}

	// With the budget full, a batch within its partition's share still
	// goes: partitions holding batches do not take the others' turn.
	f.reserved.Add(budget)
	share := f.shareBytes.Load()
	goes(went(parts[0], share), "a batch of the partition's share with the budget full")
	again := went(parts[0], share)
	waits(again, "a second batch of a partition holding one")
	f.holdDecoded(parts[0].fetch, -share)
	goes(again, "the second batch once the first released")
	f.holdDecoded(parts[0].fetch, -share)
	f.reserved.Add(-budget)

	// A partition's removal gives back what it held decompressed.
	f.remove(parts[2])
	f.remove(parts[1])
	if d, bu := f.decoded.Load(), f.buffered.Load(); d != 0 || bu != 0 {
		t.Fatalf("after the partitions were removed: decoded %d, buffered %d, want 0", d, bu)
	}
}

// The broker loops run side by side, each under its own lock, while run
// moves their partitions between brokers and the assignment removes and
// adds them: with every loop building and answering requests at once, no
// loop deadlocks against another or against the moves, every partition's
// chunks follow on from each other (a partition moved while in flight is
// fetched by its new loop only after the old one's answer), and every
// partition is in its set once all is done. Run with -race.
func TestFetchLoopsRunSideBySide(t *testing.T) {
	const brokers, parts, rounds = 3, 48, 1500
	f := newTestFetcher(Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond})
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	f.ctx = stopped // failed returns without its backoff sleep
	for id := range int32(brokers) {
		testLanes(f, id)
	}
	loops := f.allLoops()
	type owned struct {
		p    *partition
		next int64
	}
	var mu sync.Mutex // guards errs
	var errs []string
	fail := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// handle takes a partition's chunks, checks they follow on, and
	// releases their bytes: the partition's goroutine.
	handle := func(o *owned) {
		for _, c := range o.p.q.take(nil) {
			if c.from != o.next {
				fail("%v: a chunk of [%d, %d) after one that ended at %d", o.p.tp, c.from, c.end, o.next)
			}
			o.next = c.end
			f.release(o.p, c.bytes)
		}
	}
	ps := make([]*owned, parts)
	for i := range ps {
		tp := topicPartition{"t", int32(i)}
		f.leaders.put(tp, int32(i%brokers))
		ps[i] = &owned{p: &partition{tp: tp, st: newPartitionStats(tp), q: newInbox[*chunk]()}}
		f.add(ps[i].p, 0)
	}
	var wg sync.WaitGroup
	for i, b := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			deadline := time.Now().Add(10 * time.Second)
			for n := 0; n < rounds && time.Now().Before(deadline); {
				r, _ := f.build(b, true)
				if r == nil {
					time.Sleep(10 * time.Microsecond)
					continue
				}
				n++
				switch rng.IntN(20) {
				case 0:
					f.failed(b, r, context.DeadlineExceeded, &backoff{})
				case 1:
					b.mu.Lock() // as deliver holds it
					f.partitionError(b, r.states[0], kafka.NotLeaderForPartition)
					b.mu.Unlock()
					f.sessionRefused(b, r, int16(kafka.FetchSessionIDNotFound))
				default:
					f.deliver(b, r, answerOne(r, 1<<40))
				}
			}
		}()
	}
	// The partitions' goroutines and run: handle, move, remove and add,
	// until the loops are done.
	loopsDone, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(99, 1))
		for {
			select {
			case <-loopsDone:
				return
			default:
			}
			o := ps[rng.IntN(parts)]
			switch rng.IntN(4) {
			case 0:
				f.mu.Lock()
				f.leaders.put(o.p.tp, int32(rng.IntN(brokers)))
				f.setLeader(o.p.fetch, f.leaders.leaders[o.p.tp])
				f.mu.Unlock()
			case 1:
				f.remove(o.p)
				o.p = &partition{tp: o.p.tp, st: newPartitionStats(o.p.tp), q: newInbox[*chunk]()}
				o.next = 0
				f.add(o.p, 0)
			case 2:
				f.mu.Lock()
				for fs := range f.leaderless {
					f.setLeader(fs, f.leaders.leaders[fs.p.tp])
				}
				f.mu.Unlock()
			default:
				handle(o)
			}
		}
	}()
	wg.Wait()
	close(loopsDone)
	<-done
	if len(errs) > 0 {
		t.Fatalf("%d errors, the first: %s", len(errs), errs[0])
	}
	f.mu.Lock()
	for fs := range f.leaderless {
		f.setLeader(fs, f.leaders.leaders[fs.p.tp])
	}
	f.mu.Unlock()
	checkSets(t, f)
}
