package framework

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/segmentio/kafka-go/compress"
)

// testBatch is a v2 record batch at base of producer (-1: none) with
// attrs, holding one record per key/value pair, at consecutive offsets.
func testBatch(base, producer int64, attrs int16, kvs ...[2][]byte) []byte {
	var recs []byte
	for i, kv := range kvs {
		var body []byte
		body = append(body, 0) // attributes
		body = binary.AppendVarint(body, 0)
		body = binary.AppendVarint(body, int64(i))
		body = appendVarBytes(body, kv[0])
		body = appendVarBytes(body, kv[1])
		body = binary.AppendVarint(body, 0) // headers
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	if attrs&attrCodec == 1 { // gzip
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(recs)
		w.Close()
		recs = buf.Bytes()
	}
	return frameRaw(base, producer, attrs, int32(len(kvs)), int32(len(kvs)-1), recs)
}

// frameRaw frames records (as written, compressed or not) into a batch.
func frameRaw(base, producer int64, attrs int16, count, lastDelta int32, recs []byte) []byte {
	b := make([]byte, frameSize+batchRecords, frameSize+batchRecords+len(recs))
	binary.BigEndian.PutUint64(b, uint64(base))
	binary.BigEndian.PutUint32(b[frameLength:], uint32(batchRecords+len(recs)))
	h := b[frameSize:]
	h[batchMagic] = 2
	binary.BigEndian.PutUint16(h[batchAttrs:], uint16(attrs))
	binary.BigEndian.PutUint32(h[batchLastOff:], uint32(lastDelta))
	binary.BigEndian.PutUint64(h[batchProduce:], uint64(producer))
	binary.BigEndian.PutUint32(h[batchCount:], uint32(count))
	b = append(b, recs...)
	h = b[frameSize:]
	binary.BigEndian.PutUint32(h[batchCRC:], crc32.Checksum(h[batchAttrs:], crc32c))
	return b
}

func appendVarBytes(b, v []byte) []byte {
	if v == nil {
		return binary.AppendVarint(b, -1)
	}
	return append(binary.AppendVarint(b, int64(len(v))), v...)
}

// values are n user records.
func values(n int) [][2][]byte {
	out := make([][2][]byte, n)
	for i := range out {
		out[i] = [2][]byte{nil, []byte{byte('a' + i)}}
	}
	return out
}

// marker is a control batch of producer at base: abort or commit.
func marker(base, producer int64, typ int16) []byte {
	key := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 0), uint16(typ))
	val := []byte{0, 0, 0, 0, 0, 0} // version, coordinator epoch
	return testBatch(base, producer, attrTransactional|attrControl, [2][]byte{key, val})
}

// decodeAll runs nextBatch over b as the partition's goroutine does.
func decodeAll(t *testing.T, d *decoded, b []byte) ([]int64, error) {
	t.Helper()
	var got []int64
	for len(b) > 0 {
		d.msgs = d.msgs[:0]
		n, err := nextBatch(d, "t", 0, 0, b)
		for _, m := range d.msgs {
			got = append(got, m.Offset)
		}
		if err != nil || n == 0 {
			return got, err
		}
		b = b[n:]
	}
	return got, nil
}

const txnA, txnB = 7, 8

// txnLog is a partition's log: producer A's transaction 0-2 aborted (its
// marker at 3), producer B's 4-5 committed (marker at 6), a plain record
// at 7, A's next transaction 8-9 committed (marker at 10).
func txnLog() []byte {
	var b []byte
	b = append(b, testBatch(0, txnA, attrTransactional, values(3)...)...)
	b = append(b, marker(3, txnA, controlAbort)...)
	b = append(b, testBatch(4, txnB, attrTransactional, values(2)...)...)
	b = append(b, marker(6, txnB, controlCommit)...)
	b = append(b, testBatch(7, -1, 0, values(1)...)...)
	b = append(b, testBatch(8, txnA, attrTransactional, values(2)...)...)
	b = append(b, marker(10, txnA, controlCommit)...)
	return b
}

func TestReadCommittedDropsAbortedTransactions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		d       decoded
		want    []int64
		end     int64
		aborted int
	}{
		{"read uncommitted: every user record, no marker", decoded{}, []int64{0, 1, 2, 4, 5, 7, 8, 9}, 11, 0},
		{"read committed", decoded{readCommitted: true, lso: 11, txn: newTxnFilter([]abortedTxn{{txnA, 0}})},
			[]int64{4, 5, 7, 8, 9}, 11, 3},
		{"an aborted transaction that began before the fetch", decoded{end: 1, readCommitted: true, lso: 11, txn: newTxnFilter([]abortedTxn{{txnA, 0}})},
			[]int64{4, 5, 7, 8, 9}, 11, 2},
		{"nothing at or above the LSO", decoded{readCommitted: true, lso: 6, txn: newTxnFilter([]abortedTxn{{txnA, 0}})},
			[]int64{4, 5}, 6, 3},
		{"the LSO inside a batch", decoded{readCommitted: true, lso: 9, txn: newTxnFilter([]abortedTxn{{txnA, 0}})},
			[]int64{4, 5, 7, 8}, 9, 3},
		{"no aborted transaction reported", decoded{readCommitted: true, lso: 11, txn: newTxnFilter(nil)},
			[]int64{0, 1, 2, 4, 5, 7, 8, 9}, 11, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			got, err := decodeAll(t, &d, txnLog())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || d.end != tc.end || d.aborted != tc.aborted {
				t.Errorf("handed out %v, end %d, aborted %d; want %v, end %d, aborted %d", got, d.end, d.aborted, tc.want, tc.end, tc.aborted)
			}
		})
	}
}

// Two producers' transactions interleave: only the aborted one's batches
// are dropped, on either side of the other's.
func TestReadCommittedInterleavedProducers(t *testing.T) {
	var b []byte
	b = append(b, testBatch(0, txnA, attrTransactional, values(1)...)...)
	b = append(b, testBatch(1, txnB, attrTransactional, values(1)...)...)
	b = append(b, testBatch(2, txnA, attrTransactional|1, values(2)...)...) // gzip
	b = append(b, marker(4, txnB, controlCommit)...)
	b = append(b, testBatch(5, txnA, attrTransactional, values(1)...)...)
	b = append(b, marker(6, txnA, controlAbort)...)
	d := decoded{readCommitted: true, lso: 7, txn: newTxnFilter(abortedTxns(nil))}
	d.txn = newTxnFilter([]abortedTxn{{txnA, 0}})
	got, err := decodeAll(t, &d, b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int64{1}) || d.end != 7 || d.aborted != 4 {
		t.Errorf("handed out %v, end %d, aborted %d; want [1], end 7, aborted 4", got, d.end, d.aborted)
	}
}

// A control record that cannot be read stops the partition there, at
// either isolation level: nothing after it is skipped past.
func TestMalformedControlRecordStops(t *testing.T) {
	short := testBatch(3, txnA, attrTransactional|attrControl, [2][]byte{{0, 0}, nil})
	empty := frameRaw(3, txnA, attrTransactional|attrControl, 0, 0, nil)
	for name, bad := range map[string][]byte{"short key": short, "no record": empty} {
		for _, rc := range []bool{false, true} {
			var b []byte
			b = append(b, testBatch(0, txnA, attrTransactional, values(3)...)...)
			b = append(b, bad...)
			b = append(b, testBatch(4, -1, 0, values(1)...)...)
			d := decoded{readCommitted: rc, lso: 5, txn: newTxnFilter(nil)}
			got, err := decodeAll(t, &d, b)
			if err == nil || !strings.Contains(err.Error(), "control batch at offset 3 (producer 7)") {
				t.Fatalf("%s, read committed %v: error %v, want one naming the control batch at offset 3", name, rc, err)
			}
			if !slices.Equal(got, []int64{0, 1, 2}) || d.end != 3 {
				t.Errorf("%s, read committed %v: handed out %v, end %d; want [0 1 2], end 3", name, rc, got, d.end)
			}
		}
	}
}

// A compressed batch that inflates beyond the bound is an error, not an
// allocation of whatever it asks for.
func TestInflateBounded(t *testing.T) {
	big := [2][]byte{nil, make([]byte, 1<<20)}
	b := testBatch(0, -1, 1, big) // gzip: a few KiB on the wire
	d := decoded{maxInflate: 64 << 10}
	_, err := decodeAll(t, &d, b)
	if err == nil || !strings.Contains(err.Error(), "inflates beyond 65536 bytes") || !strings.Contains(err.Error(), "offset 0") {
		t.Fatalf("error %v, want one saying the batch at offset 0 inflates beyond the bound", err)
	}
	d = decoded{maxInflate: 2 << 20}
	if got, err := decodeAll(t, &d, b); err != nil || len(got) != 1 {
		t.Fatalf("within the bound: %v, %v", got, err)
	}
}

// FuzzReadCommitted decodes hostile batches at ReadCommitted, with an
// aborted transaction of the fuzzed producer: no panic, errors name an
// offset, offsets increase, nothing at or above the LSO, and the position
// never moves back or past the LSO.
func FuzzReadCommitted(f *testing.F) {
	f.Add(txnLog(), int64(0), int64(11), int64(txnA), int64(0))
	f.Add(txnLog(), int64(1), int64(9), int64(txnB), int64(4))
	f.Add(append(testBatch(0, txnA, attrTransactional|1, values(2)...), marker(2, txnA, controlAbort)...), int64(0), int64(3), int64(txnA), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, from, lso, producer, first int64) {
		d := decoded{end: from, readCommitted: true, lso: lso, txn: newTxnFilter([]abortedTxn{{producer, first}}), maxInflate: 1 << 20}
		decodeFuzzed(t, &d, b, func(d *decoded, last int64) string {
			switch {
			case last >= lso && last >= from:
				return fmt.Sprintf("message at offset %d at or above the LSO %d", last, lso)
			case d.end < from || (d.end > lso && d.end > from):
				return fmt.Sprintf("position %d, LSO %d", d.end, lso)
			}
			return ""
		})
	})
}

// zstd batches: a frame that states its size is decoded in one call into
// exactly that, and refused when it states more than the bound; a frame
// without its size (the Java client's streaming encoder), several frames
// and a damaged frame go through the streaming reader, which gives the
// same records or the same refusal.
func TestDecompressZstd(t *testing.T) {
	payload := bytes.Repeat([]byte("tidemark "), 10_000) // 90,000 bytes
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	sized := enc.EncodeAll(payload, nil)
	var stream bytes.Buffer
	sw, err := zstd.NewWriter(&stream) // no content size in the frame
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(payload); i += 9_000 { // flushed as it goes: its size unknown to the header
		if _, err := sw.Write(payload[i : i+9_000]); err != nil {
			t.Fatal(err)
		}
		if err := sw.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	var h zstd.Header
	if err := h.Decode(stream.Bytes()); err != nil || h.HasFCS {
		t.Fatalf("the streaming frame's header: %+v, %v; want no content size", h, err)
	}
	twoFrames := append(slices.Clone(sized), sized...)
	for _, c := range []struct {
		name  string
		in    []byte
		limit int
		want  []byte
		fast  bool
	}{
		{"sized", sized, 1 << 20, payload, true},
		{"sized, over the bound", sized, 50_000, nil, true},
		{"no size", stream.Bytes(), 1 << 20, payload, false},
		{"no size, over the bound", stream.Bytes(), 50_000, nil, false},
		{"two frames", twoFrames, 1 << 20, append(slices.Clone(payload), payload...), false},
		{"two frames, over the bound", twoFrames, 100_000, nil, false},
	} {
		_, fast, _ := decompressZstd(c.in, c.limit)
		if fast != c.fast {
			t.Errorf("%s: decoded in one call %v, want %v", c.name, fast, c.fast)
		}
		for _, hint := range []int{0, 100, len(c.want)} {
			got, err := decompress(compress.Zstd, c.in, c.limit, hint)
			switch {
			case c.want == nil && !errors.Is(err, errInflate):
				t.Errorf("%s, hint %d: %d bytes, %v; want an error wrapping errInflate", c.name, hint, len(got), err)
			case c.want != nil && (err != nil || !bytes.Equal(got, c.want)):
				t.Errorf("%s, hint %d: %d bytes, %v; want the %d bytes encoded", c.name, hint, len(got), err, len(c.want))
			case c.want != nil && cap(got)-len(got) > len(got)/4:
				t.Errorf("%s, hint %d: a buffer of %d for %d bytes: the messages would keep the slack", c.name, hint, cap(got), len(got))
			}
		}
	}
	damaged := slices.Clone(sized)
	damaged[len(damaged)/2] ^= 0xff
	if got, err := decompress(compress.Zstd, damaged, 1<<20, 0); err == nil && bytes.Equal(got, payload) {
		t.Error("a damaged frame decoded to the payload")
	}
}
