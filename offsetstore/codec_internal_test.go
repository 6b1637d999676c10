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
		{Watermark: 7, Committed: 5, Run: &RunState{Open: true, Inflight: 7, Crashes: 3}, Skipped: 2, DeadLettered: math.MaxInt64,
			LastCommit: &CommitAttempt{Offset: 7, Generation: 9, At: at, Outcome: CommitUnknown, Latency: 10 * time.Second, Error: "i/o timeout"}},
		{Watermark: 0, Committed: -1, Run: &RunState{Inflight: -1}, LastCommit: &CommitAttempt{Outcome: CommitOK}},
		{Watermark: 3, Committed: 3, Skipped: 1, LastCommit: &CommitAttempt{Offset: 3, Generation: math.MinInt32, Outcome: CommitFenced, At: time.Unix(0, math.MinInt64)}},
	}
}

// Records written by the previous encoding (version 1) still decode.
func TestDecodeVersion1(t *testing.T) {
	at := time.Unix(0, 1_717_000_000_123_456_789)
	// version 1, flags RecordedAt|Reset|ResetAt, watermark 500, at, gen 7,
	// member "m", committed -1, reset at, from 10, to 500, reason "r".
	b := []byte{1, flagRecordedAt | flagReset | flagResetAt}
	b = append(b, varint(500)...)
	b = append(b, varint(at.UnixNano())...)
	b = append(b, varint(7)...)
	b = append(b, 1, 'm')
	b = append(b, varint(-1)...)
	b = append(b, varint(at.UnixNano())...)
	b = append(b, varint(10)...)
	b = append(b, varint(500)...)
	b = append(b, 1, 'r')
	got, err := decodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Record{Watermark: 500, RecordedAt: at, Generation: 7, Member: "m", Committed: -1,
		LastReset: &Reset{At: at, From: 10, To: 500, Reason: "r"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// Version 1 has no flags above 8.
	if _, err := decodeRecord([]byte{1, flagRun, 0, 0, 0, 0}); err == nil || !strings.Contains(err.Error(), "unknown flags") {
		t.Fatalf("version 1 with a run flag: %v", err)
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
		{"unknown version", []byte{3, 0, 0, 0, 0, 0}, "unknown value encoding version 3"},
		{"v2 unknown flags", []byte{2, 0x80, 0x02, 0, 0, 0, 0}, "unknown flags"},
		{"v2 bad flags varint", []byte{2, 0x80}, "flags: bad varint"},
		{"commit time without commit", []byte{2, 0x80, 0x01, 0, 0, 0, 0}, "commit time without commit"},
		{"run open byte 2", []byte{2, flagRun, 0, 0, 0, 0, 2, 1, 0}, "run open: byte 2"},
		{"run in-flight -2", []byte{2, flagRun, 0, 0, 0, 0, 1, 3, 0}, "in-flight offset -2"},
		{"negative crashes", []byte{2, flagRun, 0, 0, 0, 0, 1, 1, 1}, "crash count -1"},
		{"negative skipped", []byte{2, flagCounts, 0, 0, 0, 0, 1, 0}, "failure counts"},
		{"unknown outcome", []byte{2, flagCommit, 0, 0, 0, 0, 0, 0, 9, 0, 0}, "unknown outcome 9"},
		{"negative latency", []byte{2, flagCommit, 0, 0, 0, 0, 0, 0, 1, 1, 0}, "latency"},
		{"run truncated", []byte{2, flagRun, 0, 0, 0, 0}, "run open: value truncated"},
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
	f.Add([]byte{2, flagRun | flagCounts | flagCommit, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 1, 2, 2, 0})
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

func TestFailureRoundTrip(t *testing.T) {
	at := time.Unix(0, 1_717_000_000_123_456_789)
	for _, f := range []Failure{
		{Offset: 0, At: at, Action: FailureSkipped, Attempts: 5, Reason: "boom"},
		{Offset: math.MaxInt64, At: time.Unix(0, math.MinInt64), Action: FailureDeadLettered, Attempts: math.MaxInt32, Reason: strings.Repeat("x", 1000), DeadLetter: "dlt/3@42"},
	} {
		k := failureKey(7, f.Offset)
		got, err := decodeFailure(k[:], appendFailure(nil, &f))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("got %+v\nwant %+v", got, f)
		}
	}
	k := failureKey(1, 5)
	valid := appendFailure(nil, &Failure{Offset: 5, At: at, Action: FailureSkipped, Reason: "r"})
	for _, tt := range []struct {
		name string
		key  []byte
		v    []byte
		want string
	}{
		{"short key", k[:8], valid, "key is 8 bytes"},
		{"empty", k[:], nil, "truncated"},
		{"version", k[:], []byte{2}, "unknown failure encoding version 2"},
		{"action", k[:], []byte{1, 0, 7, 0, 0, 0}, "unknown action 7"},
		{"truncated", k[:], valid[:len(valid)-1], "truncated"},
		{"trailing", k[:], append(append([]byte(nil), valid...), 0), "trailing"},
	} {
		if _, err := decodeFailure(tt.key, tt.v); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error containing %q", tt.name, err, tt.want)
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
