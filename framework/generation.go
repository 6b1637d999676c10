package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// generation is this consumer's part in one consumer-group generation: the
// partitions assigned to it, their workers and the background committer.
type generation struct {
	c     *Consumer
	gen   *kafka.Generation
	log   *zap.Logger
	parts []*assigned
	// workers counts the partition goroutines of this generation; the final
	// commit waits for them.
	workers sync.WaitGroup
	// fenced is set once a commit was refused because the generation ended
	// (IllegalGeneration, UnknownMemberId, FencedInstanceId): committing
	// stops, the offset file keeps the watermarks for the next owner.
	fenced atomic.Bool
	// failures counts commits failed in a row, so that an outage is logged
	// at its start, then sparsely, and at its end. Only the generation's
	// main goroutine commits.
	failures   int
	failedFrom time.Time
}

// assigned is one partition in one generation.
type assigned struct {
	st  *partitionState
	key offsetstore.Key
	// kafkaOffset is the committed offset kafka-go fetched when the
	// generation started; -1 when none.
	kafkaOffset int64
	// started is set once the partition's worker runs; only started
	// partitions are committed.
	started bool
	// committed is the last offset this generation committed or learned
	// from Kafka. Touched only by the generation's main goroutine.
	committed int64
	// unknown is the last commit attempt whose outcome is unknown (no
	// answer), to confirm against Kafka at the next commit; nil if none.
	// Touched only by the generation's main goroutine.
	unknown *offsetstore.CommitAttempt
	// policy is the partition's failure policy; br its crash-loop breaker,
	// used by the partition's goroutine only.
	policy FailurePolicy
	br     *breaker
}

func (c *Consumer) startGeneration(gen *kafka.Generation) {
	g := &generation{
		c:   c,
		gen: gen,
		log: c.log.With(zap.Int32("generation", gen.ID), zap.String("member", gen.MemberID)),
	}
	var names []string
	for topic, pas := range gen.Assignments {
		for _, pa := range pas {
			off := pa.Offset
			if off < 0 {
				off = -1
			}
			g.parts = append(g.parts, &assigned{
				st:          c.partitionState(topic, pa.ID),
				key:         c.storeKey(topic, pa.ID),
				kafkaOffset: off,
				committed:   off,
				policy:      c.cfg.policy(topic),
			})
			names = append(names, fmt.Sprintf("%s/%d", topic, pa.ID))
		}
	}
	c.mu.Lock()
	c.gen = generationInfo{id: gen.ID, member: gen.MemberID}
	c.mu.Unlock()
	g.log.Info("generation started", zap.Strings("assigned", names))

	c.wg.Add(1)
	gen.Start(func(ctx context.Context) {
		defer c.wg.Done()
		g.run(ctx)
	})
}

// run is the generation's main goroutine: reconcile, start the partitions,
// commit in the background, and on revoke wait for the partitions, flush and
// commit the final watermarks while the generation is still valid.
func (g *generation) run(ctx context.Context) {
	starts := g.reconcile(ctx)
	g.openRuns(ctx, starts)
	for i, p := range g.parts {
		start, ok := starts[i]
		if !ok {
			continue
		}
		p.started = true
		g.workers.Add(1)
		g.c.wg.Add(1)
		g.gen.Start(func(pctx context.Context) {
			defer g.c.wg.Done()
			defer g.workers.Done()
			g.runPartition(pctx, p, start)
		})
	}
	if len(g.parts) > 0 {
		t := time.NewTicker(g.c.cfg.CommitInterval)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-t.C:
				g.commit("interval")
			}
		}
		t.Stop()
	} else {
		<-ctx.Done()
	}
	g.workers.Wait()

	fctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	err := g.c.store.Flush(fctx)
	cancel()
	if err != nil {
		g.log.Error("flushing the offset file on revoke failed; the watermarks recorded before it stay valid", zap.Error(err))
	}
	g.commit("revoke")
	for _, p := range g.parts {
		p.st.setState(StateRevoked)
	}
	g.log.Info("generation ended")
}

// openRuns reads each starting partition's run state for the crash-loop
// breaker (found open, the last run ended uncleanly) and records, durably
// and in one flush for all of them, that this run holds the partition.
func (g *generation) openRuns(ctx context.Context, starts map[int]int64) {
	if len(starts) == 0 {
		return
	}
	limit := max(g.c.cfg.CrashLoopRestarts, 0)
	for i, p := range g.parts {
		if _, ok := starts[i]; !ok {
			continue
		}
		rec, _ := g.c.store.Get(p.key)
		p.br = newBreaker(rec.Run, limit)
		p.st.careful.Store(p.br.careful)
		if p.br.careful {
			g.log.Warn("the last run ended uncleanly (crash, kill, power loss); handling the first messages carefully, one at a time, with their offsets durable",
				zap.String("topic", p.key.Topic), zap.Int32("partition", p.key.Partition),
				zap.Int64("in_flight_at_the_end", p.br.prev.Inflight), zap.Int32("unclean_restarts", p.br.prev.Crashes))
		}
		// The previous in-flight offset is kept in memory only: counted
		// again only if this run calls the Handler on it.
		if err := g.c.store.SetRun(p.key, offsetstore.RunState{Open: true, Inflight: -1}); err != nil {
			g.log.Error("recording the run state failed", zap.Error(err))
		}
	}
	fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
	defer cancel()
	if err := g.c.store.Flush(fctx); err != nil {
		g.log.Warn("flushing the run state failed; the crash-loop breaker may miss this run", zap.Error(err))
	}
}

// reconcile decides where each partition resumes, comparing the offset
// file's durable watermark L with Kafka's committed offset C and the log's
// bounds. It returns the start offset of every partition that may run; a
// partition stalled by policy is left out. It retries listing the log
// bounds until it succeeds or the generation ends.
func (g *generation) reconcile(ctx context.Context) map[int]int64 {
	bounds := g.logBounds(ctx, g.parts)
	if bounds == nil {
		return nil
	}
	starts := make(map[int]int64, len(g.parts))
	commits := map[string]map[int]int64{}
	for i, p := range g.parts {
		b := bounds[i]
		log := g.log.With(zap.String("topic", p.key.Topic), zap.Int32("partition", p.key.Partition))
		L := int64(-1)
		rec, ok := g.c.store.Durable(p.key)
		if ok && rec.Watermark >= 0 {
			L = rec.Watermark
		}
		C := p.kafkaOffset
		if a := rec.LastCommit; a != nil && a.Outcome == offsetstore.CommitUnknown {
			g.confirm(p, log, *a, C, "at startup")
		}
		var start int64
		switch {
		case L < 0 && C < 0:
			start = b.first
			if g.c.cfg.StartOffset == kafka.LastOffset {
				start = b.last
			}
			log.Info("no position in the offset file or Kafka; starting at StartOffset",
				zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
		case L >= C:
			start = L
			if L > C {
				log.Info("offset file ahead of Kafka (a commit was late, failed or not yet made); committing the local watermark",
					zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
			} else {
				log.Debug("offset file and Kafka agree", zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
			}
		default:
			start = C
			log.Warn("Kafka ahead of the offset file (another member went further); resuming at Kafka's committed offset",
				zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", start))
		}
		if start < b.first || start > b.last {
			to, ok := g.outOfRange(log, p, start, b.first, b.last, fmt.Sprintf("position %d (local %d, kafka %d) outside the log [%d, %d] at assignment", start, L, C, b.first, b.last))
			if !ok {
				continue
			}
			start = to
		}
		p.st.processed.Store(start)
		if start != L {
			g.setWatermark(p, start)
		}
		starts[i] = start
		p.st.hwm.Store(b.last)
		p.st.committed.Store(C)
		if start != C {
			if commits[p.key.Topic] == nil {
				commits[p.key.Topic] = map[int]int64{}
			}
			commits[p.key.Topic][int(p.key.Partition)] = start
		}
	}
	// Commit what reconciliation decided, in one request, once it is
	// durable: Kafka never holds a position the file does not. The committer
	// retries anything this misses.
	if len(commits) > 0 {
		fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
		err := g.c.store.Flush(fctx)
		cancel()
		if err != nil {
			g.log.Warn("flushing reconciled positions failed; the committer commits them once durable", zap.Error(err))
			return starts
		}
	}
	if len(commits) > 0 {
		var todo []*assigned
		for _, p := range g.parts {
			if _, ok := commits[p.key.Topic][int(p.key.Partition)]; ok {
				todo = append(todo, p)
			}
		}
		if err := g.commitLedgered(commits, todo); err == nil {
			g.log.Info("reconciliation committed", zap.Any("offsets", commits))
		} else {
			g.log.Warn("reconciliation commit failed; the committer retries at the next interval",
				zap.Any("offsets", commits), zap.Error(err))
		}
	}
	return starts
}

// outOfRange applies the OutOfRange policy to a position outside [first,
// last]. It returns where to resume, or false if the partition stalls.
func (g *generation) outOfRange(log *zap.Logger, p *assigned, from, first, last int64, reason string) (int64, bool) {
	to := first
	switch g.c.cfg.OutOfRange {
	case ResetToLatest:
		to = last
	case Stall:
		err := fmt.Errorf("tidemark: %s/%d: %s; stalled by the OutOfRange policy", p.key.Topic, p.key.Partition, reason)
		log.Error("partition stalled: position out of range", zap.Int64("from", from), zap.Int64("log_start", first),
			zap.Int64("log_end", last), zap.String("policy", g.c.cfg.OutOfRange.String()))
		p.st.setError(err)
		p.st.setState(StateStalled)
		return 0, false
	}
	log.Error("position out of range; resetting", zap.Int64("from", from), zap.Int64("to", to),
		zap.Int64("log_start", first), zap.Int64("log_end", last), zap.String("policy", g.c.cfg.OutOfRange.String()),
		zap.String("reason", reason))
	if err := g.c.store.RecordReset(p.key, offsetstore.Reset{At: time.Now(), From: from, To: to, Reason: reason}); err != nil {
		log.Error("recording the reset in the offset file failed", zap.Error(err))
	}
	p.st.setError(fmt.Errorf("reset from %d to %d: %s", from, to, reason))
	return to, true
}

type logBounds struct{ first, last int64 }

// logBounds lists the first and last (high watermark) offsets of parts, in
// order, retrying until it succeeds or ctx ends (then nil).
func (g *generation) logBounds(ctx context.Context, parts []*assigned) []logBounds {
	if len(parts) == 0 {
		return nil
	}
	backoff := 100 * time.Millisecond
	for {
		out, err := g.listOffsets(ctx, parts)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			return nil
		}
		g.log.Warn("listing log bounds failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (g *generation) listOffsets(ctx context.Context, parts []*assigned) ([]logBounds, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range parts {
		t, id := p.key.Topic, int(p.key.Partition)
		req.Topics[t] = append(req.Topics[t], kafka.FirstOffsetOf(id), kafka.LastOffsetOf(id))
	}
	res, err := g.c.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make([]logBounds, len(parts))
	for i, p := range parts {
		found := false
		for _, po := range res.Topics[p.key.Topic] {
			if po.Partition != int(p.key.Partition) {
				continue
			}
			if po.Error != nil {
				return nil, fmt.Errorf("%s/%d: %w", p.key.Topic, p.key.Partition, po.Error)
			}
			if po.FirstOffset < 0 || po.LastOffset < po.FirstOffset {
				return nil, fmt.Errorf("%s/%d: invalid log bounds [%d, %d]", p.key.Topic, p.key.Partition, po.FirstOffset, po.LastOffset)
			}
			out[i] = logBounds{first: po.FirstOffset, last: po.LastOffset}
			found = true
		}
		if !found {
			return nil, fmt.Errorf("%s/%d: no offsets in the ListOffsets response", p.key.Topic, p.key.Partition)
		}
	}
	return out, nil
}

// setWatermark records a watermark decided by reconciliation or handling.
func (g *generation) setWatermark(p *assigned, wm int64) {
	if err := g.c.store.SetWatermark(p.key, wm, g.gen.ID, g.gen.MemberID); err != nil {
		g.log.Error("recording the watermark failed", zap.String("topic", p.key.Topic),
			zap.Int32("partition", p.key.Partition), zap.Int64("offset", wm), zap.Error(err))
	}
}

// commit sends the durable watermark of every started partition that
// differs from what Kafka last confirmed. Only durable (fsync-ed) offsets are
// ever committed, so Kafka's committed offset never passes the offset file.
func (g *generation) commit(reason string) {
	if g.fenced.Load() {
		return
	}
	g.confirmUnknown()
	offsets := map[string]map[int]int64{}
	var todo []*assigned
	for _, p := range g.parts {
		if !p.started {
			continue
		}
		rec, ok := g.c.store.Durable(p.key)
		if !ok || rec.Watermark < 0 || rec.Watermark == p.committed {
			continue
		}
		if offsets[p.key.Topic] == nil {
			offsets[p.key.Topic] = map[int]int64{}
		}
		offsets[p.key.Topic][int(p.key.Partition)] = rec.Watermark
		todo = append(todo, p)
	}
	if len(todo) == 0 {
		return
	}
	start := time.Now()
	if err := g.commitLedgered(offsets, todo); err != nil {
		for _, p := range todo {
			p.st.setCommitError(fmt.Errorf("commit (%s) of %s/%d: %w", reason, p.key.Topic, p.key.Partition, err))
		}
		if isFenced(err) {
			return
		}
		g.failures++
		if g.failures == 1 {
			g.failedFrom = start
		}
		if logWorthy(g.failures) || reason == "revoke" {
			g.log.Warn("commit failed; the offset file keeps the watermarks and the committer retries at the next interval",
				zap.String("reason", reason), zap.Int("failures_in_a_row", g.failures), zap.Any("offsets", offsets), zap.Error(err))
		}
		return
	}
	if g.failures > 0 {
		g.log.Info("commits succeed again", zap.Int("failed_in_a_row", g.failures),
			zap.Duration("outage", time.Since(g.failedFrom)), zap.Any("offsets", offsets))
		g.failures = 0
	}
	for _, p := range todo {
		p.st.setCommitError(nil)
	}
	g.log.Debug("committed", zap.String("reason", reason), zap.Int("partitions", len(todo)), zap.Duration("took", time.Since(start)))
}

// commitLedgered commits offsets (the watermarks of todo) and records the
// attempt in each partition's commit ledger: offset, generation, time,
// outcome and latency. A confirmed commit updates the partition's committed
// offset; an unknown outcome is kept to confirm at the next commit.
func (g *generation) commitLedgered(offsets map[string]map[int]int64, todo []*assigned) error {
	at := time.Now()
	err := g.commitOffsets(offsets)
	latency := time.Since(at)
	outcome := commitOutcome(err)
	for _, p := range todo {
		a := offsetstore.CommitAttempt{Offset: offsets[p.key.Topic][int(p.key.Partition)], Generation: g.gen.ID,
			At: at, Outcome: outcome, Latency: latency}
		if err != nil {
			a.Error = err.Error()
		}
		g.ledger(p, a)
		switch outcome {
		case offsetstore.CommitOK:
			p.committed = a.Offset
			p.st.committed.Store(a.Offset)
			p.unknown = nil
		case offsetstore.CommitUnknown:
			p.unknown = &a
		}
	}
	return err
}

func (g *generation) ledger(p *assigned, a offsetstore.CommitAttempt) {
	p.st.setLastCommit(a.Outcome.String())
	if err := g.c.store.SetCommitAttempt(p.key, a); err != nil {
		g.log.Warn("recording the commit attempt failed", zap.String("topic", p.key.Topic),
			zap.Int32("partition", p.key.Partition), zap.Error(err))
	}
}

// commitOutcome classifies a commit's error: a Kafka error code is a
// definite answer; anything else (timeout, connection lost) leaves the
// outcome unknown: the broker may have applied the commit.
func commitOutcome(err error) offsetstore.CommitOutcome {
	var kerr kafka.Error
	switch {
	case err == nil:
		return offsetstore.CommitOK
	case isFenced(err):
		return offsetstore.CommitFenced
	case errors.As(err, &kerr):
		return offsetstore.CommitError
	}
	return offsetstore.CommitUnknown
}

// confirmUnknown asks Kafka for the committed offsets of the partitions
// whose last commit had no answer, and records in the ledger whether it
// was applied. On failure it tries again at the next commit.
func (g *generation) confirmUnknown() {
	req := &kafka.OffsetFetchRequest{GroupID: g.c.cfg.GroupID, Topics: map[string][]int{}}
	var parts []*assigned
	for _, p := range g.parts {
		if p.unknown != nil {
			req.Topics[p.key.Topic] = append(req.Topics[p.key.Topic], int(p.key.Partition))
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	defer cancel()
	res, err := g.c.client.OffsetFetch(ctx, req)
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		g.log.Warn("confirming commits of unknown outcome failed; trying again at the next commit", zap.Error(err))
		return
	}
	for _, p := range parts {
		for _, po := range res.Topics[p.key.Topic] {
			if po.Partition != int(p.key.Partition) || po.Error != nil {
				continue
			}
			log := g.log.With(zap.String("topic", p.key.Topic), zap.Int32("partition", p.key.Partition))
			g.confirm(p, log, *p.unknown, po.CommittedOffset, "at the next commit")
			if po.CommittedOffset >= p.unknown.Offset {
				p.committed = po.CommittedOffset
				p.st.committed.Store(po.CommittedOffset)
			}
			p.unknown = nil
		}
	}
}

// confirm records in the ledger how the commit attempt a, whose outcome was
// unknown, turned out, given Kafka's committed offset now.
func (g *generation) confirm(p *assigned, log *zap.Logger, a offsetstore.CommitAttempt, committed int64, when string) {
	cause := a.Error
	if committed >= a.Offset {
		a.Outcome = offsetstore.CommitOK
		a.Error = fmt.Sprintf("confirmed applied %s: Kafka's committed offset is %d (the attempt had no answer: %s)", when, committed, cause)
		log.Info("a commit of unknown outcome was applied", zap.Int64("offset", a.Offset), zap.Int64("kafka_committed", committed), zap.String("when", when))
	} else {
		a.Outcome = offsetstore.CommitError
		a.Error = fmt.Sprintf("confirmed not applied %s: Kafka's committed offset is %d (the attempt had no answer: %s)", when, committed, cause)
		log.Info("a commit of unknown outcome was not applied; the committer sends it again", zap.Int64("offset", a.Offset),
			zap.Int64("kafka_committed", committed), zap.String("when", when))
	}
	g.ledger(p, a)
}

// commitOffsets commits with the generation's identity and classifies the
// error: a fenced commit ends committing for this generation.
func (g *generation) commitOffsets(offsets map[string]map[int]int64) error {
	err := g.gen.CommitOffsets(offsets)
	if err != nil && errors.Is(err, net.ErrClosed) {
		// kafka-go closes the generation's coordinator connection after a
		// timeout or a network error, and every later commit on it fails;
		// the generation is still valid at the broker until it ends there.
		// Commit through the Client instead, on a connection of its own,
		// with the same generation and member: the final commit on revoke
		// then still lands and the next owner starts where this one ended.
		if cerr := g.commitViaClient(offsets); cerr != nil {
			err = fmt.Errorf("%w; again on a new connection: %w", err, cerr)
		} else {
			g.log.Debug("committed on a new connection (the generation's coordinator connection is closed)")
			err = nil
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kafka.RebalanceInProgress):
		// The group is completing a rebalance: this generation is ending,
		// and the heartbeat will end it here too. Not marked fenced, so a
		// refusal that was not final is retried at the next interval.
		g.log.Info("commit refused: the group is rebalancing; the offset file keeps the watermarks", zap.Error(err))
	case isFenced(err):
		g.fenced.Store(true)
		g.log.Warn("commit fenced: the generation ended; the offset file keeps the watermarks and the next owner reconciles them",
			zap.Error(err))
	}
	return err
}

// commitViaClient commits offsets with kafka-go's Client (the Transport
// finds the coordinator and dials it anew) under this generation's
// identity.
func (g *generation) commitViaClient(offsets map[string]map[int]int64) error {
	req := &kafka.OffsetCommitRequest{GroupID: g.c.cfg.GroupID, GenerationID: int(g.gen.ID), MemberID: g.gen.MemberID,
		Topics: make(map[string][]kafka.OffsetCommit, len(offsets))}
	for t, ps := range offsets {
		for p, o := range ps {
			req.Topics[t] = append(req.Topics[t], kafka.OffsetCommit{Partition: p, Offset: o})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.c.cfg.Timeout)
	defer cancel()
	res, err := g.c.client.OffsetCommit(ctx, req)
	if err != nil {
		return err
	}
	for t, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return fmt.Errorf("%s/%d: %w", t, p.Partition, p.Error)
			}
		}
	}
	return nil
}

// isFenced reports a commit refused because the generation ended or is
// ending.
func isFenced(err error) bool {
	return errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.UnknownMemberId) ||
		errors.Is(err, kafka.RebalanceInProgress) || errors.Is(err, kafka.FencedInstanceID)
}

// logWorthy says whether the nth failure in a row is logged: the first
// three, then every power of two, so that hours of failures are a few
// dozen lines.
func logWorthy(n int) bool { return n <= 3 || n&(n-1) == 0 }

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
