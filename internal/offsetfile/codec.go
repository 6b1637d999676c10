package offsetfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Value encoding, version 2 (written):
//
//	byte     encoding version (2)
//	uvarint  flags: 1 RecordedAt set, 2 CommittedAt set, 4 LastReset set,
//	         8 LastReset.At set, 16 Run set, 32 counts set, 64 LastCommit set,
//	         128 LastCommit.At set, 256 Completed set
//	varint   Watermark
//	varint   RecordedAt, Unix nanoseconds          (if flag 1)
//	varint   Generation
//	uvarint  len(Member), Member bytes
//	varint   Committed
//	varint   CommittedAt, Unix nanoseconds         (if flag 2)
//	varint   LastReset.At, Unix nanoseconds        (if flag 8)
//	varint   LastReset.From                        (if flag 4)
//	varint   LastReset.To                          (if flag 4)
//	uvarint  len(Reason), Reason bytes             (if flag 4)
//	byte     Run.Open (0 or 1)                     (if flag 16)
//	varint   Run.Inflight                          (if flag 16)
//	varint   Run.Crashes                           (if flag 16)
//	varint   Skipped                               (if flag 32)
//	varint   DeadLettered                          (if flag 32)
//	varint   LastCommit.Offset                     (if flag 64)
//	varint   LastCommit.Generation                 (if flag 64)
//	varint   LastCommit.At, Unix nanoseconds       (if flag 128)
//	byte     LastCommit.Outcome                    (if flag 64)
//	varint   LastCommit.Latency, nanoseconds       (if flag 64)
//	uvarint  len(Error), Error bytes               (if flag 64)
//	uvarint  len(Completed), at least 1            (if flag 256)
//	then, for each range of Completed              (if flag 256)
//	uvarint    From - prev, at least 1: prev is Watermark, then the To of
//	           the range before
//	uvarint    To - From, at least 1
//
// Version 1, written by earlier builds and still read, is the same up to the
// reset fields, with the flags in one byte and none above 8.
//
// Varints are encoding/binary's zig-zag signed varints. A zero time is
// stored as an absent field; so are a nil Run, zero counts, a nil
// LastCommit and an empty Completed: a record without completed ranges
// encodes as it did before flag 256 existed, and a build that does not know
// flag 256 refuses a record with ranges ("unknown flags") rather than
// misreading it.
const valueVersion = 2

const (
	flagRecordedAt = 1 << iota
	flagCommittedAt
	flagReset
	flagResetAt
	flagRun
	flagCounts
	flagCommit
	flagCommitAt
	flagCompleted
	flagsKnownV1 = flagRecordedAt | flagCommittedAt | flagReset | flagResetAt
	flagsKnown   = flagsKnownV1 | flagRun | flagCounts | flagCommit | flagCommitAt | flagCompleted
)

// appendRecord appends the encoding of r to b. r must have passed
// validateRecord.
func appendRecord(b []byte, r *Record) []byte {
	var flags uint64
	if !r.RecordedAt.IsZero() {
		flags |= flagRecordedAt
	}
	if !r.CommittedAt.IsZero() {
		flags |= flagCommittedAt
	}
	if r.LastReset != nil {
		flags |= flagReset
		if !r.LastReset.At.IsZero() {
			flags |= flagResetAt
		}
	}
	if r.Run != nil {
		flags |= flagRun
	}
	if r.Skipped != 0 || r.DeadLettered != 0 {
		flags |= flagCounts
	}
	if r.LastCommit != nil {
		flags |= flagCommit
		if !r.LastCommit.At.IsZero() {
			flags |= flagCommitAt
		}
	}
	if len(r.Completed) > 0 {
		flags |= flagCompleted
	}
	b = append(b, valueVersion)
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendVarint(b, r.Watermark)
	if flags&flagRecordedAt != 0 {
		b = binary.AppendVarint(b, r.RecordedAt.UnixNano())
	}
	b = binary.AppendVarint(b, int64(r.Generation))
	b = appendString(b, r.Member)
	b = binary.AppendVarint(b, r.Committed)
	if flags&flagCommittedAt != 0 {
		b = binary.AppendVarint(b, r.CommittedAt.UnixNano())
	}
	if rs := r.LastReset; rs != nil {
		if flags&flagResetAt != 0 {
			b = binary.AppendVarint(b, rs.At.UnixNano())
		}
		b = binary.AppendVarint(b, rs.From)
		b = binary.AppendVarint(b, rs.To)
		b = appendString(b, rs.Reason)
	}
	if run := r.Run; run != nil {
		open := byte(0)
		if run.Open {
			open = 1
		}
		b = append(b, open)
		b = binary.AppendVarint(b, run.Inflight)
		b = binary.AppendVarint(b, int64(run.Crashes))
	}
	if flags&flagCounts != 0 {
		b = binary.AppendVarint(b, r.Skipped)
		b = binary.AppendVarint(b, r.DeadLettered)
	}
	if c := r.LastCommit; c != nil {
		b = binary.AppendVarint(b, c.Offset)
		b = binary.AppendVarint(b, int64(c.Generation))
		if flags&flagCommitAt != 0 {
			b = binary.AppendVarint(b, c.At.UnixNano())
		}
		b = append(b, byte(c.Outcome))
		b = binary.AppendVarint(b, int64(c.Latency))
		b = appendString(b, c.Error)
	}
	if flags&flagCompleted != 0 {
		b = binary.AppendUvarint(b, uint64(len(r.Completed)))
		prev := r.Watermark
		for _, rg := range r.Completed {
			b = binary.AppendUvarint(b, uint64(rg.From-prev))
			b = binary.AppendUvarint(b, uint64(rg.To-rg.From))
			prev = rg.To
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errTruncated = errors.New("value truncated")

// decoder reads the fields of an encoded value; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%s: bad varint", field)
		if n == 0 {
			d.err = fmt.Errorf("%s: %w", field, errTruncated)
		}
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) time(field string) time.Time {
	ns := d.varint(field)
	if d.err != nil {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func (d *decoder) string(field string) string {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return ""
	}
	if n > maxStringLen {
		d.err = fmt.Errorf("%s is %d bytes, the limit is %d", field, n, maxStringLen)
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%s: %w", field, errTruncated)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%s: bad varint", field)
		if n == 0 {
			d.err = fmt.Errorf("%s: %w", field, errTruncated)
		}
		return 0
	}
	d.b = d.b[n:]
	return v
}

// completed decodes the ranges of flag 256 above watermark. Each delta must
// be at least 1 and keep the offsets within int64; validateRecord checks
// the rest.
func (d *decoder) completed(watermark int64) []Range {
	n := d.uvarint("completed range count")
	switch {
	case d.err != nil:
		return nil
	case n == 0:
		d.err = errors.New("completed set flag with 0 ranges")
		return nil
	case n > maxRanges:
		d.err = fmt.Errorf("%d completed ranges, the limit is %d", n, maxRanges)
		return nil
	case n > uint64(len(d.b))/2: // each range takes 2 bytes at least
		d.err = fmt.Errorf("%d completed ranges in %d bytes: %w", n, len(d.b), errTruncated)
		return nil
	case watermark < 0:
		d.err = fmt.Errorf("%d completed ranges without a watermark (watermark %d)", n, watermark)
		return nil
	}
	out := make([]Range, 0, n)
	prev := watermark
	for i := range n {
		gap := d.uvarint("completed range start")
		size := d.uvarint("completed range length")
		switch {
		case d.err != nil:
			return nil
		case gap == 0 && i == 0:
			d.err = fmt.Errorf("completed range 0 starts at the watermark %d (the watermark offset itself is not done)", watermark)
		case gap == 0:
			d.err = fmt.Errorf("completed range %d starts at %d, where range %d ends (touching ranges must be merged)", i, prev, i-1)
		case size == 0:
			d.err = fmt.Errorf("completed range %d is empty", i)
		case gap > uint64(math.MaxInt64-prev) || size > uint64(math.MaxInt64-prev)-gap:
			d.err = fmt.Errorf("completed range %d: offset overflows int64 (start %d + %d, length %d)", i, prev, gap, size)
		}
		if d.err != nil {
			return nil
		}
		from := prev + int64(gap)
		out = append(out, Range{From: from, To: from + int64(size)})
		prev = from + int64(size)
	}
	return out
}

func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = fmt.Errorf("%s: %w", field, errTruncated)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) int32(field string) int32 {
	v := d.varint(field)
	if d.err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
		d.err = fmt.Errorf("%s %d out of int32 range", field, v)
	}
	return int32(v)
}

// decodeRecord decodes a value written by appendRecord, or by an earlier
// build (version 1). It returns an error, and never panics, on any other
// input.
func decodeRecord(b []byte) (Record, error) {
	if len(b) < 2 {
		return Record{}, errTruncated
	}
	var (
		flags uint64
		d     decoder
		known uint64
	)
	switch b[0] {
	case 1:
		flags, d, known = uint64(b[1]), decoder{b: b[2:]}, flagsKnownV1
	case valueVersion:
		f, n := binary.Uvarint(b[1:])
		if n <= 0 {
			return Record{}, errors.New("flags: bad varint")
		}
		flags, d, known = f, decoder{b: b[1+n:]}, flagsKnown
	default:
		return Record{}, fmt.Errorf("unknown value encoding version %d (this build reads 1 and %d)", b[0], valueVersion)
	}
	if flags&^known != 0 {
		return Record{}, fmt.Errorf("unknown flags %#x", flags)
	}
	if flags&flagResetAt != 0 && flags&flagReset == 0 {
		return Record{}, fmt.Errorf("flags %#x: reset time without reset", flags)
	}
	if flags&flagCommitAt != 0 && flags&flagCommit == 0 {
		return Record{}, fmt.Errorf("flags %#x: commit time without commit", flags)
	}
	r := emptyRecord()
	r.Watermark = d.varint("watermark")
	if flags&flagRecordedAt != 0 {
		r.RecordedAt = d.time("recorded-at time")
	}
	r.Generation = d.int32("generation")
	r.Member = d.string("member id")
	r.Committed = d.varint("committed offset")
	if flags&flagCommittedAt != 0 {
		r.CommittedAt = d.time("committed-at time")
	}
	if flags&flagReset != 0 {
		rs := new(Reset)
		if flags&flagResetAt != 0 {
			rs.At = d.time("reset time")
		}
		rs.From = d.varint("reset from offset")
		rs.To = d.varint("reset to offset")
		rs.Reason = d.string("reset reason")
		r.LastReset = rs
	}
	if flags&flagRun != 0 {
		run := new(RunState)
		switch open := d.byte("run open"); open {
		case 0, 1:
			run.Open = open == 1
		default:
			if d.err == nil {
				d.err = fmt.Errorf("run open: byte %d, want 0 or 1", open)
			}
		}
		run.Inflight = d.varint("in-flight offset")
		run.Crashes = d.int32("crash count")
		r.Run = run
	}
	if flags&flagCounts != 0 {
		r.Skipped = d.varint("skipped count")
		r.DeadLettered = d.varint("dead-lettered count")
	}
	if flags&flagCommit != 0 {
		c := new(CommitAttempt)
		c.Offset = d.varint("commit offset")
		c.Generation = d.int32("commit generation")
		if flags&flagCommitAt != 0 {
			c.At = d.time("commit time")
		}
		c.Outcome = CommitOutcome(d.byte("commit outcome"))
		c.Latency = time.Duration(d.varint("commit latency"))
		c.Error = d.string("commit error")
		r.LastCommit = c
	}
	if flags&flagCompleted != 0 && d.err == nil {
		r.Completed = d.completed(r.Watermark)
	}
	if d.err != nil {
		return Record{}, d.err
	}
	if len(d.b) != 0 {
		return Record{}, fmt.Errorf("%d unexpected trailing bytes", len(d.b))
	}
	if err := validateRecord(&r); err != nil {
		return Record{}, err
	}
	return r, nil
}

// partitionKey is the bbolt key of a partition: 4 bytes, big-endian, so that
// a cursor walks partitions in numeric order.
func partitionKey(p int32) [4]byte {
	var k [4]byte
	binary.BigEndian.PutUint32(k[:], uint32(p))
	return k
}

func decodePartitionKey(b []byte) (int32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("partition key is %d bytes, want 4", len(b))
	}
	p := int32(binary.BigEndian.Uint32(b))
	if p < 0 {
		return 0, fmt.Errorf("negative partition %d", p)
	}
	return p, nil
}
