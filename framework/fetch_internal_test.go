package framework

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
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
			c := &Consumer{log: zap.NewNop(), cfg: Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond}}
			f := newFetcher(c)
			b := &brokerLoop{id: 1, wake: make(chan struct{}, 1)}
			f.brokers[1] = b
			state := func(p int32, hwm int64) *fetchState {
				tp := topicPartition{"t", p}
				st := newPartitionState(tp)
				st.hwm.Store(hwm)
				fs := &fetchState{p: &partition{tp: tp, st: st}, next: 100, leader: 1, refused: -1}
				f.parts[tp] = fs
				return fs
			}
			full := state(0, tc.hwm)
			state(1, 100) // at its log end, not yet seen idle
			full.buffered = f.share()
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

// A partition's retry backoff starts over once a fetch of it succeeds: a
// leader move late in a consumer's life waits as little as the first one.
// Without the reset every move after the seventh or so cost 2.5-5 s.
func TestFetchPartitionBackoffResetsAfterSuccess(t *testing.T) {
	c := &Consumer{log: zap.NewNop(), cfg: Config{MaxBufferedBytes: 1 << 20, FetchMaxBytes: 1 << 20, FetchMaxWait: 250 * time.Millisecond}}
	f := newFetcher(c)
	b := &brokerLoop{id: 1, wake: make(chan struct{}, 1)}
	f.brokers[1] = b
	tp := topicPartition{"t", 0}
	p := &partition{tp: tp, st: newPartitionState(topicPartition{"t", int32(0)}), q: newInbox[*chunk]()}
	f.add(p, 0)
	fs := f.parts[tp]
	moved := kafka.NotLeaderForPartition
	retryIn := func() time.Duration { return time.Until(fs.retryAt) }
	// Many leader moves, each followed by a successful fetch from the new
	// leader.
	var first time.Duration
	for move := 1; move <= 20; move++ {
		fs.leader = 1
		f.partitionError(b, fs, moved)
		d := retryIn()
		if move == 1 {
			first = d
		}
		if d > 60*time.Millisecond {
			t.Fatalf("move %d: retry in %s (the first move's: %s): the backoff grew across moves", move, d, first)
		}
		fs.leader, fs.retryAt, fs.inflight = 1, time.Time{}, true
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
	}
	if d := retryIn(); d < 200*time.Millisecond || d > leaderRetryMax {
		t.Fatalf("retry in %s after 5 errors in a row, want the backoff grown to 200ms-%s", d, leaderRetryMax)
	}
}
