package framework

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/internal/offsetfile"
	recon "github.com/tidemark/tidemark/internal/reconcile"
)

// Reconciliation runs when the group assigns partitions to this consumer,
// before any is fetched: the offset file and Kafka's committed offset are compared and
// each partition's starting position decided (see reconcile; the decision
// itself is package internal/reconcile, which tidemark diff runs too).

// reconcile decides where each partition resumes, comparing the offset
// file's durable watermark L with Kafka's committed offset C and the log's
// bounds (bounds[i] is parts[i]'s). It returns the start offset of every
// partition that may run; a partition stalled by policy is left out.
// commit reports a decided position Kafka does not hold yet, back a
// watermark moved below the file's. What it decided is queued in the
// offset file: persist makes it durable, before any message is handled.
func (a *assignment) reconcile(ctx context.Context, parts []*partition, bounds []logBounds) (starts map[int]int64, commit, back bool) {
	starts = make(map[int]int64, len(parts))
	cases := newCaseLog(a.log)
	defer cases.write()
	for i, p := range parts {
		b := bounds[i]
		log := partitionLog{a.log, p.tp}
		L := int64(-1)
		rec, ok := a.store.Durable(p.key)
		if ok && rec.Watermark >= 0 {
			L = rec.Watermark
		}
		C := p.kafkaOffset
		// K is the last offset Kafka confirmed for the group, from the
		// commit ledger (a commit of unknown outcome is not confirmed).
		K := rec.Committed
		if last := rec.LastCommit; last != nil && last.Outcome == offsetfile.CommitUnknown {
			a.committer.confirm(p, log.get(), *last, C, "at startup")
		}
		d := recon.Decide(recon.Input{Local: L, Confirmed: K, Kafka: C, First: b.first, Last: b.last, Stable: b.stable,
			StartLatest: a.startsAtEnd(p.tp), OutOfRange: recon.Policy(a.cfg.OutOfRange)})
		// The case first, then what the policy did with it.
		chosen := d.Chosen
		cases.add(d.Case, p.tp, L, C, chosen)
		// Any reset moved the position by policy. The file's completed
		// ranges then describe another log (a recreated topic) or offsets
		// the log no longer holds: they are never restored, even where the
		// reset's target equals the old watermark (d.Restore says so).
		for _, r := range d.Resets {
			p.recordReset(&reset{from: r.From, to: r.To, first: b.first, last: b.last, reason: r.Reason})
			if r.Baseline >= 0 {
				// Kafka holds C: that is the ledger's baseline from now on.
				if err := a.store.SetCommitted(p.key, r.Baseline); err != nil {
					log.get().Error("recording Kafka's committed offset failed", zap.Error(err))
				}
			}
		}
		// With a changelog a state behind Kafka's committed offset is
		// restored (restore.go) before the partition runs at C: the
		// watermark moves with the restored state, not here.
		restore, rebuild := false, false
		if err := a.stateFollows(p.tp, L, C, d); err != nil && a.changelog != nil && !d.Reset() && d.Start == C {
			restore = true
		} else if err != nil && a.cfg.StateRebuild && !d.Reset() {
			rebuild = true
		} else if err != nil {
			log.get().Error("partition stalled: its state would miss or repeat messages", zap.Int64("local", L),
				zap.Int64("kafka_committed", C), zap.Int64("start", d.Start), zap.Error(err))
			p.st.setError(err)
			p.st.setState(StateStalled)
			continue
		}
		if s := d.Stall; s != nil {
			log := log.get()
			err := stallError(p.tp, s.From, b.first, b.last, s.Reason)
			if s.MovedBack {
				log.Error("partition stalled: committed offset moved back", zap.Int64("local", L), zap.Int64("kafka_committed", C),
					zap.Int64("confirmed", K), zap.String("policy", a.cfg.OutOfRange.String()), zap.String("reason", s.Reason))
			} else {
				log.Error("partition stalled: position out of range", zap.Int64("from", s.From), zap.Int64("log_start", b.first),
					zap.Int64("log_end", b.last), zap.String("policy", a.cfg.OutOfRange.String()))
			}
			p.st.setError(err)
			p.st.setState(StateStalled)
			continue
		}
		start := d.Start
		switch {
		case restore:
		case rebuild:
			start = b.first
			if err := a.rebuildState(ctx, p, log.get(), L, C, start); err != nil {
				p.st.setError(err)
				p.st.setState(StateStalled)
				continue
			}
			back = true
		case d.SetWatermark:
			a.setWatermark(p, start)
			back = back || (rec.Watermark >= 0 && start < rec.Watermark)
		default:
			// The file is current: what it records as completed above its
			// watermark is not handled again.
			p.restored = rec.Completed
		}
		if !d.Reset() && start == C && !rebuild {
			// The previous owner's commit carries what it completed above
			// C (handoff.go): not handled again either.
			p.restored = a.handedOver(p, log, C, p.restored)
		}
		starts[i] = start
		// Kafka's offset moves back only where this run decided so (a
		// reset); while the state is rebuilt from the log start, never.
		if floor := max(C, 0); start < floor && !rebuild {
			p.commitFloor.Store(start)
		} else {
			p.commitFloor.Store(floor)
		}
		// The log's bounds are shown at once: the partition may be
		// fetched before persist (assignment.start).
		p.st.hwm.Store(b.last)
		if a.cfg.IsolationLevel == kafka.ReadCommitted {
			p.st.rare().lso.Store(b.stable)
		}
		if start >= L {
			// Shown before the flush makes it durable, so that Stats never
			// sees durable above processed; a start below the file's
			// watermark (a reset back) waits for publish.
			p.st.processed.Store(start)
		}
		commit = commit || d.Commit
	}
	return starts, commit, back
}

// persist makes what reconcile decided durable, with the runs' records
// (openRuns), in one write before any message is handled; Stats shows the
// positions after it. Kafka gets what reconciliation decided from a
// committer round the caller asks for once the partitions run: the round
// checkpoints first, and at 10,000 partitions a checkpoint and a commit
// before the start took 0.13 s.
func (a *assignment) persist(ctx context.Context, parts []*partition, starts map[int]int64, back bool) {
	a.openRuns(parts, starts)
	fctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	var err error
	if back {
		// A watermark moved below the checkpoint's: checkpointed at once,
		// so that Stats never shows synced above durable.
		err = a.store.Sync(fctx)
	} else {
		err = a.store.Flush(fctx)
	}
	cancel()
	if err != nil {
		a.log.Warn("flushing reconciled positions failed; the committer commits them once durable", zap.Error(err))
	}
	a.publish(parts, starts)
}

// publish shows the reconciled positions in Stats: processed is the start,
// committed is Kafka's committed offset (shown once the file's checkpoint
// reaches it: see partitionStats.snapshot).
func (a *assignment) publish(parts []*partition, starts map[int]int64) {
	for i, p := range parts {
		start, ok := starts[i]
		if !ok {
			continue
		}
		p.st.committed.Store(p.kafkaOffset)
		p.st.processed.Store(start)
	}
}

// partitionLog makes one partition's logger when reconciliation writes a
// line about it: most partitions get none (caseLog gathers the common ones).
type partitionLog struct {
	base *zap.Logger
	tp   topicPartition
}

func (l partitionLog) get() *zap.Logger {
	return l.base.With(zap.String("topic", l.tp.topic), zap.Int32("partition", l.tp.partition))
}

// caseLog gathers what reconciliation found per partition, by case, and
// logs a line per partition for up to caseLogEach partitions of a case, a
// line per case beyond: at 10,000 partitions, a line each took longer than
// the rest of the reconciliation. Only the cases at a level the logger
// writes are gathered.
type caseLog struct {
	log *zap.Logger
	by  map[recon.Case][]caseEntry
}

func newCaseLog(log *zap.Logger) caseLog {
	return caseLog{log: log, by: map[recon.Case][]caseEntry{}}
}

type caseEntry struct {
	tp                   topicPartition
	local, kafka, resume int64
}

const caseLogEach = 10

// caseLines is each case's level and message.
var caseLines = map[recon.Case]struct {
	level zapcore.Level
	msg   string
}{
	recon.NoPosition: {zapcore.InfoLevel, "no position in the offset file or Kafka; starting at StartOffset"},
	recon.LocalAhead: {zapcore.InfoLevel, "offset file ahead of Kafka (a commit was late, failed or not yet made); committing the local watermark"},
	recon.Agree:      {zapcore.DebugLevel, "offset file and Kafka agree"},
	recon.FirstTime:  {zapcore.InfoLevel, "no position in the offset file (first time here); resuming at Kafka's committed offset"},
	recon.KafkaAhead: {zapcore.WarnLevel, "Kafka ahead of the offset file (another member went further); resuming at Kafka's committed offset"},
}

func (c caseLog) add(k recon.Case, tp topicPartition, local, kafka, resume int64) {
	if line, ok := caseLines[k]; ok && c.log.Core().Enabled(line.level) {
		c.by[k] = append(c.by[k], caseEntry{tp, local, kafka, resume})
	}
}

func (c caseLog) write() {
	log := c.log
	for k, entries := range c.by {
		line := caseLines[k]
		if len(entries) <= caseLogEach {
			for _, e := range entries {
				log.Log(line.level, line.msg, zap.String("topic", e.tp.topic), zap.Int32("partition", e.tp.partition),
					zap.Int64("local", e.local), zap.Int64("kafka_committed", e.kafka), zap.Int64("resume", e.resume))
			}
			continue
		}
		tps := make([]topicPartition, len(entries))
		lo, hi := entries[0].resume, entries[0].resume
		for i, e := range entries {
			tps[i] = e.tp
			lo, hi = min(lo, e.resume), max(hi, e.resume)
		}
		log.Log(line.level, line.msg, zap.Int("partitions", len(entries)), zap.String("which", partitionList(tps, 2000)),
			zap.Int64("resume_min", lo), zap.Int64("resume_max", hi))
	}
}

// partitionList writes tps as "topic: 0-4, 7; other: 1", at most about
// limit bytes (then "...").
func partitionList(tps []topicPartition, limit int) string {
	slices.SortFunc(tps, func(a, b topicPartition) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	var b strings.Builder
	for i := 0; i < len(tps); {
		if b.Len() > limit {
			b.WriteString(" ...")
			break
		}
		t := tps[i].topic
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(t + ":")
		sep := " "
		for i < len(tps) && tps[i].topic == t {
			j := i
			for j+1 < len(tps) && tps[j+1].topic == t && tps[j+1].partition == tps[j].partition+1 {
				j++
			}
			if j > i {
				fmt.Fprintf(&b, "%s%d-%d", sep, tps[i].partition, tps[j].partition)
			} else {
				fmt.Fprintf(&b, "%s%d", sep, tps[i].partition)
			}
			sep = ", "
			i = j + 1
		}
	}
	return b.String()
}

// stateFollows returns why a TxHandler's partition must not start where d
// says, nil if it may: its state in the file is as of the file's watermark
// L, so it may resume at L only, or anywhere the first time the group
// consumes it (neither the file nor Kafka has a position). Starting
// anywhere else applies to the state the messages between a second time (a
// move back) or never (a move forward: another member handled them, or a
// reset skipped them).
// rebuildState empties p's state and moves its watermark to start (the
// log's first offset), in one transaction (Config.StateRebuild): the
// partition is handled again from there, and nothing below Kafka's
// committed offset C is committed (reconcile sets p.commitFloor).
func (a *assignment) rebuildState(ctx context.Context, p *partition, log *zap.Logger, L, C, start int64) error {
	st, err := a.store.BeginState(p.key)
	if err != nil {
		return fmt.Errorf("tidemark: %s/%d: rebuilding the state: %w", p.tp.topic, p.tp.partition, err)
	}
	defer st.Discard()
	var keys [][]byte
	if err := st.ForEach(func(k, _ []byte) error { keys = append(keys, slices.Clone(k)); return nil }); err != nil {
		return fmt.Errorf("tidemark: %s/%d: rebuilding the state: %w", p.tp.topic, p.tp.partition, err)
	}
	for _, k := range keys {
		if err := st.Delete(k); err != nil {
			return fmt.Errorf("tidemark: %s/%d: rebuilding the state: %w", p.tp.topic, p.tp.partition, err)
		}
	}
	if err := st.Commit(ctx, start, p.gen, p.member); err != nil {
		return fmt.Errorf("tidemark: %s/%d: rebuilding the state: %w", p.tp.topic, p.tp.partition, err)
	}
	p.st.rare().rebuilds.Add(1)
	lvl := log.Info
	if start > 0 {
		lvl = log.Warn // the log no longer holds its first records
	}
	lvl("rebuilding the partition's state from the log start (StateRebuild)", zap.Int64("local", L), zap.Int64("kafka_committed", C),
		zap.Int64("log_start", start), zap.Int("keys_dropped", len(keys)),
		zap.Bool("complete", start == 0))
	return nil
}

func (a *assignment) stateFollows(tp topicPartition, L, C int64, d recon.Decision) error {
	if a.cfg.TxHandler == nil || d.Stall != nil {
		return nil
	}
	switch {
	case d.Reset():
	case L < 0 && C < 0:
		return nil // the partition's first start anywhere: the state starts empty
	case L >= 0 && d.Start == L:
		return nil
	}
	return fmt.Errorf("tidemark: %s/%d: the offset file's state is as of offset %d, but the partition would resume at %d "+
		"(Kafka's committed offset %d: another member handled it, or its offsets were reset or expired); "+
		"a TxHandler's state would miss or repeat the messages between, so the partition is stalled: "+
		"see docs/state.md", tp.topic, tp.partition, L, d.Start, C)
}
