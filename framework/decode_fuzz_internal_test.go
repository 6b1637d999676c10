package framework

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// Fuzz tests of the decoders of bytes from the network: record batches
// (a partition's part of a Fetch response) and the group protocol's member
// metadata and assignments, written by other clients. None may panic; a
// malformed input is an error that names where it stopped.

// seedBatches are record batches as brokers send them: one record, with
// and without a key and headers, and two batches back to back.
func seedBatches() [][]byte {
	t0 := time.Unix(1700000000, 0)
	one := wire.OneRecordBatch(t0, []byte("k"), []byte("v"), []kafka.Header{{Key: "h", Value: []byte("x")}})
	bare := wire.OneRecordBatch(t0, nil, []byte("value"), nil)
	return [][]byte{one, bare, append(bytes.Clone(one), bare...), one[:len(one)-3], {}}
}

func FuzzNextBatch(f *testing.F) {
	for _, b := range seedBatches() {
		f.Add(b, int64(0))
	}
	f.Fuzz(func(t *testing.T, b []byte, from int64) {
		end, err := scanBatches(b, from)
		if err != nil {
			if !strings.Contains(err.Error(), "offset") {
				t.Fatalf("scanBatches error %q does not name an offset", err)
			}
			return
		}
		if end < from {
			t.Fatalf("scanBatches moved back: %d from %d", end, from)
		}
		decodeFuzzed(t, &decoded{end: from}, b, nil)
		sameInPieces(t, b, from)
		sameScanned(t, b)
	})
}

// sameScanned fails t unless scanAnswer finds, in an answer of more
// partitions than it has lanes (b, its tails and heads, and the seeds,
// over two topics), what scanBatches finds in each partition.
func sameScanned(t *testing.T, b []byte) {
	t.Helper()
	parts := [][]byte{b}
	for _, k := range []int{1, frameSize, len(b) / 2, len(b) - 1} {
		if k > 0 && k < len(b) {
			parts = append(parts, b[k:], b[:k])
		}
	}
	parts = append(parts, seedBatches()...)
	parts = append(parts, b)
	res := &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: "a"}, {Topic: "empty"}, {Topic: "b"}}}
	for i, p := range parts {
		tp := &res.Topics[2*(i%2)]
		tp.Partitions = append(tp.Partitions, kmsg.FetchResponseTopicPartition{Partition: int32(i), RecordBatches: p})
	}
	ends := scanAnswer(res, nil)
	k := 0
	for _, tp := range res.Topics {
		for _, p := range tp.Partitions {
			end, err := scanBatches(p.RecordBatches, -1)
			if err != nil {
				end = scanMalformed
			}
			if ends[k] != end {
				t.Fatalf("partition %d of %d: scanAnswer found end %d; one at a time: %d (%v)", k, len(parts), ends[k], end, err)
			}
			k++
		}
	}
	if k != len(ends) {
		t.Fatalf("scanAnswer found %d ends for %d partitions", len(ends), k)
	}
}

// TestVarint checks recordReader.varint, whose one-byte case is its own,
// against binary.Varint, for values of one to ten bytes and truncated ones.
func TestVarint(t *testing.T) {
	vals := []int64{math.MinInt64, math.MaxInt64, -1 << 40, 1 << 40}
	for v := int64(-70000); v <= 70000; v++ {
		vals = append(vals, v)
	}
	for _, v := range vals {
		b := binary.AppendVarint(nil, v)
		for cut := 0; cut <= len(b); cut++ {
			r := recordReader{b: b[:cut]}
			got, ok := r.varint()
			want, n := binary.Varint(b[:cut])
			if ok != (n > 0) || (ok && (got != want || r.i != n)) {
				t.Fatalf("%d, %d of its %d bytes: varint %d, %v after %d bytes; binary.Varint %d, %d", v, cut, len(b), got, ok, r.i, want, n)
			}
		}
	}
}

// nextBatch decodes the first record batch of b whole: readBatch without a
// limit.
func nextBatch(d *decoded, topic string, partition int, hwm int64, b []byte) (int, error) {
	n, _, err := readBatch(d, topic, partition, hwm, b, 0)
	return n, err
}

// sameInPieces fails t unless decoding b from offset from a few records at
// a time (readBatch's limit, as a partition does) yields what decoding
// each batch whole yields: the same messages, end and error.
func sameInPieces(t *testing.T, b []byte, from int64) {
	t.Helper()
	whole := decodePieces(b, from, 0)
	for _, limit := range []int{1, 2, 7} {
		if got := decodePieces(b, from, limit); !reflect.DeepEqual(got, whole) {
			t.Fatalf("fetched from %d, %d records at a time: %+v; whole batches: %+v", from, limit, got, whole)
		}
	}
}

type decodeResult struct {
	msgs []kafka.Message
	end  int64
	err  string
}

// decodePieces decodes b from offset from, limit records per readBatch call.
func decodePieces(b []byte, from int64, limit int) decodeResult {
	d := &decoded{end: from}
	var out decodeResult
	for raw := b; len(raw) > 0; {
		d.msgs = d.msgs[:0]
		n, more, err := readBatch(d, "t", 0, 0, raw, limit)
		out.msgs = append(out.msgs, d.msgs...)
		if err != nil {
			out.err = err.Error()
			break
		}
		if more {
			continue
		}
		if n == 0 {
			break
		}
		raw = raw[n:]
	}
	out.end = d.end
	return out
}

// decodeFuzzed runs nextBatch over b as the partition's goroutine does,
// from d, and fails t on a message out of offset order, an error that
// names no offset, or what check (if set) reports after each batch.
func decodeFuzzed(t *testing.T, d *decoded, b []byte, check func(d *decoded, last int64) string) {
	t.Helper()
	from := d.end
	last := from - 1
	for raw := b; len(raw) > 0; {
		d.msgs = d.msgs[:0]
		n, err := nextBatch(d, "t", 0, 0, raw)
		for _, m := range d.msgs {
			if m.Offset <= last {
				t.Fatalf("message at offset %d after %d (fetched from %d)", m.Offset, last, from)
			}
			last = m.Offset
		}
		if check != nil {
			if bad := check(d, last); bad != "" {
				t.Fatalf("fetched from %d: %s", from, bad)
			}
		}
		if err != nil {
			if !strings.Contains(err.Error(), "offset") {
				t.Fatalf("nextBatch error %q does not name an offset", err)
			}
			return
		}
		if n == 0 {
			return
		}
		raw = raw[n:]
	}
}

func FuzzDecodeSubscription(f *testing.F) {
	owned := []topicPartition{{"a", 0}, {"b", 3}}
	for _, v := range []int16{0, 1} {
		f.Add(encodeSubscription([]string{"a", "b"}, owned, v))
	}
	f.Add(encodeAssignment(owned))
	f.Add([]byte{0, 3, 0, 0, 0, 1, 0, 1, 'a', 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, owned, err := decodeSubscription(b); err == nil {
			for _, tp := range owned {
				if tp.partition < 0 {
					t.Fatalf("negative partition %v decoded", tp)
				}
			}
		} else if !strings.Contains(err.Error(), "member metadata") {
			t.Fatalf("error %q does not say what failed", err)
		}
		if tps, err := decodeAssignment(b); err == nil {
			for _, tp := range tps {
				if tp.partition < 0 {
					t.Fatalf("negative partition %v decoded", tp)
				}
			}
		} else if !strings.Contains(err.Error(), "assignment") {
			t.Fatalf("error %q does not say what failed", err)
		}
	})
}

// A batch whose records lie is an error at its offset, not a panic; the
// records before the bad one are still delivered (FuzzNextBatch's seeds
// are checked here too, so that a broken seed fails at once).
func TestSeedBatchesDecode(t *testing.T) {
	for i, b := range seedBatches()[:3] {
		d := decoded{}
		n, err := nextBatch(&d, "t", 0, 0, b)
		if err != nil || n == 0 || len(d.msgs) != 1 {
			t.Fatalf("seed %d: n %d, %d messages, %v", i, n, len(d.msgs), err)
		}
	}
	bad := bytes.Clone(seedBatches()[0])
	bad[len(bad)-1] ^= 0xff
	if _, err := nextBatch(&decoded{}, "t", 0, 0, bad); err == nil || !strings.Contains(err.Error(), "CRC mismatch") {
		t.Fatalf("a corrupted batch: %v, want a CRC mismatch", err)
	}
}

// frameBatch wraps records (the encoded records of a batch, compressed or
// not) in a v2 batch frame with a valid CRC, so that the fuzzer reaches the
// record decoding and decompression behind the CRC check.
func frameBatch(base int64, attrs int16, count int32, lastDelta int32, records []byte) []byte {
	b := make([]byte, frameSize+batchRecords, frameSize+batchRecords+len(records))
	binary.BigEndian.PutUint64(b, uint64(base))
	binary.BigEndian.PutUint32(b[frameLength:], uint32(batchRecords+len(records)))
	batch := b[frameSize:]
	binary.BigEndian.PutUint32(batch, 0xffffffff) // partition leader epoch
	batch[batchMagic] = 2
	binary.BigEndian.PutUint16(batch[batchAttrs:], uint16(attrs))
	binary.BigEndian.PutUint32(batch[batchLastOff:], uint32(lastDelta))
	binary.BigEndian.PutUint32(batch[batchCount:], uint32(count))
	b = append(b, records...)
	binary.BigEndian.PutUint32(b[frameSize+batchCRC:], crc32.Checksum(b[frameSize+batchAttrs:], crc32c))
	return b
}

func FuzzBatchRecords(f *testing.F) {
	for _, b := range seedBatches()[:2] {
		f.Add(int16(0), int32(1), int32(0), b[frameSize+batchRecords:])
	}
	for codec := int16(1); codec <= 4; codec++ {
		f.Add(codec, int32(1), int32(0), []byte{0x10, 0, 0, 0, 1, 2, 3})
	}
	f.Add(int16(attrControl), int32(1), int32(0), []byte{})
	f.Fuzz(func(t *testing.T, attrs int16, count, lastDelta int32, records []byte) {
		b := frameBatch(100, attrs, count, lastDelta, records)
		d := decoded{end: 100}
		n, err := nextBatch(&d, "t", 0, 0, b)
		if err != nil {
			if !strings.Contains(err.Error(), "offset") {
				t.Fatalf("error %q does not name an offset", err)
			}
			return
		}
		if n != len(b) {
			t.Fatalf("read %d of a whole batch of %d bytes", n, len(b))
		}
		for _, m := range d.msgs {
			if m.Offset < 100 || m.Offset > 100+int64(lastDelta) {
				t.Fatalf("message at offset %d outside the batch [100, %d]", m.Offset, 100+int64(lastDelta))
			}
		}
	})
}

// readCorpus reads the arguments of a "go test fuzz v1" file.
func readCorpus(t *testing.T, path string) []any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a fuzz corpus file", path)
	}
	var args []any
	for _, l := range lines[1:] {
		typ, lit, ok := strings.Cut(strings.TrimSuffix(l, ")"), "(")
		if !ok {
			t.Fatalf("%s: bad line %q", path, l)
		}
		if typ == "[]byte" {
			s, err := strconv.Unquote(lit)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, l, err)
			}
			args = append(args, []byte(s))
			continue
		}
		n, err := strconv.ParseInt(lit, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", path, l, err)
		}
		args = append(args, n)
	}
	return args
}

// The seed corpora from real brokers and clients (make fuzz-corpus) decode
// without an error: each file's batches whole, each member's metadata to
// the records topic and each assignment to some of its partitions. A
// decoder that refuses what a real client wrote fails here, not only
// under the fuzzer.
func TestRealCorpusDecodes(t *testing.T) {
	files, _ := filepath.Glob("testdata/fuzz/Fuzz*/*")
	if len(files) == 0 {
		t.Fatal("no corpus files in testdata/fuzz")
	}
	for _, path := range files {
		args := readCorpus(t, path)
		switch filepath.Base(filepath.Dir(path)) {
		case "FuzzNextBatch":
			b, n := args[0].([]byte), 0
			d := decoded{end: args[1].(int64)}
			for len(b) > 0 {
				used, err := nextBatch(&d, "t", 0, 0, b)
				if err != nil || used == 0 {
					t.Fatalf("%s: batch at byte %d: %d bytes used, %v", path, n, used, err)
				}
				b, n = b[used:], n+used
			}
			if len(d.msgs) == 0 {
				t.Fatalf("%s: no messages", path)
			}
			sameInPieces(t, args[0].([]byte), args[1].(int64))
		case "FuzzBatchRecords":
			attrs, count, last, recs := int16(args[0].(int64)), int32(args[1].(int64)), int32(args[2].(int64)), args[3].([]byte)
			d := decoded{end: 100}
			if _, err := nextBatch(&d, "t", 0, 0, frameBatch(100, attrs, count, last, recs)); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if attrs&attrControl == 0 && len(d.msgs) != int(count) {
				t.Fatalf("%s: %d messages, want %d", path, len(d.msgs), count)
			}
		case "FuzzReadCommitted":
			// The transactional partition: committed, aborted, committed
			// transactions of 3 records each.
			b, lso := args[0].([]byte), args[2].(int64)
			d := decoded{readCommitted: true, lso: lso, txn: newTxnFilter([]abortedTxn{{args[3].(int64), args[4].(int64)}}), maxInflate: 1 << 20}
			for len(b) > 0 {
				used, err := nextBatch(&d, "t", 0, 0, b)
				if err != nil || used == 0 {
					t.Fatalf("%s: %d bytes used, %v", path, used, err)
				}
				b = b[used:]
			}
			if len(d.msgs) != 6 {
				t.Fatalf("%s: %d committed messages, want 6", path, len(d.msgs))
			}
		case "FuzzDecodeSubscription":
			b := args[0].([]byte)
			switch {
			case strings.HasSuffix(path, "-metadata"):
				topics, _, err := decodeSubscription(b)
				if err != nil || len(topics) != 1 || !strings.HasPrefix(topics[0], "fuzzcorpus-records-") {
					t.Fatalf("%s: topics %q, %v", path, topics, err)
				}
			case strings.HasSuffix(path, "-assignment"):
				tps, err := decodeAssignment(b)
				if err != nil || len(tps) == 0 {
					t.Fatalf("%s: partitions %v, %v", path, tps, err)
				}
			}
		}
	}
}
