package offsetfile

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
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
		// Completed ranges, alone and after every other optional field.
		{Watermark: 10, Committed: -1, Completed: []Range{{11, 12}}},
		{Watermark: 0, Committed: -1, Completed: []Range{{1, 5}, {6, 7}, {1 << 40, math.MaxInt64}}},
		{Watermark: 7, RecordedAt: at, Generation: 3, Member: "m", Committed: 5, CommittedAt: at,
			LastReset: &Reset{At: at, From: 1, To: 2, Reason: "r"}, Run: &RunState{Open: true, Inflight: 7, Crashes: 1},
			Skipped: 1, DeadLettered: 2, LastCommit: &CommitAttempt{Offset: 5, At: at, Outcome: CommitOK},
			Completed: []Range{{9, 10}, {12, 20}}},
		{Watermark: math.MaxInt64 - 2, Committed: -1, Completed: []Range{{math.MaxInt64 - 1, math.MaxInt64}}},
	}
}

// A record without completed ranges encodes byte for byte as it did before
// they existed (the encodings below were written by that build), so that
// builds without flag 256 read what this one writes.
func TestRecordEncodingUnchanged(t *testing.T) {
	golden := map[int]string{
		0:  "020001000001",
		1:  "020000000000",
		2:  "020354aab4a2ebe59981d42f0e0f636f6e73756d65722d312d3566316350aab4a2ebe59981d42f",
		4:  "020302ffffffffffffffffff01feffffff0f0001feffffffffffffffff01",
		5:  "020ce807000001aab4a2ebe59981d42f14e80721726574656e74696f6e3a206f6666736574203130206f7574206f662072616e6765",
		6:  "020400000001010000",
		7:  "020c01000ac3bc6ec3af00636f646501ffc7afa025feffffffffffffffff01feffffffffffffffff0100",
		8:  "02f0010e00000a010e0604feffffffffffffffff010e12aab4a2ebe59981d42f048090dfc04a0b692f6f2074696d656f7574",
		9:  "0250000000010001000000010000",
		10: "02e00106000006020006ffffffff0fffffffffffffffffff01020000",
	}
	samples := codecSamples()
	for i, want := range golden {
		r := samples[i]
		if got := hex.EncodeToString(appendRecord(nil, &r)); got != want {
			t.Errorf("sample %d encodes to %s, want %s", i, got, want)
		}
		// An empty, non-nil Completed is no ranges too.
		r.Completed = []Range{}
		if got := hex.EncodeToString(appendRecord(nil, &r)); got != want {
			t.Errorf("sample %d with empty Completed encodes to %s, want %s", i, got, want)
		}
	}
}

// The ranges are stored as deltas: a watermark far up costs nothing.
func TestCompletedEncoding(t *testing.T) {
	r := Record{Watermark: 1 << 40, Committed: -1, Completed: []Range{{1<<40 + 2, 1<<40 + 5}, {1<<40 + 100, 1<<40 + 101}}}
	b := appendRecord(nil, &r)
	head := appendRecord(nil, &Record{Watermark: r.Watermark, Committed: -1})
	// The flags varint grows from 1 byte to 2 (flag 256); then the head
	// fields, then count 2, (2, 3), (95, 1).
	want := append([]byte{valueVersion, 0x80, 0x02}, head[2:]...)
	want = append(want, 2, 2, 3, 95, 1)
	if !bytes.Equal(b, want) {
		t.Errorf("encoding %x, want %x", b, want)
	}
}

func TestCompletedRoundTripLarge(t *testing.T) {
	r := Record{Watermark: 1_000_000, RecordedAt: time.Unix(0, 1_717_000_000_123_456_789), Generation: 4, Member: "m", Committed: 999_000}
	next := r.Watermark + 2
	for i := range 100_000 {
		size := int64(1 + i%7)
		r.Completed = append(r.Completed, Range{From: next, To: next + size})
		next += size + 1 + int64(i%300)
	}
	if err := validateRecord(&r); err != nil {
		t.Fatal(err)
	}
	b := appendRecord(nil, &r)
	got, err := decodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatal("100,000 ranges do not round trip")
	}
	if per := float64(len(b)) / 100_000; per > 3.5 {
		t.Errorf("%.1f bytes per range, want <= 3.5 for small gaps", per)
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
		{"v2 unknown flags", []byte{2, 0x80, 0x04, 0, 0, 0, 0}, "unknown flags"},
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
		// Completed ranges (flag 256); the record's head is watermark 10,
		// generation 0, member "", committed -1.
		{"v1 completed flag", []byte{1, 0x80, 20, 0, 0, 1}, "unknown flags"},
		{"completed count 0", completedValue(10, 0), "completed set flag with 0 ranges"},
		{"completed count too large", completedValue(10, maxRanges+1, 1, 1), "2097153 completed ranges, the limit is 2097152"},
		{"completed count past the end", completedValue(10, 1000, 1, 1, 1, 1), "1000 completed ranges in 4 bytes: value truncated"},
		{"completed count huge varint", completedValue(10, math.MaxUint64, 1, 1), "completed ranges, the limit is"},
		{"completed count truncated", append(completedValue(10), 0x80), "completed range count: value truncated"},
		{"completed range truncated", append(completedValue(10, 2, 1, 1, 1), 0x80), "completed range length: value truncated"},
		{"completed without watermark", completedValue(-1, 1, 1, 1), "completed ranges without a watermark"},
		{"completed at the watermark", completedValue(10, 1, 0, 1), "completed range 0 starts at the watermark 10"},
		{"completed ranges touching", completedValue(10, 2, 1, 1, 0, 1), "completed range 1 starts at 12, where range 0 ends"},
		{"completed range empty", completedValue(10, 2, 1, 1, 5, 0), "completed range 1 is empty"},
		{"completed start overflows", completedValue(10, 1, math.MaxInt64-9, 1), "offset overflows int64"},
		{"completed end overflows", completedValue(10, 1, 1, math.MaxInt64-10), "offset overflows int64"},
		{"completed delta above int64", completedValue(10, 1, math.MaxUint64, 1), "offset overflows int64"},
		{"completed later start overflows", completedValue(10, 2, 1, 1, math.MaxInt64, 1), "completed range 1: offset overflows int64"},
		{"completed bad varint", append(completedValue(10, 1, 1), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), "completed range length: bad varint"},
		{"completed trailing", completedValue(10, 1, 1, 1, 0), "1 unexpected trailing bytes"},
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

// completedValue is a version 2 value with flag 256 only: watermark,
// generation 0, member "", committed -1, then the uvarints given (the
// range count, then deltas).
func completedValue(watermark int64, uvarints ...uint64) []byte {
	b := []byte{valueVersion, 0x80, 0x02}
	b = append(b, varint(watermark)...)
	b = append(b, 0, 0, 1)
	for _, v := range uvarints {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func TestValidateCompleted(t *testing.T) {
	tests := []struct {
		name string
		wm   int64
		c    []Range
		want string // "" for valid
	}{
		{"nil", 5, nil, ""},
		{"empty", 5, []Range{}, ""},
		{"nil without watermark", -1, nil, ""},
		{"one", 5, []Range{{6, 7}}, ""},
		{"several", 0, []Range{{1, 3}, {4, 10}, {100, math.MaxInt64}}, ""},
		{"without watermark", -1, []Range{{1, 2}}, "1 completed ranges without a watermark (watermark -1)"},
		{"at the watermark", 5, []Range{{5, 7}}, "completed range 0 [5, 7): starts at or below the watermark 5"},
		{"below the watermark", 5, []Range{{2, 3}}, "starts at or below the watermark 5"},
		{"empty range", 5, []Range{{6, 6}}, "completed range 0 [6, 6): empty or reversed"},
		{"reversed", 5, []Range{{8, 6}}, "completed range 0 [8, 6): empty or reversed"},
		{"later empty", 5, []Range{{6, 7}, {9, 9}}, "completed range 1 [9, 9): empty or reversed"},
		{"unsorted", 5, []Range{{20, 30}, {6, 7}}, "completed range 1 [6, 7): overlaps or is below range 0 [20, 30)"},
		{"overlapping", 5, []Range{{6, 10}, {8, 12}}, "completed range 1 [8, 12): overlaps or is below range 0 [6, 10)"},
		{"touching", 5, []Range{{6, 10}, {10, 12}}, "completed range 1 [10, 12): touches range 0 [6, 10) (touching ranges must be merged)"},
		{"too many", 0, make([]Range, maxRanges+1), "2097153 completed ranges, the limit is 2097152"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Record{Watermark: tt.wm, Committed: -1, Completed: tt.c}
			err := validateRecord(&r)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("validateRecord: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("validateRecord: %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// The bound itself is accepted.
	c := make([]Range, maxRanges)
	for i := range c {
		c[i] = Range{From: int64(2*i + 1), To: int64(2*i + 2)}
	}
	if err := validateCompleted(0, c); err != nil {
		t.Errorf("%d ranges: %v", maxRanges, err)
	}
}

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
	for _, v := range [][]byte{
		completedValue(10, 0),
		completedValue(10, maxRanges+1, 1, 1),
		completedValue(10, 1000, 1, 1, 1, 1),
		completedValue(-1, 1, 1, 1),
		completedValue(10, 1, 0, 1),
		completedValue(10, 2, 1, 1, 0, 1),
		completedValue(10, 2, 1, 1, 5, 0),
		completedValue(10, 1, math.MaxInt64-9, 1),
		completedValue(10, 2, 1, 1, math.MaxInt64, 1),
		completedValue(10, 3, 1, 1, 1, 1, 1, 1),
	} {
		f.Add(v)
	}
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
		{Offset: 0, At: at, Action: FailureSkip, Attempts: 5, Reason: "boom"},
		{Offset: math.MaxInt64, At: time.Unix(0, math.MinInt64), Action: FailureDeadLetter, Attempts: math.MaxInt32, Reason: strings.Repeat("x", 1000), DeadLetter: "dlt/3@42"},
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
	// The action's byte is the file's since the first version, not the
	// type's value (the policy's order): 1 skipped, 2 dead-lettered.
	for a, want := range map[FailureAction]byte{FailureSkip: 1, FailureDeadLetter: 2} {
		b := appendFailure(nil, &Failure{Offset: 5, At: time.Unix(0, 0), Action: a}) // version, At (0: one byte), action
		if b[2] != want {
			t.Errorf("%v is encoded as %d, the file says %d", a, b[2], want)
		}
	}
	k := failureKey(1, 5)
	valid := appendFailure(nil, &Failure{Offset: 5, At: at, Action: FailureSkip, Reason: "r"})
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

// Completed ranges travel with the watermark: merging keeps those of the
// watermark that wins, whatever else is merged after it.
func TestPatchMergeCompleted(t *testing.T) {
	at := time.Unix(100, 0)
	ranges := []Range{{7, 9}, {12, 13}}
	progress := patch{fields: setWatermark | setOwner, rec: Record{Watermark: 5, RecordedAt: at, Generation: 2, Member: "a", Completed: ranges}}
	plain := patch{fields: setWatermark | setOwner, rec: Record{Watermark: 6, RecordedAt: at, Generation: 2, Member: "a"}}
	cm := patch{fields: setCommitted, rec: Record{Committed: 4, CommittedAt: at}}
	run := patch{fields: setRun, rec: Record{Run: &RunState{Open: true, Inflight: -1}}}
	reset := patch{fields: setWatermark | setReset, rec: Record{Watermark: 50, RecordedAt: at, LastReset: &Reset{From: 5, To: 50}}}
	all := patch{fields: setAll, rec: Record{Watermark: 20, Committed: -1, Completed: []Range{{30, 31}}}}
	base := Record{Watermark: 1, Committed: -1, Completed: []Range{{3, 4}}}

	for _, tt := range []struct {
		name string
		p    patch
		want []Range
		wm   int64
	}{
		{"progress", progress, ranges, 5},
		{"progress then other fields", progress.merge(cm).merge(run), ranges, 5},
		{"other fields then progress", cm.merge(run).merge(progress), ranges, 5},
		{"other fields only keep the base's", cm.merge(run), []Range{{3, 4}}, 1},
		{"plain watermark after progress clears", progress.merge(plain), nil, 6},
		{"progress after plain watermark", plain.merge(progress), ranges, 5},
		{"reset after progress clears", progress.merge(cm).merge(reset), nil, 50},
		{"progress after reset", reset.merge(progress), ranges, 5},
		{"put after progress", progress.merge(all), []Range{{30, 31}}, 20},
		{"progress after put", all.merge(cm).merge(progress), ranges, 5},
		{"retry: failed progress merged under a newer commit", progress.merge(cm), ranges, 5},
		{"retry: failed progress merged under a newer plain watermark", progress.merge(plain.merge(cm)), nil, 6},
	} {
		got := tt.p.apply(base)
		if got.Watermark != tt.wm || !reflect.DeepEqual(got.Completed, tt.want) {
			t.Errorf("%s: watermark %d, completed %v; want %d, %v", tt.name, got.Watermark, got.Completed, tt.wm, tt.want)
		}
		if err := validateRecord(&got); err != nil {
			t.Errorf("%s: merged record invalid: %v", tt.name, err)
		}
	}
}

// The records of real offset files in FuzzDecodeRecord's corpus (make
// fuzz-corpus) decode, and are valid.
func TestRealCorpusDecodes(t *testing.T) {
	files, _ := filepath.Glob("testdata/fuzz/FuzzDecodeRecord/*")
	if len(files) == 0 {
		t.Fatal("no corpus files in testdata/fuzz/FuzzDecodeRecord")
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		head, lit, ok := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if !ok || head != "go test fuzz v1" || !strings.HasPrefix(lit, "[]byte(") {
			t.Fatalf("%s: not a fuzz corpus file of one []byte", path)
		}
		v, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lit, "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		r, err := decodeRecord([]byte(v))
		if err == nil {
			err = validateRecord(&r)
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}
