package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The dispatcher eases off (stops decoding) while more than easeJobs jobs
// wait for a worker, and is told as soon as the workers took all but
// easeJobs of them.
func TestRunqEase(t *testing.T) {
	q := &runq{wake: make(chan struct{}, 8), caughtUp: make(chan struct{}, 1)}
	for i := range easeJobs + 2 {
		q.push(&job{msgs: make([]kafka.Message, 1), whole: i%2 == 0})
	}
	if !q.behind() {
		t.Fatalf("%d jobs queued: not behind", easeJobs+2)
	}
	q.pop()
	select {
	case <-q.caughtUp:
		t.Fatalf("caught up with %d jobs queued", easeJobs+1)
	default:
	}
	q.pop()
	select {
	case <-q.caughtUp:
	default:
		t.Fatalf("no token with %d jobs queued", easeJobs)
	}
	if q.behind() {
		t.Fatalf("behind with %d jobs queued", easeJobs)
	}
	// Workers parked in pop take what is pushed; close ends them.
	var wg sync.WaitGroup
	got := make(chan *job, easeJobs)
	for range 2 {
		wg.Go(func() {
			for j := q.pop(); j != nil; j = q.pop() {
				got <- j
			}
		})
	}
	for range easeJobs {
		<-got
	}
	q.close()
	wg.Wait()
}

// testPartition is a partition of a Consumer that is not running, with its
// offset file, for driving a dispatcher directly.
func testPartition(t *testing.T, cfg Config) (*partition, *tracker, *offsetfile.Marker) {
	t.Helper()
	cfg.Brokers, cfg.GroupID, cfg.Topics = []string{"127.0.0.1:1"}, "g", []string{"t"}
	cfg.OffsetFile = filepath.Join(t.TempDir(), "o.db")
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	store, err := offsetfile.Open(cfg.OffsetFile, &offsetfile.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	env := &partitionEnv{cfg: &cfg, log: zap.NewNop(), store: store, fetcher: newTestFetcher(cfg), handle: handleFunc(cfg.Handler), batch: cfg.BatchHandler}
	tp := topicPartition{"t", 0}
	st := newPartitionStats(tp)
	p := &partition{env: env, tp: tp, key: storeKey(cfg.GroupID, tp), st: st,
		q: newInbox[*chunk]()}
	p.iv = invoker{p: p, policy: cfg.policy("t"), br: newBreaker(nil, 0)}
	tr := newTracker(0, nil, &st.processed)
	mark, err := store.NewProgressMarker(p.key, 1, "m", tr.progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mark.Close)
	return p, tr, mark
}

// keyCalls is a Handler that checks OrderKey's promises: a key's calls
// never overlap and come in offset order; it records the most calls at
// once and every offset handled.
type keyCalls struct {
	mu      sync.Mutex
	busy    map[string]bool
	last    map[string]int64
	handled map[int64]int
	now     int
	peak    int
	bad     []string
}

func (h *keyCalls) Handle(_ context.Context, m kafka.Message) error {
	k := string(m.Key)
	h.mu.Lock()
	if h.busy[k] {
		h.bad = append(h.bad, fmt.Sprintf("key %s: offset %d while another call of the key runs", k, m.Offset))
	}
	if last, ok := h.last[k]; ok && last >= m.Offset {
		h.bad = append(h.bad, fmt.Sprintf("key %s: offset %d after %d", k, m.Offset, last))
	}
	h.busy[k], h.last[k] = true, m.Offset
	h.now++
	h.peak = max(h.peak, h.now)
	h.mu.Unlock()
	time.Sleep(200 * time.Microsecond)
	h.mu.Lock()
	h.busy[k] = false
	h.now--
	h.handled[m.Offset]++
	h.mu.Unlock()
	return nil
}

// The dispatcher with OrderKey: messages of 10 keys, added in batches as
// the partition's goroutine adds a decoded batch, run on up to MaxInFlight
// workers, a key's calls one at a time and in order; every offset is
// handled once and the watermark ends past the last one.
func TestDispatcherOrderKey(t *testing.T) {
	const n, keys, inFlight = 400, 10, 4
	h := &keyCalls{busy: map[string]bool{}, last: map[string]int64{}, handled: map[int64]int{}}
	p, tr, mark := testPartition(t, Config{Handler: h, Ordering: OrderKey, MaxInFlight: inFlight})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDispatcher(p, tr, ctx, ctx, mark.Changed)
	d.mark, d.reuse = mark, true
	for o := int64(0); o < n; o++ {
		m := kafka.Message{Topic: "t", Offset: o, Key: fmt.Appendf(nil, "k%d", o%keys)}
		if !d.add(&m) {
			t.Fatalf("add(%d) = false with the generation going on", o)
		}
		if o%25 == 24 && !d.flush() { // the end of a decoded batch
			t.Fatalf("flush after %d = false", o)
		}
	}
	if !d.flush() || !d.settle(false) {
		t.Fatal("settle = false with the generation going on")
	}
	d.close()
	if wm := tr.watermark(); wm != n {
		t.Fatalf("watermark %d after every message returned, want %d", wm, n)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.bad) > 0 {
		t.Fatalf("%d order violations, first %s", len(h.bad), h.bad[0])
	}
	for o := int64(0); o < n; o++ {
		if h.handled[o] != 1 {
			t.Fatalf("offset %d handled %d times", o, h.handled[o])
		}
	}
	if h.peak < 2 || h.peak > inFlight {
		t.Fatalf("at most %d calls at once, want 2..%d (MaxInFlight)", h.peak, inFlight)
	}
	if s := p.st.snapshot(func() (int64, int64) { return -1, -1 }); s.Handled != n || s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("stats after the run: handled %d, in flight %d, waiting %d", s.Handled, s.InFlight, s.Waiting)
	}
}
