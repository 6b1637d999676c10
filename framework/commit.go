package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// Committing is the last stage of the data path: the generation's goroutine
// commits the durable watermarks (never the processed ones) to Kafka every
// CommitInterval and at revoke, and records each attempt in the offset
// file's commit ledger.

// commit sends the durable watermark of every started partition that
// differs from what Kafka last confirmed. Only durable (fsync-ed) offsets are
// ever committed, so Kafka's committed offset never passes the offset file.
func (g *generation) commit(reason string) {
	if g.fenced.Load() {
		return
	}
	g.confirmUnknown()
	offsets := map[string]map[int]int64{}
	var todo []*partition
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
func (g *generation) commitLedgered(offsets map[string]map[int]int64, todo []*partition) error {
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

func (g *generation) ledger(p *partition, a offsetstore.CommitAttempt) {
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
	var parts []*partition
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
func (g *generation) confirm(p *partition, log *zap.Logger, a offsetstore.CommitAttempt, committed int64, when string) {
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
