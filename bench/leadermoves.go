package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/paced"
)

// The leader-move section: one partition's leader moves between the three
// brokers of a kfake cluster, again and again, under a steady producer; a
// move's resume time runs from the move to the first message the consumer
// handles from the new leader. tidemark and franz-go's kgo consumer group,
// each at its defaults, in the same scenario. The cluster, the producer and
// the consumer share this process: a timing, not a CPU, measurement.

// leaderMoveConsumers are the consumers of the section, in their order.
var leaderMoveConsumers = []string{consTidemark, consFranz}

const (
	leaderMoveBrokers = 3
	// leaderMoveTick is the producer's pace: a record every 2 ms.
	leaderMoveTick = 2 * time.Millisecond
	// leaderMoveSteady is the number of messages a consumer handles from a
	// new leader before the next move.
	leaderMoveSteady = 50
)

// leaderMoveRuns is what the section measured: per consumer, each round's
// resume time per move.
type leaderMoveRuns struct {
	runs map[string][][]time.Duration
	took time.Duration
	skip string // why the section did not run
}

func (b *bench) leaderMovesPhase(ctx context.Context) error {
	lm := &b.moves
	if len(b.o.brokers) > 0 {
		lm.skip = "moves leaders with kfake's controls: only on the in-process broker"
		b.logf("leadermoves: skipped: %s", lm.skip)
		return nil
	}
	var cons []string
	for _, c := range leaderMoveConsumers {
		if contains(b.o.consumers, c) {
			cons = append(cons, c)
		}
	}
	if len(cons) == 0 {
		lm.skip = "-consumers names neither tidemark nor franz-go"
		return nil
	}
	start := time.Now()
	lm.runs = map[string][][]time.Duration{}
	for r := 0; r < b.o.movesRounds; r++ {
		for _, c := range rotate(cons, r) {
			res, err := b.leaderMovesRun(ctx, c, b.o.moves)
			if err != nil {
				return fmt.Errorf("leadermoves round %d, %s: %w", r+1, c, err)
			}
			lm.runs[c] = append(lm.runs[c], res)
			b.logf("leadermoves round %d/%d %-9s %d moves: resume median %s, mean %s, max %s; first 10 %s, last 10 %s",
				r+1, b.o.movesRounds, c, len(res), medianDur(res), meanDur(res), slices.Max(res),
				medianDur(res[:min(10, len(res))]), medianDur(res[max(0, len(res)-10):]))
		}
	}
	lm.took = time.Since(start)
	return nil
}

// leaderMovesRun is one consumer's run on a fresh cluster: moves leader
// moves of one partition, each once the consumer handled leaderMoveSteady
// messages from the previous leader.
func (b *bench) leaderMovesRun(ctx context.Context, consumer string, moves int) ([]time.Duration, error) {
	topic := fmt.Sprintf("tidemark-bench-%s-moves", b.runID)
	fake, err := kfake.NewCluster(kfake.NumBrokers(leaderMoveBrokers), kfake.SeedTopics(1, topic))
	if err != nil {
		return nil, err
	}
	defer fake.Close()
	addrs := fake.ListenAddrs()
	ctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()

	p, err := paced.Start(ctx, addrs, topic, fake.LeaderFor(topic, 0), leaderMoveTick,
		func(o int64) []byte { return fmt.Appendf(nil, "m%07d", o) })
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	// kfake answers an OffsetForLeaderEpoch for the previous epoch with -1
	// until the new epoch has a batch (Kafka answers with the new epoch's
	// start offset), which franz-go takes for data loss: it resets to the
	// start. One that arrives between a move and the new epoch's first
	// record waits for that record.
	var gate atomic.Pointer[chan struct{}]
	fake.ControlKey(int16(kmsg.OffsetForLeaderEpoch), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if g := gate.Load(); g != nil {
			fake.SleepControl(func() { <-*g })
		}
		return nil, nil, false
	})
	w := &moveWatch{failed: make(chan error, 1)}
	stopConsumer, err := startMoveConsumer(ctx, consumer, addrs, topic, b.group(consumer+"-moves"), b.tmp, w)
	if err != nil {
		return nil, err
	}
	defer stopConsumer()
	if err := w.until(ctx, p, 200); err != nil {
		return nil, fmt.Errorf("%s/0: the first 200 messages: %w", topic, err)
	}
	out := make([]time.Duration, 0, moves)
	for i := 1; i <= moves; i++ {
		next := (fake.LeaderFor(topic, 0) + 1) % leaderMoveBrokers
		var from int64
		var movedAt time.Time
		var merr error
		var resumed <-chan time.Time
		g := make(chan struct{})
		gate.Store(&g)
		p.Between(func(l paced.Locked) {
			defer close(g)
			if merr = fake.MoveTopicPartition(topic, 0, next); merr != nil {
				return
			}
			movedAt, from = time.Now(), l.Next()
			l.Lead(next)
			resumed = w.wait(from)
			// The new epoch's first record at once, before g opens.
			merr = l.Produce(ctx)
		})
		if merr != nil {
			return nil, fmt.Errorf("move %d of %s/0 to broker %d: %w", i, topic, next, merr)
		}
		select {
		case at := <-resumed:
			out = append(out, at.Sub(movedAt))
		case err := <-p.Failed():
			return nil, err
		case err := <-w.failed:
			return nil, err
		case <-ctx.Done():
			return nil, fmt.Errorf("move %d of %s/0 to broker %d: offset %d not handled: %w", i, topic, next, from, ctx.Err())
		}
		if err := w.until(ctx, p, from+leaderMoveSteady); err != nil {
			return nil, fmt.Errorf("%s/0 after move %d: %w", topic, i, err)
		}
	}
	return out, nil
}

// moveWatch sees each message a consumer handles: it checks that the
// offsets come in order without gaps or repeats, and tells when the first
// one at or above an offset is handled.
type moveWatch struct {
	mu      sync.Mutex
	next    int64 // the offset the next message must have
	from    int64
	resumed chan time.Time
	failed  chan error
}

// wait returns the channel that gets the time the first message at or
// above from is handled.
func (w *moveWatch) wait(from int64) <-chan time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.from, w.resumed = from, make(chan time.Time, 1)
	return w.resumed
}

func (w *moveWatch) handled(offset int64) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if offset != w.next {
		select {
		case w.failed <- fmt.Errorf("partition 0: offset %d handled after %d, want %d", offset, w.next-1, w.next):
		default:
		}
		return
	}
	w.next++
	if w.resumed != nil && offset >= w.from {
		w.resumed <- now
		w.resumed = nil
	}
}

func (w *moveWatch) handledTo() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// until waits for the offsets before end to be handled.
func (w *moveWatch) until(ctx context.Context, p *paced.Producer, end int64) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for w.handledTo() < end {
		select {
		case <-ctx.Done():
			return fmt.Errorf("offsets to %d handled to %d: %w", end, w.handledTo(), ctx.Err())
		case err := <-p.Failed():
			return err
		case err := <-w.failed:
			return err
		case <-t.C:
		}
	}
	return nil
}

// startMoveConsumer starts consumer at its defaults, handing each message's
// offset to w, and returns what stops it.
func startMoveConsumer(ctx context.Context, consumer string, addrs []string, topic, group, tmp string, w *moveWatch) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	switch consumer {
	case consTidemark:
		dir, err := os.MkdirTemp(tmp, "moves-")
		if err != nil {
			cancel()
			return nil, err
		}
		c, err := framework.New(framework.Config{
			Brokers: addrs, GroupID: group, Topics: []string{topic}, OffsetFile: filepath.Join(dir, "offsets.db"),
			Handler: handler.HandlerFunc(func(_ context.Context, m kafka.Message) error { w.handled(m.Offset); return nil }),
		})
		if err != nil {
			cancel()
			return nil, err
		}
		go func() {
			defer close(done)
			if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				select {
				case w.failed <- fmt.Errorf("tidemark: %w", err):
				default:
				}
			}
			_ = os.RemoveAll(dir)
		}()
	case consFranz:
		kc, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			cancel()
			return nil, err
		}
		go func() {
			defer close(done)
			defer kc.Close()
			for ctx.Err() == nil {
				fs := kc.PollFetches(ctx)
				fs.EachRecord(func(r *kgo.Record) { w.handled(r.Offset) })
			}
		}()
	default:
		cancel()
		return nil, fmt.Errorf("leadermoves: no consumer %q", consumer)
	}
	return func() { cancel(); <-done }, nil
}

func medianDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func meanDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// quantileDur is the q-quantile (nearest rank) of ds.
func quantileDur(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// leaderMovesReport renders the section in a block of its own (markers
// bench:KEY:leadermoves) that a run of this section alone replaces
// (updateSubsection); standalone, the block starts with that run's
// command, machine and versions. Every move of every round is pooled per
// consumer; the ratio is tidemark's over franz-go's.
func (b *bench) leaderMovesReport(w *strings.Builder, standalone bool) {
	lm := &b.moves
	if lm.skip == "" && len(lm.runs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	key := b.sectionKey()
	p("<!-- bench:%s:%s:begin (written by bench/, do not edit by hand) -->\n", key, sectionLeaderMoves)
	p("### Leader moves: resume after a partition's leader moved\n\n")
	defer p("<!-- bench:%s:%s:end -->\n", key, sectionLeaderMoves)
	if lm.skip != "" {
		p("Not run: %s.\n\n", lm.skip)
		return
	}
	if standalone {
		p("Written by a run of this section alone, which replaces only this part of the %s section:\n\n", key)
		b.runHeader(w)
		p("\n")
	}
	p("One partition's leader moved %d times between the %d brokers of a fresh kfake cluster per run, under a producer "+
		"writing a record every %s straight to the current leader (so the records after a move are at the new leader at "+
		"once; the first is written at the move); the next move once the consumer handled %d messages from the new leader. "+
		"A move's resume time: from the move to the first message handled from the new leader. Each consumer at its "+
		"defaults (tidemark: Fetch v11, whose errors do not name the new leader, so it looks the leader up; franz-go: a "+
		"`kgo` consumer group, which moves a partition to the leader a v12+ Fetch response names, KIP-951); the cluster, the producer and the consumer in one process; %d round(s) in alternation, every offset "+
		"checked in order without gaps or repeats; the section took %s. kfake answers an OffsetForLeaderEpoch for the "+
		"previous epoch with -1 until the new epoch has a batch (Kafka answers with the new epoch's start offset), which "+
		"franz-go takes for data loss and resets to the first offset; such a request waits here for the new epoch's first "+
		"record. Figures over every move of every round.\n\n",
		b.o.moves, leaderMoveBrokers, leaderMoveTick, leaderMoveSteady, b.o.movesRounds, lm.took.Round(time.Second))
	p("| consumer | moves | median | mean | p90 | max | first 10 moves (median) | last 10 moves (median) |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	pooled := map[string][]time.Duration{}
	for _, c := range leaderMoveConsumers {
		var all, first, last []time.Duration
		for _, run := range lm.runs[c] {
			all = append(all, run...)
			first = append(first, run[:min(10, len(run))]...)
			last = append(last, run[max(0, len(run)-10):]...)
		}
		if len(all) == 0 {
			continue
		}
		pooled[c] = all
		p("| %s | %d | %s | %s | %s | %s | %s | %s |\n", c, len(all), msDur(medianDur(all)), msDur(meanDur(all)),
			msDur(quantileDur(all, 0.9)), msDur(slices.Max(all)), msDur(medianDur(first)), msDur(medianDur(last)))
	}
	p("\n")
	t, f := pooled[consTidemark], pooled[consFranz]
	if len(t) > 0 && len(f) > 0 {
		p("tidemark / franz-go, resume time per move: median **%s**, mean **%s** (below 1: tidemark resumes sooner).\n\n",
			ratioText(float64(medianDur(t))/float64(medianDur(f))), ratioText(float64(meanDur(t))/float64(meanDur(f))))
	}
}

func msDur(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
