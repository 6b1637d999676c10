package framework

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// The v2 record batch layout (Kafka 0.11 and later): a frame of the base
// offset and the length of what follows, then the batch, whose offsets
// below are from the batch's start, just after the frame.
const (
	frameLength  = 8     // in the frame: the base offset (8), then the batch's length (4)
	frameSize    = 8 + 4 // the frame; the length counts what follows it
	batchMagic   = 4     // after the partition leader epoch (4); the format version, 2
	batchCRC     = 5     // CRC-32C of everything from batchAttrs on
	batchAttrs   = 9     // attributes (2)
	batchLastOff = 11    // the last offset delta (4)
	batchFirstTS = 15    // the first timestamp (8)
	batchMaxTS   = 23    // the max timestamp (8)
	batchProduce = 31    // the producer id (8), -1 without one
	batchCount   = 45    // after the producer epoch (2) and base sequence (4): the record count (4)
	batchRecords = 49    // the records; also the smallest valid batch length
)

// Batch attributes.
const (
	attrCodec         = 0x07 // compression codec
	attrLogAppendTime = 0x08 // timestamps are the broker's append time (max timestamp)
	attrTransactional = 0x10 // written in a transaction (txn.go)
	attrControl       = 0x20 // a control batch: a transaction marker
)

// decoded is what readBatch read from a partition's record batches.
type decoded struct {
	msgs []kafka.Message
	// end is the offset after the last batch read whole (its last offset
	// delta counts, so records removed by compaction and empty or control
	// batches move it), or after the last record decoded when a batch
	// failed: every offset below end was delivered in msgs, earlier, or
	// does not exist.
	end int64
	// readCommitted (Config.IsolationLevel) stops at lso, the last stable
	// offset of the fetch, and drops what txn says was aborted.
	readCommitted bool
	lso           int64
	txn           *txnFilter
	// aborted counts the records of aborted transactions dropped.
	aborted int
	// maxInflate bounds a batch's decompressed size (0: maxInflateDefault).
	maxInflate int
	// cur is the batch readBatch is reading, when it stopped at its limit.
	cur batchCursor
	// inflated is the decompressed size of the last compressed batch
	// opened, for the budget (fetcher.inflate); hint is what the next one
	// is expected to take (0: not known).
	inflated, hint int
}

// compressedBatch returns the size of the first record batch of b when it
// is complete and compressed: what its goroutine is about to decompress.
func compressedBatch(b []byte) (n int, ok bool) {
	_, n, err := batchSpan(b)
	if err != nil || n < frameSize+batchRecords {
		return 0, false
	}
	attrs := binary.BigEndian.Uint16(b[frameSize+batchAttrs:])
	return n, compress.Compression(attrs&attrCodec) != compress.None && attrs&attrControl == 0
}

// maxInflateDefault bounds a batch's decompressed size when decoded sets
// none: far above any batch a broker accepts (message.max.bytes is 1 MiB
// by default), far below what a hostile one could inflate to.
const maxInflateDefault = 256 << 20

// batchSpan reads the frame of the first record batch in b: its base
// offset and its size in b, 0 when b holds no complete batch (the broker cut
// the last one short at the response's size limit: it is fetched again). It
// checks the frame and the format version (only v2, Kafka 0.11 and later,
// is read), not the CRC or the records.
func batchSpan(b []byte) (base int64, n int, err error) {
	if len(b) <= frameSize+batchMagic {
		return 0, 0, nil
	}
	base = int64(binary.BigEndian.Uint64(b))
	length := int32(binary.BigEndian.Uint32(b[frameLength:]))
	if length < batchRecords || int(length) > len(b)-frameSize {
		if length < batchRecords && int(length) <= len(b)-frameSize {
			return base, 0, fmt.Errorf("record batch at offset %d: invalid length %d", base, length)
		}
		return base, 0, nil
	}
	if magic := b[frameSize+batchMagic]; magic != 2 {
		return base, 0, fmt.Errorf("record batch at offset %d: message format v%d is not supported (only v2, Kafka 0.11 and later)", base, magic)
	}
	return base, frameSize + int(length), nil
}

// batchWanted returns the size of the record batch that b starts with when
// b holds only part of it (0 otherwise): what a partition must be asked
// for to get it whole.
func batchWanted(b []byte) int32 {
	if len(b) < frameSize {
		return 0
	}
	length := int64(int32(binary.BigEndian.Uint32(b[frameLength:])))
	if length < batchRecords || length <= int64(len(b)-frameSize) || length > maxInflateDefault {
		return 0
	}
	return int32(frameSize + length)
}

// scanBatches reads only the headers of the record batches in b, fetched
// at offset from: it returns the offset after the last complete batch (from
// if none), which is where the next fetch starts.
func scanBatches(b []byte, from int64) (int64, error) {
	end := from
	for {
		last, n, err := batchEnd(b)
		if err != nil || n == 0 {
			return end, err
		}
		end = max(end, last)
		b = b[n:]
	}
}

// batchEnd is batchSpan, with the offset after the batch's last record in
// place of its base offset.
func batchEnd(b []byte) (end int64, n int, err error) {
	base, n, err := batchSpan(b)
	if err != nil || n == 0 {
		return 0, 0, err
	}
	return base + int64(int32(binary.BigEndian.Uint32(b[frameSize+batchLastOff:]))) + 1, n, nil
}

// readBatch decodes the first record batch of b (a partition's part of a
// Fetch response) and appends to d.msgs its records at or after d.end,
// moving d.end past them. It returns the size of the batch in b once the
// batch is read, or 0 when b holds no complete batch (the broker cut the
// last one short at the response's size limit: it is fetched again). With
// limit > 0 it appends at most limit records: when records remain, more is
// true and n 0, and the next call with the same b goes on from there (d.cur
// holds the batch open), so that a partition decodes a large batch a few
// records at a time. An error names the offset it stopped at; the records
// before it are in d.msgs and d.end is after the last of them.
//
// Only the v2 record batch format (Kafka 0.11 and later) is read: older
// message sets are reported as an error.
func readBatch(d *decoded, topic string, partition int, hwm int64, b []byte, limit int) (n int, more bool, err error) {
	if !d.cur.open {
		if n, err := d.openBatch(b); err != nil || !d.cur.open {
			return n, false, err
		}
	}
	c := &d.cur
	for ; c.i < c.count; c.i++ {
		if limit > 0 && len(d.msgs) >= limit {
			return 0, true, nil
		}
		m, ok := c.r.record(topic, partition, hwm, c.base, c.firstTS)
		if !ok {
			err := fmt.Errorf("record %d of the batch at offset %d: %w", c.i, c.base, errMalformed)
			d.cur = batchCursor{}
			return 0, false, err
		}
		if m.Offset < d.end {
			continue
		}
		if d.readCommitted && m.Offset >= d.lso {
			break
		}
		if m.Offset >= c.end {
			err := fmt.Errorf("record %d of the batch at offset %d: offset %d beyond the batch's last offset %d: %w", c.i, c.base, m.Offset, c.end-1, errMalformed)
			d.cur = batchCursor{}
			return 0, false, err
		}
		if c.logAppendTime {
			m.Time = time.UnixMilli(c.maxTS)
		}
		d.msgs = append(d.msgs, m)
		d.end = m.Offset + 1
	}
	end, size := c.end, c.size
	d.cur = batchCursor{}
	if d.readCommitted && end > d.lso {
		d.end = max(d.end, d.lso)
		return 0, false, nil // the rest is above the LSO: fetched again
	}
	d.end = end
	return size, false, nil
}

// batchCursor is a record batch readBatch has opened and not read to its
// end.
type batchCursor struct {
	open           bool
	r              recordReader
	i, count       int32
	base, end      int64 // the batch's base offset, and the offset after it
	firstTS, maxTS int64
	logAppendTime  bool
	size           int // the batch's size in the response
}

// openBatch reads the frame of the first record batch of b and, unless
// the batch is done with at once (before the position, aborted, a control
// batch, not decided yet), opens it in d.cur. It returns the batch's size
// when it was done with, 0 otherwise.
func (d *decoded) openBatch(b []byte) (int, error) {
	base, n, err := batchSpan(b)
	if err != nil || n == 0 {
		return 0, err
	}
	batch := b[frameSize:n]
	if want, got := binary.BigEndian.Uint32(batch[batchCRC:]), crc32.Checksum(batch[batchAttrs:], crc32c); want != got {
		return 0, fmt.Errorf("record batch at offset %d: CRC mismatch (computed %#x, recorded %#x)", base, got, want)
	}
	attrs := int16(binary.BigEndian.Uint16(batch[batchAttrs:]))
	lastDelta := int32(binary.BigEndian.Uint32(batch[batchLastOff:]))
	batchEnd := base + int64(lastDelta) + 1
	if batchEnd <= d.end {
		return n, nil // wholly before the position: the broker starts at the batch holding it
	}
	if d.readCommitted && max(base, d.end) >= d.lso {
		return 0, nil // not decided yet: fetched again once the LSO passes it
	}
	producer := int64(binary.BigEndian.Uint64(batch[batchProduce:]))
	firstTS := int64(binary.BigEndian.Uint64(batch[batchFirstTS:]))
	maxTS := int64(binary.BigEndian.Uint64(batch[batchMaxTS:]))
	count := int32(binary.BigEndian.Uint32(batch[batchCount:]))
	if attrs&attrTransactional != 0 && attrs&attrControl == 0 && d.txn != nil && d.txn.aborted(producer, batchEnd-1) {
		// Dropped before it is decompressed: its records are never read.
		d.aborted += int(min(int64(count), batchEnd-max(base, d.end)))
		d.end = d.stop(batchEnd)
		return n, nil
	}
	recs := batch[batchRecords:]
	if codec := compress.Compression(attrs & attrCodec); codec != compress.None {
		var err error
		if recs, err = decompress(codec, recs, d.maxInflate, d.hint); err != nil {
			return 0, fmt.Errorf("record batch at offset %d: %s: %w", base, codec, err)
		}
		d.inflated = len(recs)
	}
	if attrs&attrControl != 0 {
		// A transaction marker: never handed out, at either level, but
		// read, so that a marker that cannot be read stalls the partition
		// rather than being skipped.
		typ, err := controlRecord(recs, count)
		if err != nil {
			return 0, fmt.Errorf("control batch at offset %d (producer %d): %w", base, producer, err)
		}
		if d.txn != nil {
			d.txn.marker(producer, batchEnd-1, typ == controlAbort)
		}
		d.end = d.stop(batchEnd)
		return n, nil
	}
	if count < 0 || int(count) > len(recs) {
		return 0, fmt.Errorf("record batch at offset %d: invalid record count %d", base, count)
	}
	d.cur = batchCursor{open: true, r: recordReader{b: recs}, count: count, base: base, end: batchEnd,
		firstTS: firstTS, maxTS: maxTS, logAppendTime: attrs&attrLogAppendTime != 0, size: n}
	return 0, nil
}

// stop is where a batch ending before end leaves the position: end, or
// the LSO if that comes first.
func (d *decoded) stop(end int64) int64 {
	if d.readCommitted {
		return min(end, max(d.lso, d.end))
	}
	return end
}

var errMalformed = errors.New("malformed record")

// errInflate marks a batch whose records decompress to more than the
// bound.
var errInflate = errors.New("inflates beyond")

// decompress inflates a batch's records, to at most limit bytes
// (0: maxInflateDefault): a batch that inflates beyond is an error, not
// an allocation of whatever size its bytes ask for. hint is the size
// expected (0: none), the buffer's first size.
func decompress(codec compress.Compression, b []byte, limit, hint int) ([]byte, error) {
	c := codec.Codec()
	if c == nil {
		return nil, fmt.Errorf("unknown compression codec %d", codec)
	}
	if limit <= 0 {
		limit = maxInflateDefault
	}
	if codec == compress.Zstd {
		if out, ok, err := decompressZstd(b, limit); ok {
			return out, err
		}
	}
	r := c.NewReader(bytes.NewReader(b))
	defer r.Close()
	if hint <= 0 {
		hint = 4 * len(b)
	}
	out := make([]byte, 0, min(hint+hint/8, limit+1))
	lr := io.LimitReader(r, int64(limit)+1)
	for {
		if len(out) == cap(out) {
			out = slices.Grow(out, min(cap(out), limit+1-cap(out)))
		}
		n, err := lr.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(out) > limit {
			return nil, fmt.Errorf("batch %w %d bytes (%d compressed)", errInflate, limit, len(b))
		}
	}
	// The messages slice into the result and keep all of it while any is
	// held: a buffer grown to twice what it holds is copied to its size.
	if cap(out)-len(out) > len(out)/4 {
		return bytes.Clone(out), nil
	}
	return out, nil
}

// zstdDecoder decodes whole zstd frames (DecodeAll, safe for concurrent
// use) into the buffer it is given and no further: a frame that says its
// size is decoded into exactly that, at the cost of one allocation, where
// the streaming reader grows a buffer and resets a decoder per batch (46%
// of the CPU of a 10,000-partition zstd backlog).
var zstdDecoder = sync.OnceValues(func() (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(maxInflateDefault))
})

// decompressZstd decodes b in one call when its first frame states its
// size (franz-go's producer writes it); ok is false
// when the streaming path must do it (a frame without its size, as the
// Java client's streaming encoder writes, or several frames).
func decompressZstd(b []byte, limit int) (out []byte, ok bool, err error) {
	var h zstd.Header
	if h.Decode(b) != nil || !h.HasFCS || h.Skippable {
		return nil, false, nil
	}
	if h.FrameContentSize > uint64(limit) {
		return nil, true, fmt.Errorf("batch %w %d bytes (%d compressed; its frame says %d)", errInflate, limit, len(b), h.FrameContentSize)
	}
	dec, err := zstdDecoder()
	if err != nil {
		return nil, false, nil
	}
	out, err = dec.DecodeAll(b, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return nil, false, nil // more than the first frame, or damage: the streaming path says which
	}
	return out, true, nil
}

// recordReader reads the records of one decompressed batch. It moves an
// index, not the slice: the batch cursor's reader lives on the heap, where
// moving the slice wrote a pointer per field read, a write barrier each
// while the GC runs.
type recordReader struct {
	b []byte
	i int // read up to here
}

// left is the number of bytes not read yet.
func (r *recordReader) left() int { return len(r.b) - r.i }

// sub returns a reader of the next n bytes (at most left), which r skips.
func (r *recordReader) sub(n int) recordReader {
	s := recordReader{b: r.b[r.i : r.i+n]}
	r.i += n
	return s
}

func (r *recordReader) varint() (int64, bool) {
	if r.i < len(r.b) {
		// One byte holds most of a record's varints (the timestamp and
		// offset deltas, a null key's length, the header count): decoded
		// here without binary.Varint's loop.
		if c := r.b[r.i]; c < 0x80 {
			r.i++
			return int64(c>>1) ^ -int64(c&1), true // zig-zag
		}
	}
	v, n := binary.Varint(r.b[r.i:])
	if n <= 0 {
		return 0, false
	}
	r.i += n
	return v, true
}

// bytes reads a varint length and that many bytes; -1 is nil.
func (r *recordReader) bytes() ([]byte, bool) {
	n, ok := r.varint()
	switch {
	case !ok || n < -1 || n > int64(r.left()):
		return nil, false
	case n == -1:
		return nil, true
	}
	end := r.i + int(n)
	s := r.b[r.i:end:end]
	r.i = end
	return s, true
}

// record reads one record. The Message's key, value and header values
// slice into the batch.
func (r *recordReader) record(topic string, partition int, hwm, base, firstTS int64) (kafka.Message, bool) {
	var m kafka.Message
	length, ok := r.varint()
	if !ok || length < 0 || length > int64(r.left()) {
		return m, false
	}
	rec := r.sub(int(length))
	if rec.left() < 1 {
		return m, false
	}
	rec.i++ // attributes, unused
	tsDelta, ok1 := rec.varint()
	offDelta, ok2 := rec.varint()
	key, ok3 := rec.bytes()
	value, ok4 := rec.bytes()
	nh, ok5 := rec.varint()
	if !(ok1 && ok2 && ok3 && ok4 && ok5) || nh < 0 || nh > int64(rec.left()) {
		return m, false
	}
	m = kafka.Message{
		Topic:         topic,
		Partition:     partition,
		Offset:        base + offDelta,
		HighWaterMark: hwm,
		Key:           key,
		Value:         value,
		Time:          time.UnixMilli(firstTS + tsDelta),
	}
	if nh > 0 {
		m.Headers = make([]kafka.Header, nh)
		for i := range m.Headers {
			k, ok1 := rec.bytes()
			v, ok2 := rec.bytes()
			if !ok1 || !ok2 || k == nil {
				return m, false
			}
			m.Headers[i] = kafka.Header{Key: string(k), Value: v}
		}
	}
	return m, true
}
