package offsetstore

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func codecSamples() []Record {
	at := time.Unix(0, 1_717_000_000_123_456_789)
	return []Record{
		emptyRecord(),
		{Watermark: 0, Committed: 0},
		{Watermark: 42, RecordedAt: at, Generation: 7, Member: "consumer-1-5f1c", Committed: 40, CommittedAt: at},
		{Watermark: math.MaxInt64, Generation: math.MinInt32, Committed: math.MaxInt64, Member: strings.Repeat("m", maxStringLen)},
		{Watermark: 1, Generation: math.MaxInt32, Committed: -1, RecordedAt: time.Unix(0, math.MinInt64), CommittedAt: time.Unix(0, math.MaxInt64)},
		{Watermark: 500, Committed: -1, LastReset: &Reset{At: at, From: 10, To: 500, Reason: "retention: offset 10 out of range"}},
		{Watermark: 0, Committed: -1, LastReset: &Reset{From: -1, To: 0}},
		{Watermark: -1, Committed: -1, Member: "ünï\x00code", LastReset: &Reset{At: time.Unix(-5, 0), From: math.MaxInt64, To: math.MaxInt64}},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for i, r := range codecSamples() {
		if err := validateRecord(&r); err != nil {
			t.Fatalf("sample %d invalid: %v", i, err)
		}
		b := appendRecord(nil, &r)
		got, err := decodeRecord(b)
		if err != nil {
			t.Fatalf("sample %d: decode: %v", i, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("sample %d: round trip\n got %+v\nwant %+v", i, got, r)
		}
		// Appending to a non-empty buffer leaves the prefix alone.
		prefixed := appendRecord([]byte("xyz"), &r)
		if !bytes.Equal(prefixed[3:], b) || string(prefixed[:3]) != "xyz" {
			t.Errorf("sample %d: append to a prefix changed the encoding", i)
		}
	}
}

func TestRecordEncodingIsCompact(t *testing.T) {
	r := Record{Watermark: 1_000_000, RecordedAt: time.Now(), Generation: 12, Member: "consumer-1-0b7c6a3e", Committed: 999_000, CommittedAt: time.Now()}
	if n := len(appendRecord(nil, &r)); n > 48 {
		t.Errorf("typical record encodes to %d bytes, want <= 48", n)
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	valid := appendRecord(nil, &codecSamples()[5])
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"version only", []byte{1}, "truncated"},
		{"unknown version", []byte{2, 0, 0, 0, 0, 0}, "unknown value encoding version 2"},
		{"unknown flags", []byte{1, 0x10, 0, 0, 0, 0}, "unknown flags"},
		{"reset time without reset", []byte{1, flagResetAt, 0, 0, 0, 0}, "reset time without reset"},
		{"truncated", valid[:len(valid)-1], "truncated"},
		{"trailing bytes", append(append([]byte(nil), valid...), 0), "trailing"},
		{"watermark -2", []byte{1, 0, 3, 0, 0, 1}, "watermark -2"},
		{"committed -2", []byte{1, 0, 1, 0, 0, 3}, "committed offset -2"},
		{"generation overflow", append([]byte{1, 0, 1}, append(varint(math.MaxInt32+1), 0, 1)...), "out of int32 range"},
		{"huge member length", append([]byte{1, 0, 1, 0}, 0xff, 0xff, 0xff, 0xff, 0x0f), "member id is"},
		{"member past the end", []byte{1, 0, 1, 0, 5, 'a', 1}, "member id: value truncated"},
		{"overlong varint", []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, "bad varint"},
		{"reset to -1", []byte{1, flagReset, 1, 0, 0, 1, 1, 1, 0}, "reset to offset -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeRecord(tt.b)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("decodeRecord(%x) = %v, want an error containing %q", tt.b, err, tt.want)
			}
		})
	}
}

func varint(v int64) []byte { return binary.AppendVarint(nil, v) }

func FuzzDecodeRecord(f *testing.F) {
	for _, r := range codecSamples() {
		f.Add(appendRecord(nil, &r))
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{1, 0xff})
	f.Add([]byte{1, flagReset | flagResetAt, 0x80})
	f.Add([]byte{1, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			return
		}
		if err := validateRecord(&r); err != nil {
			t.Fatalf("decoded an invalid record %+v: %v", r, err)
		}
		// What decodes re-encodes to something that decodes to the same
		// record (varints may have been non-minimal, so not the same bytes).
		again, err := decodeRecord(appendRecord(nil, &r))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip changed the record\n got %+v\nwant %+v", again, r)
		}
	})
}

func TestPartitionKey(t *testing.T) {
	for _, p := range []int32{0, 1, 255, 256, math.MaxInt32} {
		k := partitionKey(p)
		got, err := decodePartitionKey(k[:])
		if err != nil || got != p {
			t.Errorf("partition %d: got %d, %v", p, got, err)
		}
	}
	a, b := partitionKey(9), partitionKey(10)
	if bytes.Compare(a[:], b[:]) >= 0 {
		t.Error("partition keys do not sort numerically")
	}
	for _, bad := range [][]byte{nil, {1, 2, 3}, {1, 2, 3, 4, 5}, {0x80, 0, 0, 0}} {
		if _, err := decodePartitionKey(bad); err == nil {
			t.Errorf("decodePartitionKey(%x) succeeded", bad)
		}
	}
}

func TestPatchMerge(t *testing.T) {
	at := time.Unix(100, 0)
	wm := patch{fields: setWatermark | setOwner, rec: Record{Watermark: 5, RecordedAt: at, Generation: 2, Member: "a"}}
	cm := patch{fields: setCommitted, rec: Record{Committed: 4, CommittedAt: at}}
	wm2 := patch{fields: setWatermark | setOwner, rec: Record{Watermark: 6, RecordedAt: at, Generation: 3, Member: "b"}}
	got := wm.merge(cm).merge(wm2).apply(emptyRecord())
	want := Record{Watermark: 6, RecordedAt: at, Generation: 3, Member: "b", Committed: 4, CommittedAt: at}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	// An older patch merged under a newer one (the retry path) keeps the
	// newer values and the older patch's other fields.
	got = cm.merge(wm2).apply(Record{Watermark: 1, Committed: 1, Member: "x"})
	want = Record{Watermark: 6, RecordedAt: at, Generation: 3, Member: "b", Committed: 4, CommittedAt: at}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}
