package framework

import (
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A changelog batch as the writer encodes it reads back as the restore
// decodes it: a marker, a change and a tombstone, with their offsets,
// epochs and source offsets; records below from are skipped; a record
// without tidemark's headers is refused.
func TestChangelogBatchRoundTrip(t *testing.T) {
	recs := []logRecord{
		{marker: true, src: 40},
		{key: []byte("a"), value: []byte("1"), src: 40, epoch: 10},
		{key: []byte("b"), del: true, src: 45, epoch: 10},
		{key: []byte("c"), value: nil, src: 45, epoch: 10}, // an empty value, not a delete
	}
	b := encodeLogBatch(time.Unix(1, 0), 7, 0, 3, recs)
	binary.BigEndian.PutUint64(b, 10) // the broker's base offset
	var batch kmsg.RecordBatch
	if err := batch.ReadFrom(b); err != nil {
		t.Fatal(err)
	}
	if batch.ProducerID != 7 || batch.FirstSequence != 3 || batch.NumRecords != 4 || batch.LastOffsetDelta != 3 {
		t.Fatalf("batch header: producer %d, sequence %d, %d records, last delta %d", batch.ProducerID, batch.FirstSequence, batch.NumRecords, batch.LastOffsetDelta)
	}
	var got []logEntry
	next, err := decodeLog(b, 11, 100, func(e logEntry) { got = append(got, e) })
	if err != nil {
		t.Fatal(err)
	}
	if next != 14 || len(got) != 3 {
		t.Fatalf("next %d, %d entries: %+v", next, len(got), got)
	}
	if e := got[0]; e.at != 11 || e.marker || string(e.key) != "a" || string(e.value) != "1" || e.del || e.epoch != 10 || e.src != 40 {
		t.Fatalf("the change: %+v", e)
	}
	if e := got[1]; e.at != 12 || !e.del || string(e.key) != "b" || e.src != 45 {
		t.Fatalf("the tombstone: %+v", e)
	}
	if e := got[2]; e.del || len(e.value) != 0 {
		t.Fatalf("the empty value: %+v", e)
	}
	got = nil
	if _, err := decodeLog(b, 10, 11, func(e logEntry) { got = append(got, e) }); err != nil || len(got) != 1 || !got[0].marker || got[0].start != 40 || len(got[0].key) != 0 {
		t.Fatalf("the marker: %+v, %v", got, err)
	}

	if _, err := decodeLog(foreignBatch(5), 0, 100, func(logEntry) {}); err == nil || !strings.Contains(err.Error(), "not tidemark's") {
		t.Fatalf("a foreign record: %v", err)
	}
	b[len(b)-1] ^= 1
	if _, err := decodeLog(b, 0, 100, func(logEntry) {}); err == nil || !strings.Contains(err.Error(), "CRC mismatch") {
		t.Fatalf("a damaged batch: %v", err)
	}
	if v, err := parseDecimal([]byte("-1")); v != -1 || err != nil {
		t.Fatalf("parseDecimal(-1): %d, %v", v, err)
	}
	for _, bad := range []string{"", "-", "1x", "99999999999999999999"} {
		if _, err := parseDecimal([]byte(bad)); err == nil {
			t.Fatalf("parseDecimal(%q): no error", bad)
		}
	}
}

// foreignBatch is a batch at base of one record without tidemark's
// headers: another writer's.
func foreignBatch(base int64) []byte {
	rec := kmsg.Record{Key: []byte("x"), Value: []byte("y")}
	rec.Length = int32(len(rec.AppendTo(nil)) - 1)
	batch := kmsg.RecordBatch{FirstOffset: base, PartitionLeaderEpoch: -1, Magic: 2, ProducerID: -1, NumRecords: 1, Records: rec.AppendTo(nil)}
	out := batch.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32c))
	return out
}
