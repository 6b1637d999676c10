package framework

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/wire"
)

// The changelog (Config.StateChangelog): every change of a TxHandler's
// partition P of topic T, once in the offset file (its outbox), is written
// to partition P of the compacted topic T+suffix, so that the next owner of
// P can restore the state (docs/state.md). The headers of each record:
const (
	// HeaderChangelogOffset is the source offset of the first message of
	// the run that made the change (decimal).
	HeaderChangelogOffset = "tidemark.offset"
	// HeaderChangelogEpoch is the writer's owner epoch: the changelog
	// offset of the marker it wrote when it started the partition.
	HeaderChangelogEpoch = "tidemark.epoch"
	// HeaderChangelogMarker marks an owner's start record (an empty key,
	// which no state key is): its value is the source offset the owner
	// resumes from (decimal).
	HeaderChangelogMarker = "tidemark.marker"
	// HeaderChangelogGroup is the group of a marker's owner: a changelog
	// holds one group's changes, and a restore that meets another
	// group's marker refuses the changelog (ErrChangelogOtherGroup).
	HeaderChangelogGroup = "tidemark.group"
)

// ErrChangelogOtherGroup is the error a partition stalls with when its
// changelog holds a marker of another consumer group: two groups writing
// one changelog would each restore the other's changes. Give each group a
// StateChangelog suffix of its own.
var ErrChangelogOtherGroup = errors.New("the changelog holds another consumer group's changes")

// changelog writes the outboxes of the owned partitions to their
// changelog partitions through one idempotent producer (InitProducerID:
// a producer id and epoch; a sequence number per partition), and gives
// the committer its cap: Kafka's committed offset of P never passes the
// first source offset of P's outbox. Its goroutine (run) sends; a restore
// (restore.go) writes its marker through it from the partition's start
// goroutine. mu guards the producer and the partitions' map; each
// partition's own mu orders its writes.
type changelog struct {
	cfg   *Config
	log   *zap.Logger
	cl    *cluster
	store *offsetfile.Store

	kick chan struct{}

	mu      sync.Mutex
	pid     int64 // -1 until InitProducerID answered
	pepoch  int16
	leaders map[string][]string // changelog topic: each partition's leader address
	parts   map[topicPartition]*logPartition
	// locks order the writes of each partition across its assignments:
	// a write of an earlier one still on its way ends before the next
	// one's marker; seqs go on across them too: a partition assigned
	// again under the same producer must not start its sequence over (the
	// broker would take the batch for a duplicate of an old one, answer
	// with that one's offset, and append nothing).
	locks map[topicPartition]*sync.Mutex
	seqs  map[topicPartition]*logSeq
}

// logSeq is a partition's next sequence number under producer pid.
type logSeq struct {
	pid int64
	seq int32
}

// logPartition is one owned partition's changelog writer state.
type logPartition struct {
	tp  topicPartition
	key offsetfile.Key

	lock *sync.Mutex // the partition's, from changelog.locks; guards the fields below
	// restoring caps its commits to none (read by the committer).
	restoring atomic.Bool
	// start is the source offset the owner resumes from: its marker's
	// value. epoch is the marker's changelog offset, -1 until written.
	start, epoch int64
	pos          offsetfile.ChangelogPosition
	// sq is the partition's sequence (changelog.seqs); inflight is a
	// batch sent without an answer, sent again as it was (same sequence).
	sq       *logSeq
	inflight []offsetfile.OutboxEntry
	// failing and retryAt say why the last write failed and when to try
	// again.
	failing error
	retryAt time.Time
	bo      backoff // RetryBackoff..MaxRetryBackoff between failed writes
	// emptyAt is the synced watermark at which the outbox was last found
	// empty: new entries come only with a checkpoint that moves it, so
	// the file is not read again until then.
	emptyAt int64
	// restored is the epoch of a restore (restore.go) whose run is not
	// yet seen durable, -1 when none: that run empties the outbox of the
	// file's earlier ownership, so until it is durable the file's outbox
	// holds changes that are not this owner's.
	restored int64
}

func newChangelog(cfg *Config, log *zap.Logger, cl *cluster, store *offsetfile.Store) *changelog {
	return &changelog{cfg: cfg, log: log.Named("changelog"), cl: cl, store: store, kick: make(chan struct{}, 1),
		pid: -1, leaders: map[string][]string{}, parts: map[topicPartition]*logPartition{},
		locks: map[topicPartition]*sync.Mutex{}, seqs: map[topicPartition]*logSeq{}}
}

// topic is the changelog topic of the consumed topic t.
func (c *changelog) topic(t string) string { return t + c.cfg.StateChangelog }

// maxLogBatch bounds the outbox entries of one Produce.
const maxLogBatch = 500

// assigned registers tp, which resumes at start; restoring holds its
// commits until restored (restore.go). The marker is written before any
// of its changes.
func (c *changelog) assigned(tp topicPartition, start int64, restoring bool) *logPartition {
	lp := &logPartition{tp: tp, key: storeKey(c.cfg.GroupID, tp), start: start, epoch: -1,
		bo: newBackoff(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff), emptyAt: -2, restored: -1}
	lp.restoring.Store(restoring)
	pos, err := c.store.ChangelogPosition(lp.key)
	if err != nil {
		c.log.Warn("reading the changelog position failed; a restore reads from the log start", zap.String("topic", tp.topic),
			zap.Int32("partition", tp.partition), zap.Error(err))
		pos = offsetfile.NoChangelogPosition()
	}
	lp.pos = pos
	c.mu.Lock()
	if c.locks[tp] == nil {
		c.locks[tp], c.seqs[tp] = &sync.Mutex{}, &logSeq{pid: -1}
	}
	lp.lock, lp.sq = c.locks[tp], c.seqs[tp]
	c.parts[tp] = lp
	c.mu.Unlock()
	return lp
}

// released forgets tp: its outbox stays in the file, for its next start
// here.
func (c *changelog) released(tp topicPartition) {
	c.mu.Lock()
	lp := c.parts[tp]
	delete(c.parts, tp)
	pid := c.pid
	c.mu.Unlock()
	if lp == nil {
		return
	}
	lp.lock.Lock()
	defer lp.lock.Unlock()
	if lp.inflight != nil {
		// A batch without an answer that nobody sends again as it was:
		// its sequence numbers are not reused by another batch.
		c.resetProducer(pid)
	}
}

func (c *changelog) part(tp topicPartition) *logPartition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parts[tp]
}

// capFor is the committer's cap: the highest offset Kafka may hold as
// committed for k, given what the changelog acknowledged: below the
// oldest change not yet acknowledged; none while the partition restores.
func (c *changelog) capFor(k offsetfile.Key) int64 {
	if lp := c.part(topicPartition{k.Topic, k.Partition}); lp != nil && lp.restoring.Load() {
		return -1
	}
	off, ok, err := c.store.OutboxOldest(k)
	switch {
	case err != nil:
		return -1
	case ok:
		return off
	}
	return math.MaxInt64
}

// run sends the owned partitions' outboxes until ctx ends. Run starts it
// and waits for it.
func (c *changelog) run(ctx context.Context) {
	every := min(max(c.cfg.FlushInterval, 5*time.Millisecond), 50*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
		}
		c.mu.Lock()
		parts := make([]*logPartition, 0, len(c.parts))
		for _, lp := range c.parts {
			parts = append(parts, lp)
		}
		c.mu.Unlock()
		for _, lp := range parts {
			if ctx.Err() != nil {
				return
			}
			if !lp.restoring.Load() && lp.lock.TryLock() { // a restore or a revoke's flush holds it: their turn
				_ = c.sendLocked(ctx, lp, false)
				lp.lock.Unlock()
			}
		}
	}
}

// flush sends what the outboxes of tps hold, until they are empty or ctx
// ends: a revoke calls it before its final commit, so that the commit
// reaches the watermark.
func (c *changelog) flush(ctx context.Context, tps []topicPartition) {
	for _, tp := range tps {
		lp := c.part(tp)
		if lp == nil {
			continue
		}
		for ctx.Err() == nil && !lp.restoring.Load() {
			if _, ok, err := c.store.OutboxOldest(lp.key); err != nil || !ok {
				break
			}
			lp.lock.Lock()
			err := c.sendLocked(ctx, lp, true)
			lp.lock.Unlock()
			if err != nil && !sleep(ctx, 20*time.Millisecond) {
				break
			}
		}
	}
}

// sendLocked writes lp's marker if it has none yet, then the oldest
// entries of its outbox, and records what the changelog acknowledged;
// lp.lock is held. now ignores the retry backoff.
func (c *changelog) sendLocked(ctx context.Context, lp *logPartition, now bool) error {
	if lp.restoring.Load() || c.part(lp.tp) != lp || (!now && time.Now().Before(lp.retryAt)) {
		return nil // restoring, or of an assignment that ended
	}
	err := c.writeLocked(ctx, lp)
	if err != nil && ctx.Err() == nil {
		if lp.failing == nil {
			c.log.Warn("changelog write failed; the outbox keeps the changes and Kafka's commit waits for them",
				zap.String("changelog", c.topic(lp.tp.topic)), zap.Int32("partition", lp.tp.partition), zap.Error(err))
		}
		lp.failing, lp.retryAt = err, time.Now().Add(lp.bo.next())
		return err
	}
	if lp.failing != nil && err == nil {
		c.log.Info("changelog writes succeed again", zap.String("changelog", c.topic(lp.tp.topic)), zap.Int32("partition", lp.tp.partition))
		lp.failing = nil
		lp.bo.reset()
	}
	return err
}

func (c *changelog) writeLocked(ctx context.Context, lp *logPartition) error {
	if lp.epoch < 0 {
		if err := c.markLocked(ctx, lp); err != nil {
			return err
		}
	}
	entries := lp.inflight
	if entries == nil && lp.restored >= 0 {
		// Sent now, the earlier ownership's unacknowledged changes would
		// go out with this owner's epoch, and a later restore would count
		// them over every change in between.
		pos, err := c.store.ChangelogPosition(lp.key)
		if err != nil {
			return err
		}
		if pos.Epoch != lp.restored {
			return nil // the restore is not durable yet
		}
		lp.restored = -1
	}
	if entries == nil {
		// Synced before the outbox: a checkpoint between the two is
		// read again at the next round.
		synced, _ := c.store.Synced(lp.key)
		if synced.Watermark == lp.emptyAt {
			return nil
		}
		var err error
		if entries, err = c.store.Outbox(lp.key, maxLogBatch); err != nil {
			return err
		}
		if len(entries) == 0 {
			lp.emptyAt = synced.Watermark
			return nil
		}
		lp.emptyAt = -2
	}
	recs := make([]logRecord, len(entries))
	for i, e := range entries {
		recs[i] = logRecord{key: e.Key, value: e.Value, del: e.Delete, src: e.Offset, epoch: lp.epoch}
	}
	lp.inflight = entries
	base, err := c.produceLocked(ctx, lp, recs)
	if err != nil {
		return err
	}
	lp.inflight = nil
	last := entries[len(entries)-1]
	if base < lp.pos.Next {
		// Below this owner's own last write: the broker took the batch
		// for a duplicate of an earlier one. Not acknowledged: sent
		// again by a new producer.
		c.mu.Lock()
		pid := c.pid
		c.mu.Unlock()
		c.resetProducer(pid)
		return fmt.Errorf("changelog %s/%d: a batch answered at offset %d, below this owner's last write's end %d (taken for a duplicate)",
			c.topic(lp.tp.topic), lp.tp.partition, base, lp.pos.Next)
	}
	if base != lp.pos.Next {
		// Someone else wrote in between: this file's state is no longer
		// the changelog's (restore.go trusts it no more).
		lp.pos.Gap = true
	}
	lp.pos.Next, lp.pos.Acked = base+int64(len(entries)), last.Offset
	return c.store.AckOutbox(lp.key, last.Seq, lp.pos)
}

// markLocked writes lp's marker and waits for it: its changelog offset is
// the owner's epoch from now on.
func (c *changelog) markLocked(ctx context.Context, lp *logPartition) error {
	base, err := c.produceLocked(ctx, lp, []logRecord{{marker: true, src: lp.start, group: c.cfg.GroupID}})
	if err != nil {
		return fmt.Errorf("the owner's marker: %w", err)
	}
	lp.epoch = base
	lp.pos.Markers = append(slices.Clip(lp.pos.Markers), offsetfile.ChangelogMarker{Epoch: base, Start: lp.start})
	if base != lp.pos.Next {
		lp.pos.Gap = true
	}
	lp.pos.Epoch, lp.pos.Start, lp.pos.Next = base, lp.start, base+1
	return nil
}

// logRecord is one changelog record to write: a change, or a marker.
type logRecord struct {
	key, value []byte
	del        bool
	marker     bool
	group      string // a marker's
	src, epoch int64
}

// produceLocked writes recs as one idempotent batch to lp's changelog
// partition and returns its base offset. A write without an answer is
// sent again with the same sequence (the broker drops a duplicate); a
// producer the broker no longer knows is replaced.
func (c *changelog) produceLocked(ctx context.Context, lp *logPartition, recs []logRecord) (int64, error) {
	topic := c.topic(lp.tp.topic)
	pid, pepoch, err := c.producer(ctx)
	if err != nil {
		return 0, err
	}
	if lp.sq.pid != pid {
		lp.sq.pid, lp.sq.seq = pid, 0
	}
	addr, err := c.leader(ctx, topic, lp.tp.partition)
	if err != nil {
		return 0, err
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, int32(c.cfg.Timeout/time.Millisecond)
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition = lp.tp.partition
	rp.Records = encodeLogBatch(time.Now(), pid, pepoch, lp.sq.seq, recs)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	msg, err := c.cl.client.At(rctx, addr, req, c.cfg.Timeout)
	if err != nil {
		c.forget(topic)
		return 0, fmt.Errorf("%s/%d: %w", topic, lp.tp.partition, err)
	}
	for _, t := range msg.(*kmsg.ProduceResponse).Topics {
		for _, p := range t.Partitions {
			if p.Partition != lp.tp.partition {
				continue
			}
			werr := wire.Error(p.ErrorCode)
			switch {
			case werr == nil:
				lp.sq.seq += int32(len(recs))
				return p.BaseOffset, nil
			case errors.Is(werr, kafka.OutOfOrderSequenceNumber), errors.Is(werr, kafka.UnknownProducerId),
				errors.Is(werr, kafka.InvalidProducerEpoch):
				// The broker lost this producer's state (or its
				// retention dropped it): a new producer, its
				// sequences from 0.
				c.resetProducer(pid)
			case errors.Is(werr, kafka.DuplicateSequenceNumber):
				c.resetProducer(pid)
			default:
				c.forget(topic)
			}
			return 0, fmt.Errorf("%s/%d: %w", topic, lp.tp.partition, werr)
		}
	}
	return 0, fmt.Errorf("%s/%d: no answer for the partition", topic, lp.tp.partition)
}

// producer returns the idempotent producer's id and epoch, asking a
// broker for them (InitProducerID without a transactional id) the first
// time.
func (c *changelog) producer(ctx context.Context) (int64, int16, error) {
	c.mu.Lock()
	pid, epoch := c.pid, c.pepoch
	c.mu.Unlock()
	if pid >= 0 {
		return pid, epoch, nil
	}
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionTimeoutMillis = math.MaxInt32
	res, err := c.any(ctx, req, 1)
	if err != nil {
		return 0, 0, fmt.Errorf("InitProducerID: %w", err)
	}
	r := res.(*kmsg.InitProducerIDResponse)
	if err := wire.Error(r.ErrorCode); err != nil {
		return 0, 0, fmt.Errorf("InitProducerID: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pid < 0 {
		c.pid, c.pepoch = r.ProducerID, r.ProducerEpoch
	}
	return c.pid, c.pepoch, nil
}

// resetProducer drops producer pid, so that the next write asks for a new
// one.
func (c *changelog) resetProducer(pid int64) {
	c.mu.Lock()
	if c.pid == pid {
		c.pid = -1
	}
	c.mu.Unlock()
}

// leader returns the address of the leader of topic's partition, from a
// cache.
func (c *changelog) leader(ctx context.Context, topic string, partition int32) (string, error) {
	c.mu.Lock()
	leaders := c.leaders[topic]
	c.mu.Unlock()
	if leaders == nil {
		md, err := c.cl.metadata(ctx, []string{topic})
		if err != nil {
			return "", err
		}
		brokers := map[int32]string{}
		for _, b := range md.Brokers {
			brokers[b.NodeID] = wire.Addr(b)
		}
		for _, t := range md.Topics {
			if t.Topic == nil || *t.Topic != topic {
				continue
			}
			if err := wire.Error(t.ErrorCode); err != nil {
				return "", fmt.Errorf("metadata of changelog %q: %w", topic, err)
			}
			leaders = make([]string, len(t.Partitions))
			for _, p := range t.Partitions {
				if p.Partition >= 0 && int(p.Partition) < len(leaders) {
					leaders[p.Partition] = brokers[p.Leader]
				}
			}
		}
		if leaders == nil {
			return "", fmt.Errorf("metadata of changelog %q: not in the response", topic)
		}
		c.mu.Lock()
		c.leaders[topic] = leaders
		c.mu.Unlock()
	}
	if int(partition) >= len(leaders) || leaders[partition] == "" {
		c.forget(topic)
		return "", fmt.Errorf("changelog %s/%d: %w", topic, partition, kafka.LeaderNotAvailable)
	}
	return leaders[partition], nil
}

func (c *changelog) forget(topic string) {
	c.mu.Lock()
	delete(c.leaders, topic)
	c.mu.Unlock()
}

// encodeLogBatch encodes recs as one uncompressed v2 record batch of
// producer pid at epoch, its first sequence seq.
func encodeLogBatch(ts time.Time, pid int64, epoch int16, seq int32, recs []logRecord) []byte {
	var body []byte
	for i, r := range recs {
		rec := kmsg.Record{OffsetDelta: int32(i)}
		if r.marker {
			rec.Key = []byte{}
			rec.Value = strconv.AppendInt(nil, r.src, 10)
			rec.Headers = []kmsg.Header{{Key: HeaderChangelogMarker, Value: rec.Value}, {Key: HeaderChangelogGroup, Value: []byte(r.group)}}
		} else {
			rec.Key = r.key
			if !r.del {
				rec.Value = r.value
				if rec.Value == nil {
					rec.Value = []byte{}
				}
			}
			rec.Headers = []kmsg.Header{
				{Key: HeaderChangelogOffset, Value: strconv.AppendInt(nil, r.src, 10)},
				{Key: HeaderChangelogEpoch, Value: strconv.AppendInt(nil, r.epoch, 10)},
			}
		}
		rec.Length = int32(len(rec.AppendTo(nil)) - 1)
		body = rec.AppendTo(body)
	}
	ms := ts.UnixMilli()
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, FirstTimestamp: ms, MaxTimestamp: ms,
		ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq,
		LastOffsetDelta: int32(len(recs) - 1), NumRecords: int32(len(recs)), Records: body,
	}
	out := b.AppendTo(nil)
	// The length counts what follows it; the CRC what follows it, from
	// the attributes on.
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32c))
	return out
}

// errChangelogTopic marks a changelog topic Run refuses.
var errChangelogTopic = errors.New("changelog topic refused")

// check makes sure, before the first join, that each consumed topic's
// changelog exists, compacted, with the consumed topic's partition count:
// a missing one is created so; a present one with another count, or not
// compacted, ends Run with an error naming it. While Kafka cannot be
// reached it retries, until ctx ends. A consumed topic that does not
// exist yet is checked when it appears (at its first assignment).
func (c *changelog) check(ctx context.Context) error {
	bo := newBackoff(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff)
	for {
		err := c.checkOnce(ctx)
		if err == nil || errors.Is(err, errChangelogTopic) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("checking the changelog topics failed; retrying", zap.Error(err))
		if !sleep(ctx, bo.next()) {
			return nil
		}
	}
}

func (c *changelog) checkOnce(ctx context.Context) error {
	var names []string
	for _, t := range c.cfg.Topics {
		names = append(names, t, c.topic(t))
	}
	md, err := c.cl.metadata(ctx, names)
	if err != nil {
		return err
	}
	counts := map[string]int{}
	for _, t := range md.Topics {
		if t.Topic != nil && t.ErrorCode == 0 {
			counts[*t.Topic] = len(t.Partitions)
		}
	}
	var create []string
	for _, t := range c.cfg.Topics {
		n, ok := counts[t]
		if !ok {
			continue // consumed once it exists; its changelog is checked then
		}
		lt := c.topic(t)
		m, ok := counts[lt]
		switch {
		case !ok:
			create = append(create, t)
		case m != n:
			return fmt.Errorf("tidemark: %w: changelog topic %q of %q has %d partitions, %q has %d: partition P's state is written to partition P, "+
				"so the counts must be equal (delete it, or choose another StateChangelog suffix)", errChangelogTopic, lt, t, m, t, n)
		}
	}
	if err := c.compacted(ctx, counts); err != nil {
		return err
	}
	for _, t := range create {
		if err := c.create(ctx, c.topic(t), counts[t]); err != nil {
			return err
		}
	}
	return nil
}

// compacted refuses an existing changelog topic whose cleanup.policy is
// not "compact": "delete" would drop old changes, so that a restore misses
// them; "compact,delete" likewise.
func (c *changelog) compacted(ctx context.Context, counts map[string]int) error {
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range c.cfg.Topics {
		if _, ok := counts[c.topic(t)]; !ok {
			continue
		}
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, c.topic(t)
		r.ConfigNames = []string{"cleanup.policy"}
		req.Resources = append(req.Resources, r)
	}
	if len(req.Resources) == 0 {
		return nil
	}
	res, err := c.any(ctx, req, 1)
	if err != nil {
		return fmt.Errorf("DescribeConfigs of the changelog topics: %w", err)
	}
	for _, r := range res.(*kmsg.DescribeConfigsResponse).Resources {
		if err := wire.Error(r.ErrorCode); err != nil {
			return fmt.Errorf("DescribeConfigs of changelog topic %q: %w", r.ResourceName, err)
		}
		policy := "delete" // Kafka's default
		for _, cf := range r.Configs {
			if cf.Name == "cleanup.policy" && cf.Value != nil {
				policy = *cf.Value
			}
		}
		if policy != "compact" {
			return fmt.Errorf("tidemark: %w: changelog topic %q has cleanup.policy %q, not \"compact\": old changes would be deleted and a restore would miss them "+
				"(set cleanup.policy=compact on it, or delete it and let Run create it)", errChangelogTopic, r.ResourceName, policy)
		}
	}
	return nil
}

// create creates the changelog topic lt, compacted, with n partitions and
// the brokers' default replication.
func (c *changelog) create(ctx context.Context, lt string, n int) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = int32(c.cfg.Timeout / time.Millisecond)
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = lt, int32(n), -1
	cf := kmsg.NewCreateTopicsRequestTopicConfig()
	cf.Name, cf.Value = "cleanup.policy", kmsg.StringPtr("compact")
	rt.Configs = append(rt.Configs, cf)
	req.Topics = append(req.Topics, rt)
	res, err := c.any(ctx, req, 4)
	if err != nil {
		return fmt.Errorf("creating changelog topic %q: %w", lt, err)
	}
	for _, t := range res.(*kmsg.CreateTopicsResponse).Topics {
		if err := wire.Error(t.ErrorCode); err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("creating changelog topic %q: %w", lt, err)
		}
	}
	c.log.Info("changelog topic created", zap.String("changelog", lt), zap.Int("partitions", n), zap.String("cleanup.policy", "compact"))
	return nil
}

// any sends req at version v to the first seed broker that answers.
// CreateTopics must reach the controller: Kafka forwards it from any
// broker since 2.8 (KIP-590).
func (c *changelog) any(ctx context.Context, req kmsg.Request, v int16) (kmsg.Response, error) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, addr := range c.cfg.Brokers {
		res, err := c.cl.client.AtVersion(rctx, addr, req, v, c.cfg.Timeout)
		if err == nil {
			return res, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}
