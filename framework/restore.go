package framework

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/wire"
)

// Restore: a partition's start with a changelog. Before its first fetch,
// its start goroutine (start) decides whether the offset file's state can
// be trusted, writes the owner's marker (its epoch), restores the state
// from the changelog when it must, and only then runs the partition.
//
// The fencing rule (fenced): a changelog holds the writes of every owner
// the partition had. Each owner writes a marker before its changes; the
// marker's changelog offset is its epoch, carried by each of its records,
// and its value is the source offset the owner resumed from. A change
// record R of epoch e at changelog offset x with source offset s counts
// toward the state as of Kafka's committed offset C when s < C and no
// marker M of a later owner (M.epoch > e) either precedes R (M.epoch < x:
// R is a zombie's write, made after its successor started) or starts at or
// below s (M.start <= s: the owner crashed after writing changes that its
// successor handles again). Every legitimate change below a successor's
// start precedes its marker: the committer commits C only once every
// change below C is acknowledged, and the successor reads C before it
// writes its marker.

// logEntry is one changelog record as the restore reads it.
type logEntry struct {
	at     int64 // its changelog offset
	marker bool
	start  int64  // a marker's start
	group  string // a marker's group; empty in markers before the header
	epoch  int64  // a change's owner epoch
	src    int64  // a change's source offset
	key    []byte
	value  []byte
	del    bool
}

// fenced reports whether change r is ignored, given the markers (sorted by
// epoch) of the changelog.
func fenced(r logEntry, markers []offsetfile.ChangelogMarker) bool {
	i, _ := slices.BinarySearchFunc(markers, r.epoch+1, func(m offsetfile.ChangelogMarker, e int64) int {
		return int(min(max(m.Epoch-e, -1), 1))
	})
	for _, m := range markers[i:] {
		if m.Epoch < r.at || m.Start <= r.src {
			return true
		}
	}
	return false
}

// restoreMarkers returns the markers known before recs (earlier) and
// those among them, sorted by epoch, each once.
func restoreMarkers(earlier []offsetfile.ChangelogMarker, recs []logEntry) []offsetfile.ChangelogMarker {
	markers := slices.Clone(earlier)
	for _, r := range recs {
		if r.marker {
			markers = append(markers, offsetfile.ChangelogMarker{Epoch: r.at, Start: r.start})
		}
	}
	slices.SortFunc(markers, func(a, b offsetfile.ChangelogMarker) int { return int(min(max(a.Epoch-b.Epoch, -1), 1)) })
	return slices.CompactFunc(markers, func(a, b offsetfile.ChangelogMarker) bool { return a.Epoch == b.Epoch })
}

// counts reports whether changelog record r is a change that counts toward
// the state as of committed offset cut, given the markers
// (restoreMarkers). Applied in changelog order, the changes that count
// give each key its value as of cut.
func counts(r logEntry, markers []offsetfile.ChangelogMarker, cut int64) bool {
	return !r.marker && r.src < cut && !fenced(r, markers)
}

// repairKeys returns the keys, sorted, whose last change record among recs
// does not count (counts).
func repairKeys(recs []logEntry, markers []offsetfile.ChangelogMarker, cut int64) []string {
	last := map[string]logEntry{}
	for _, r := range recs {
		if !r.marker {
			last[string(r.key)] = r
		}
	}
	var out []string
	for k, r := range last {
		if !counts(r, markers, cut) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// trusted reports whether the file's state, as of its watermark, is the
// changelog's: nobody else wrote since this file's last acknowledged write
// (no gap, and the records from pos.Next on are its own owner's).
func trusted(pos offsetfile.ChangelogPosition, tail []logEntry) bool {
	if pos.Gap {
		return false
	}
	for _, r := range tail {
		if r.marker || r.epoch != pos.Epoch {
			return false
		}
	}
	return true
}

// start runs partition p (registered as lp, restoring), resuming at
// start as reconciliation decided (Kafka's committed offset when the file
// is behind it): it trusts the file's state or restores it, writes the
// owner's marker, then runs p. It
// closes p.done itself when p is revoked before it runs. Its error path
// retries until p is revoked: a partition never runs with a state it
// cannot vouch for.
func (c *changelog) start(ctx context.Context, p *partition, lp *logPartition, start int64, log *zap.Logger) {
	bo := newBackoff(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff)
	for {
		resume, err := c.prepare(ctx, p, lp, start)
		if err == nil {
			lp.restoring.Store(false)
			if r := p.st.rareP.Load(); r != nil {
				r.restoring.Store(false)
			}
			p.run(ctx, resume)
			return
		}
		if ctx.Err() != nil {
			close(p.done)
			return
		}
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			// A consumed topic created after Run started: its changelog
			// is checked, and created, now.
			if cerr := c.checkOnce(ctx); cerr != nil {
				err = cerr
			}
		}
		log.Warn("preparing the partition's state from its changelog failed; retrying", zap.String("topic", p.tp.topic),
			zap.Int32("partition", p.tp.partition), zap.Error(err))
		p.st.setError(err)
		if !sleep(ctx, bo.next()) {
			close(p.done)
			return
		}
	}
}

// prepare decides where p resumes and makes its state that of there.
func (c *changelog) prepare(ctx context.Context, p *partition, lp *logPartition, start int64) (int64, error) {
	lp.lock.Lock()
	defer lp.lock.Unlock()
	rec, _ := c.store.Durable(p.key)
	L, C := rec.Watermark, p.kafkaOffset
	pos, err := c.store.ChangelogPosition(p.key)
	if err != nil {
		return 0, err
	}
	lp.pos = pos
	end, err := c.logEnd(ctx, p.tp)
	if err != nil {
		return 0, err
	}
	from := pos.Next
	if pos.Epoch < 0 {
		from = 0
	}
	trust := start == L || (L < 0 && C < 0)
	if trust {
		var tail []logEntry
		if from < end {
			if tail, err = c.read(ctx, p, from, end, false); err != nil {
				return 0, err
			}
		}
		trust = trusted(pos, tail)
	}
	if trust {
		lp.start, lp.pos.Next = start, max(end, lp.pos.Next) // the tail is this file's own
		if err := c.markAfter(ctx, lp, end); err != nil {
			return 0, err
		}
		return start, c.store.SetChangelogPosition(p.key, lp.pos)
	}
	resume := C
	if C < 0 {
		// Nobody committed: nothing of the changelog counts, and the
		// partition is handled again from its first offset.
		first, err := c.logStart(ctx, p.tp)
		if err != nil {
			return 0, err
		}
		resume = first
	}
	lp.start = resume
	if err := c.markAfter(ctx, lp, end); err != nil {
		return 0, err
	}
	epoch := lp.epoch
	// Incremental when the file's state is the changelog's up to
	// pos.Next and no owner since resumed below the file's watermark
	// (that would fence changes the file holds); else from the start.
	incremental := !pos.Gap && pos.Epoch >= 0 && L >= 0 && C > L
	from = 0
	if incremental {
		from = pos.Next
	}
	p.st.rare().restoring.Store(true)
	p.st.rare().restoreRemaining.Store(max(epoch-from, 0))
	recs, err := c.read(ctx, p, from, epoch, true)
	if err != nil {
		return 0, err
	}
	earlier := pos.Markers
	if !incremental {
		earlier = nil
	}
	if incremental {
		// Someone resumed at or above the file's watermark, and nobody
		// below it; else the file's changes above the resumer's start
		// are fenced, and the file's state is not the changelog's.
		owners := 0
		for _, r := range recs {
			if r.marker {
				owners++
				if r.start < L {
					incremental = false
				}
			}
		}
		incremental = incremental && owners > 0
		if !incremental {
			c.log.Info("an owner resumed below this file's watermark since its last write: restoring from the changelog's start",
				zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition), zap.Int64("local", L))
			p.st.rare().restoreRemaining.Store(epoch)
			if recs, err = c.read(ctx, p, 0, epoch, true); err != nil {
				return 0, err
			}
			earlier = nil
		}
	}
	markers := restoreMarkers(earlier, recs)
	st, err := c.store.BeginState(p.key)
	if err != nil {
		return 0, err
	}
	defer st.Discard()
	// Every change that counts is applied in changelog order, a key's
	// later change over its earlier one; a full restore first deletes
	// every key the file holds.
	var stale [][]byte
	if !incremental {
		if err := st.ForEach(func(k, _ []byte) error {
			stale = append(stale, slices.Clone(k))
			return nil
		}); err != nil {
			return 0, err
		}
	}
	n, size := len(stale), 0
	for _, k := range stale {
		size += len(k)
	}
	for _, r := range recs {
		if !r.marker {
			n, size = n+1, size+len(r.key)+len(r.value)
		}
	}
	st.Reserve(n, size)
	for _, k := range stale {
		if err := st.Delete(k); err != nil {
			return 0, err
		}
	}
	applied, ignored := 0, false
	for _, r := range recs {
		if r.marker {
			continue
		}
		if !counts(r, markers, resume) {
			ignored = true
			continue
		}
		if r.del {
			err = st.Delete(r.key)
		} else {
			err = st.Put(r.key, r.value)
		}
		if err != nil {
			return 0, fmt.Errorf("restoring %s/%d from its changelog: %w", p.tp.topic, p.tp.partition, err)
		}
		applied++
	}
	lp.pos = offsetfile.ChangelogPosition{Epoch: epoch, Start: resume, Next: epoch + 1, Acked: -1,
		Markers: append(slices.Clip(markers), offsetfile.ChangelogMarker{Epoch: epoch, Start: resume})}
	// Keys whose last record is one the restore ignored get the restored
	// value again (a tombstone if none): compaction keeps a key's last
	// record only, and must not keep an ignored one.
	var repairs []logRecord
	if ignored {
		for _, k := range repairKeys(recs, markers, resume) {
			v, err := st.Get([]byte(k))
			if err != nil {
				return 0, err
			}
			repairs = append(repairs, logRecord{key: []byte(k), value: slices.Clone(v), del: v == nil, src: resume - 1, epoch: epoch})
		}
	}
	for len(repairs) > 0 {
		n := min(len(repairs), maxLogBatch)
		base, err := c.produceLocked(ctx, lp, repairs[:n])
		if err != nil {
			return 0, fmt.Errorf("rewriting %d keys whose last changelog record is ignored: %w", len(repairs), err)
		}
		if base != lp.pos.Next {
			lp.pos.Gap = true
		}
		lp.pos.Next, repairs = base+int64(n), repairs[n:]
	}
	st.Restored(lp.pos)
	gen, member := p.gen, p.member
	if err := st.Commit(ctx, resume, gen, member); err != nil {
		return 0, err
	}
	lp.restored = epoch // the outbox is sent once this is durable (writeLocked)
	// The partition runs at once, on the restored state as queued: its
	// runs read it, and their changes and watermarks are written after it,
	// so none is durable, or sent to the changelog, before it. A crash
	// before it is durable leaves the file as it was, and the next start
	// restores again. Waiting for it took as long as the restore itself,
	// and a state too large to write within Config.Timeout never ran.
	p.st.processed.Store(resume)
	c.log.Info("state restored from the changelog", zap.String("topic", p.tp.topic), zap.Int32("partition", p.tp.partition),
		zap.Int64("local", L), zap.Int64("kafka_committed", C), zap.Int64("resume", resume), zap.Bool("incremental", incremental),
		zap.Int("changes", applied), zap.Uint64("records", p.st.rareView().restoreTotal.Load()))
	return resume, nil
}

// markAfter writes lp's marker, which must land at or after end (the
// changelog's end before it): one that lands before was taken by the
// broker for a duplicate of an earlier batch, and the producer is
// replaced.
func (c *changelog) markAfter(ctx context.Context, lp *logPartition, end int64) error {
	if err := c.markLocked(ctx, lp); err != nil {
		return err
	}
	if lp.epoch < end {
		c.mu.Lock()
		pid := c.pid
		c.mu.Unlock()
		c.resetProducer(pid)
		epoch := lp.epoch
		lp.epoch = -1
		return fmt.Errorf("the owner's marker was answered at changelog offset %d, below the log end %d: taken for a duplicate; writing it again with a new producer", epoch, end)
	}
	return nil
}

// logEnd is the end offset of p's changelog partition.
func (c *changelog) logEnd(ctx context.Context, tp topicPartition) (int64, error) {
	return c.listOffset(ctx, c.topic(tp.topic), tp.partition, -1)
}

// logStart is the first offset of tp (the consumed topic's partition).
func (c *changelog) logStart(ctx context.Context, tp topicPartition) (int64, error) {
	return c.listOffset(ctx, tp.topic, tp.partition, -2)
}

func (c *changelog) listOffset(ctx context.Context, topic string, partition int32, ts int64) (int64, error) {
	addr, err := c.leader(ctx, topic, partition)
	if err != nil {
		return 0, err
	}
	req := wire.NewListOffsets(ts, false, func(yield func(string, int32) bool) { yield(topic, partition) })
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	res, err := c.cl.client.At(rctx, addr, req, c.cfg.Timeout)
	if err != nil {
		c.forget(topic)
		return 0, fmt.Errorf("ListOffsets of %s/%d: %w", topic, partition, err)
	}
	for _, t := range res.(*kmsg.ListOffsetsResponse).Topics {
		for _, p := range t.Partitions {
			if p.Partition != partition {
				continue
			}
			if err := wire.Error(p.ErrorCode); err != nil {
				c.forget(topic)
				return 0, fmt.Errorf("ListOffsets of %s/%d: %w", topic, partition, err)
			}
			return p.Offset, nil
		}
	}
	return 0, fmt.Errorf("ListOffsets of %s/%d: no answer for the partition", topic, partition)
}

// read returns p's changelog records from offset from up to end
// (exclusive), counting them in p's restore Stats when counted is set.
func (c *changelog) read(ctx context.Context, p *partition, from, end int64, counted bool) ([]logEntry, error) {
	topic := c.topic(p.tp.topic)
	out := make([]logEntry, 0, min(max(end-from, 0), 1<<20))
	for at := from; at < end; {
		addr, err := c.leader(ctx, topic, p.tp.partition)
		if err != nil {
			return nil, err
		}
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = -1, 100, 1, 16<<20
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.LogStartOffset, rp.PartitionMaxBytes, rp.CurrentLeaderEpoch = p.tp.partition, at, -1, 8<<20, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		res, err := c.cl.client.At(rctx, addr, req, c.cfg.Timeout)
		cancel()
		if err != nil {
			c.forget(topic)
			return nil, fmt.Errorf("reading changelog %s/%d at %d: %w", topic, p.tp.partition, at, err)
		}
		var part *kmsg.FetchResponseTopicPartition
		for i := range res.(*kmsg.FetchResponse).Topics {
			t := &res.(*kmsg.FetchResponse).Topics[i]
			for j := range t.Partitions {
				if t.Partitions[j].Partition == p.tp.partition {
					part = &t.Partitions[j]
				}
			}
		}
		if part == nil {
			return nil, fmt.Errorf("reading changelog %s/%d at %d: no answer for the partition", topic, p.tp.partition, at)
		}
		if err := wire.Error(part.ErrorCode); err != nil {
			if errors.Is(err, kafka.OffsetOutOfRange) && at < part.LogStartOffset {
				at = part.LogStartOffset // compacted or deleted below: what is left is what counts
				continue
			}
			c.forget(topic)
			return nil, fmt.Errorf("reading changelog %s/%d at %d: %w", topic, p.tp.partition, at, err)
		}
		var other *logEntry
		next, err := decodeLog(part.RecordBatches, at, end, func(e logEntry) {
			if e.marker && e.group != "" && e.group != c.cfg.GroupID && other == nil {
				o := e // a copy: &e would put every record on the heap
				other = &o
			}
			out = append(out, e)
		})
		if err == nil && other != nil {
			err = fmt.Errorf("%w: group %q's marker at %d, this consumer is group %q: give each group a StateChangelog suffix of its own",
				ErrChangelogOtherGroup, other.group, other.at, c.cfg.GroupID)
		}
		if err != nil {
			return nil, fmt.Errorf("reading changelog %s/%d at %d: %w", topic, p.tp.partition, at, err)
		}
		if counted {
			p.st.rare().restoreTotal.Add(uint64(next - at))
			p.st.rare().restoreRemaining.Store(max(end-next, 0))
		}
		if next == at {
			if part.HighWatermark <= at {
				return nil, fmt.Errorf("reading changelog %s/%d: it ends at %d, before %d", topic, p.tp.partition, part.HighWatermark, end)
			}
			if !sleep(ctx, 10*time.Millisecond) {
				return nil, ctx.Err()
			}
		}
		at = next
	}
	return out, nil
}

// decodeLog calls fn with each record of the record batches b at or above
// from and below end, and returns the offset after the last batch read. It
// decodes in place: keys and values slice into b (or into a batch's
// decompressed records).
func decodeLog(b []byte, from, end int64, fn func(logEntry)) (int64, error) {
	next := from
	for {
		base, n, err := batchSpan(b)
		if err != nil || n == 0 {
			return next, err // n == 0: none left, or a partial batch ends the response
		}
		batch := b[frameSize:n]
		b = b[n:]
		if want, got := binary.BigEndian.Uint32(batch[batchCRC:]), crc32.Checksum(batch[batchAttrs:], crc32c); want != got {
			return next, fmt.Errorf("record batch at offset %d: CRC mismatch (computed %#x, recorded %#x)", base, got, want)
		}
		attrs := binary.BigEndian.Uint16(batch[batchAttrs:])
		last := base + int64(int32(binary.BigEndian.Uint32(batch[batchLastOff:])))
		if attrs&attrControl != 0 {
			next = max(next, last+1)
			continue
		}
		recs := batch[batchRecords:]
		if codec := compress.Compression(attrs & attrCodec); codec != compress.None {
			if recs, err = decompress(codec, recs, 0, 0); err != nil {
				return next, fmt.Errorf("record batch at offset %d: %s: %w", base, codec, err)
			}
		}
		count := int32(binary.BigEndian.Uint32(batch[batchCount:]))
		if count < 0 || int(count) > len(recs) {
			return next, fmt.Errorf("record batch at offset %d: invalid record count %d", base, count)
		}
		r := recordReader{b: recs}
		for i := range count {
			e, err := r.logEntry(base)
			if err != nil {
				return next, fmt.Errorf("record %d of the batch at offset %d: %w", i, base, err)
			}
			if e.at >= from && e.at < end {
				fn(e)
			}
		}
		next = max(next, last+1)
	}
}

// logEntry reads a changelog record of the batch at base: a marker or a
// change; anything else is not tidemark's and refused.
func (r *recordReader) logEntry(base int64) (logEntry, error) {
	e := logEntry{epoch: -1, src: -1, start: -1}
	length, ok := r.varint()
	if !ok || length < 1 || length > int64(r.left()) {
		return e, errMalformed
	}
	rec := r.sub(int(length))
	rec.i++                // the attributes, unused
	_, ok1 := rec.varint() // the timestamp delta
	delta, ok2 := rec.varint()
	key, ok3 := rec.bytes()
	value, ok4 := rec.bytes()
	nh, ok5 := rec.varint()
	if !(ok1 && ok2 && ok3 && ok4 && ok5) || nh < 0 || nh > int64(rec.left()) {
		return e, errMalformed
	}
	e.at, e.key, e.value, e.del = base+delta, key, value, value == nil
	hasSrc := false
	for range nh {
		k, ok1 := rec.bytes()
		v, ok2 := rec.bytes()
		if !ok1 || !ok2 || k == nil {
			return e, errMalformed
		}
		var err error
		switch string(k) {
		case HeaderChangelogMarker:
			e.marker = true
			e.start, err = parseDecimal(v)
		case HeaderChangelogGroup:
			e.group = string(v)
		case HeaderChangelogEpoch:
			e.epoch, err = parseDecimal(v)
		case HeaderChangelogOffset:
			// A restore's rewrite of a key carries its start - 1 (-1 at 0).
			e.src, err = parseDecimal(v)
			hasSrc = true
		}
		if err != nil {
			return e, fmt.Errorf("changelog record at %d: header %s: %w", e.at, k, err)
		}
	}
	if !e.marker && (e.epoch < 0 || !hasSrc || len(e.key) == 0) {
		return e, fmt.Errorf("changelog record at %d is not tidemark's (no %s and %s headers, or no key): another writer uses the changelog topic",
			e.at, HeaderChangelogEpoch, HeaderChangelogOffset)
	}
	return e, nil
}

// parseDecimal is strconv.ParseInt(string(b), 10, 64) without its
// allocation for the short numbers a changelog's headers carry.
func parseDecimal(b []byte) (int64, error) {
	d := b
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 18 { // 18 digits cannot overflow
		return strconv.ParseInt(string(b), 10, 64)
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return strconv.ParseInt(string(b), 10, 64)
		}
		n = n*10 + int64(c-'0')
	}
	if len(d) < len(b) {
		n = -n
	}
	return n, nil
}
