package offsetstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Value encoding, version 1:
//
//	byte     encoding version (1)
//	byte     flags: 1 RecordedAt set, 2 CommittedAt set, 4 LastReset set, 8 LastReset.At set
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
//
// Varints are encoding/binary's zig-zag signed varints. A zero time is
// stored as an absent field.
const valueVersion = 1

const (
	flagRecordedAt = 1 << iota
	flagCommittedAt
	flagReset
	flagResetAt
	flagsKnown = flagRecordedAt | flagCommittedAt | flagReset | flagResetAt
)

// appendRecord appends the encoding of r to b. r must have passed
// validateRecord.
func appendRecord(b []byte, r *Record) []byte {
	var flags byte
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
	b = append(b, valueVersion, flags)
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
	if d.err != nil {
		return ""
	}
	n, m := binary.Uvarint(d.b)
	if m <= 0 {
		d.err = fmt.Errorf("%s length: bad varint", field)
		if m == 0 {
			d.err = fmt.Errorf("%s length: %w", field, errTruncated)
		}
		return ""
	}
	d.b = d.b[m:]
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

// decodeRecord decodes a value written by appendRecord. It returns an error,
// and never panics, on any other input.
func decodeRecord(b []byte) (Record, error) {
	if len(b) < 2 {
		return Record{}, errTruncated
	}
	if b[0] != valueVersion {
		return Record{}, fmt.Errorf("unknown value encoding version %d (this build reads %d)", b[0], valueVersion)
	}
	flags := b[1]
	if flags&^flagsKnown != 0 {
		return Record{}, fmt.Errorf("unknown flags %#x", flags)
	}
	if flags&flagResetAt != 0 && flags&flagReset == 0 {
		return Record{}, fmt.Errorf("flags %#x: reset time without reset", flags)
	}
	d := decoder{b: b[2:]}
	var r Record
	r.Watermark = d.varint("watermark")
	if flags&flagRecordedAt != 0 {
		r.RecordedAt = d.time("recorded-at time")
	}
	gen := d.varint("generation")
	if d.err == nil && (gen < math.MinInt32 || gen > math.MaxInt32) {
		d.err = fmt.Errorf("generation %d out of int32 range", gen)
	}
	r.Generation = int32(gen)
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
