package wire

import (
	"encoding/binary"
	"hash/crc32"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// crcFrom is where a record batch's CRC starts counting: after the base
// offset (8), the length (4), the partition leader epoch (4), the magic
// byte (1) and the CRC itself (4).
const crcFrom = 8 + 4 + 4 + 1 + 4

// batchHeader is the size of the part of a batch its Length field does not
// count: the base offset and the length.
const batchHeader = 8 + 4

// OneRecordBatch encodes one record as an uncompressed v2 record batch for
// a Produce request, without a producer id (not idempotent).
func OneRecordBatch(ts time.Time, key, value []byte, headers []kafka.Header) []byte {
	r := kmsg.Record{Key: key, Value: value}
	for _, h := range headers {
		r.Headers = append(r.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	// The record's length is a varint in front of what it counts: encode it
	// once to learn the size, then with it.
	r.Length = int32(len(r.AppendTo(nil)) - 1)
	ms := ts.UnixMilli()
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, FirstTimestamp: ms, MaxTimestamp: ms,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 1,
		Records: r.AppendTo(nil),
	}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-batchHeader))
	binary.BigEndian.PutUint32(out[crcFrom-4:], crc32.Checksum(out[crcFrom:], crc32c))
	return out
}
