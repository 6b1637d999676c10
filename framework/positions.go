package framework

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	recon "github.com/tidemark/tidemark/internal/reconcile"
	"github.com/tidemark/tidemark/internal/wire"
)

// positions knows where partitions' logs begin and end, and what the
// OutOfRange policy makes of a position outside them. The assignment asks
// it at reconciliation (the group loop), the fetcher's goroutine for the
// positions a broker refused.
//
// Log bounds (the first offset and the high watermark of partitions) are
// asked of each partition's leader in two ListOffsets requests per broker
// (three at read_committed), not one request per partition and offset on a
// connection of its own: a thousand partitions would mean hundreds of
// sockets at every assignment. Every broker is asked at once, and each
// broker the first offsets and the log ends at once, on two connections
// per broker kept for that purpose: a broker answers one request of a
// connection at a time, and at 5,000 partitions each answer took Kafka
// about 25 ms. mu holds one question at a time and guards the
// connections; Run closes them as it returns.
type positions struct {
	cfg     *Config
	log     *zap.Logger
	cl      *cluster
	leaders *leaderTable

	mu    sync.Mutex
	conns map[listConn]*wire.Conn
}

// listConn names one of a broker's connections for ListOffsets: lane 0
// asks the first offsets, lane 1 the log ends.
type listConn struct {
	broker int32
	lane   int
}

func newPositions(cfg *Config, log *zap.Logger, cl *cluster, leaders *leaderTable) *positions {
	return &positions{cfg: cfg, log: log, cl: cl, leaders: leaders, conns: map[listConn]*wire.Conn{}}
}

// logBounds are a partition's first offset, its log end (the high
// watermark) and its last stable offset: the log end at read_committed,
// where an open transaction holds it back (the log end at
// ReadUncommitted). The latest position a partition may start at is
// stable: starting at the log end would pass the records of the open
// transactions below it, which may yet commit.
type logBounds struct{ first, last, stable int64 }

// bounds lists the log bounds of parts, in order, retrying with backoff
// until it succeeds or ctx ends (then nil). Each try stamps the caller's
// loop watch: retrying is alive.
func (ps *positions) bounds(ctx context.Context, parts []topicPartition, w *loopWatch) []logBounds {
	if len(parts) == 0 {
		return nil
	}
	bo := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		w.busy()
		out, err := ps.list(ctx, parts)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			return nil
		}
		d := bo.next()
		ps.log.Warn("listing log bounds failed; retrying", zap.Error(err), zap.Duration("backoff", d))
		if !sleep(ctx, d) {
			return nil
		}
	}
}

// target applies the OutOfRange policy to a position outside the log
// [first, last]: where to resume, or false if the partition stalls.
func (ps *positions) target(b logBounds) (int64, bool) {
	return recon.Target(recon.Policy(ps.cfg.OutOfRange), b.first, b.stable)
}

// The OutOfRange policies have the same values in package reconcile: a
// difference fails to compile (a constant index out of range).
var (
	_ = [1]struct{}{}[int(ResetToEarliest)-int(recon.ResetToEarliest)]
	_ = [1]struct{}{}[int(ResetToLatest)-int(recon.ResetToLatest)]
	_ = [1]struct{}{}[int(Stall)-int(recon.Stall)]
)

// stallError is the error of a partition stalled by the OutOfRange policy.
func stallError(tp topicPartition, from, first, last int64, reason string) error {
	return fmt.Errorf("tidemark: %s/%d: %s (position %d, log [%d, %d]); stalled by the OutOfRange policy",
		tp.topic, tp.partition, reason, from, first, last)
}

// list returns the log bounds of tps, in order.
func (ps *positions) list(ctx context.Context, tps []topicPartition) ([]logBounds, error) {
	leaders, addrs, err := ps.leaders.of(ctx, tps)
	if err != nil {
		return nil, err
	}
	byBroker := map[int32][]int{}
	for i := range tps {
		byBroker[leaders[i]] = append(byBroker[leaders[i]], i)
	}
	lanes := [2][]listAsk{{{ts: kafka.FirstOffset}}, {{ts: kafka.LastOffset}}}
	if ps.cfg.IsolationLevel == kafka.ReadCommitted {
		// The LSO before the log end, on the same connection: asked
		// after it, it could pass it.
		lanes[1] = []listAsk{{ts: kafka.LastOffset, committed: true}, {ts: kafka.LastOffset}}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]logBounds, len(tps))
	type job struct {
		at   listConn
		idx  []int
		conn *wire.Conn
		err  error
	}
	jobs := make([]job, 0, len(lanes)*len(byBroker))
	for id, idx := range byBroker {
		for lane := range lanes {
			at := listConn{id, lane}
			jobs = append(jobs, job{at: at, idx: idx, conn: ps.conns[at]})
		}
	}
	// Each job writes its own fields of out's elements.
	var wg sync.WaitGroup
	for i := range jobs {
		j := &jobs[i]
		wg.Go(func() {
			if j.conn == nil {
				if j.conn, j.err = ps.cl.dial(ctx, addrs[j.at.broker]); j.err != nil {
					return
				}
			}
			for _, ask := range lanes[j.at.lane] {
				if err := listOffsets(ctx, j.conn, tps, j.idx, ask, out, ps.cfg.Timeout); err != nil {
					j.err = fmt.Errorf("listing offsets on broker %d: %w", j.at.broker, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, j := range jobs {
		if _, partial := errors.AsType[partitionErr](j.err); j.conn != nil && (j.err == nil || partial) {
			ps.conns[j.at] = j.conn
		} else if j.conn != nil {
			j.conn.Close()
			delete(ps.conns, j.at)
		}
		if j.err != nil {
			ps.leaders.forget(tps, j.idx)
			err = cmp.Or(err, j.err)
		}
	}
	if err != nil {
		return nil, err
	}
	for i, b := range out {
		if ps.cfg.IsolationLevel != kafka.ReadCommitted {
			out[i].stable, b.stable = b.last, b.last
		}
		if b.first < 0 || b.last < b.first || b.stable < b.first || b.stable > b.last {
			return nil, fmt.Errorf("%s/%d: invalid log bounds [%d, %d] (last stable offset %d)", tps[i].topic, tps[i].partition, b.first, b.last, b.stable)
		}
	}
	return out, nil
}

// close closes the connections; Run calls it once nothing asks any more.
func (ps *positions) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for id, conn := range ps.conns {
		conn.Close()
		delete(ps.conns, id)
	}
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
	ts := ask.ts
	req := wire.NewListOffsets(ts, ask.committed, func(yield func(string, int32) bool) {
		for _, i := range idx {
			if !yield(tps[i].topic, tps[i].partition) {
				return
			}
		}
	})
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return err
	}
	got := answersInOrder(msg.(*kmsg.ListOffsetsResponse), tps, idx)
	for j, i := range idx {
		p := got[j]
		switch {
		case p == nil:
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

// answersInOrder returns the answer for each of tps[idx...] in res, nil
// where it has none (the last, if it has two). A broker answers in the
// request's order, so each is found where the last one ended; a map of the
// request is made only for an answer out of order (at 10,000 partitions,
// a map of the answers was about a sixth of a start's allocations).
func answersInOrder(res *kmsg.ListOffsetsResponse, tps []topicPartition, idx []int) []*kmsg.ListOffsetsResponseTopicPartition {
	got := make([]*kmsg.ListOffsetsResponseTopicPartition, len(idx))
	var where map[topicPartition]int
	next := 0
	for ti := range res.Topics {
		t := &res.Topics[ti]
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			tp := topicPartition{t.Topic, p.Partition}
			j := -1
			if next < len(idx) && tps[idx[next]] == tp {
				j = next
			} else {
				if where == nil {
					where = make(map[topicPartition]int, len(idx))
					for j, i := range idx {
						where[tps[i]] = j
					}
				}
				if k, ok := where[tp]; ok {
					j = k
				}
			}
			if j >= 0 {
				got[j] = p
				next = j + 1
			}
		}
	}
	return got
}
