package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A Fetch response read as it arrives (readFetch) is what kmsg decodes
// from the same bytes, at every version before 12, or both refuse it; and
// the read ends at the body's end, whatever follows it. The seeds are the
// real Fetch responses of FuzzResponses' corpus (kfake's and Kafka 4.4.0's)
// and an empty one per version.
func FuzzFetchStream(f *testing.F) {
	files, err := filepath.Glob("testdata/fuzz/FuzzResponses/*fetch*")
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range files {
		if key, body := readResponseEntry(f, path); kmsg.Key(key) == kmsg.Fetch {
			f.Add(body)
		}
	}
	for v := int16(4); v < 12; v++ {
		res := kmsg.NewPtrFetchResponse()
		res.SetVersion(v)
		f.Add(res.AppendTo(nil))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for v := int16(4); v < 12; v++ {
			want := kmsg.NewPtrFetchResponse()
			want.SetVersion(v)
			wantErr := want.ReadFrom(body)
			// A reader buffer of 16 bytes, bufio's least: fields cross its
			// refills.
			trailer := []byte("next")
			under := bytes.NewReader(append(append([]byte(nil), body...), trailer...))
			got := kmsg.NewPtrFetchResponse()
			got.SetVersion(v)
			gotErr := readFetch(bufio.NewReaderSize(io.LimitReader(under, int64(len(body))), 16), int64(len(body)), got)
			if (gotErr == nil) != (wantErr == nil) {
				t.Fatalf("v%d: readFetch: %v; kmsg: %v", v, gotErr, wantErr)
			}
			if gotErr != nil {
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("v%d: readFetch read %+v; kmsg %+v", v, got, want)
			}
			if rest, _ := io.ReadAll(under); !bytes.Equal(rest, trailer) {
				t.Fatalf("v%d: %d bytes left after the body, want %q", v, len(rest), trailer)
			}
		}
	})
}

// Small parts share slabs of at most 1 MiB, so what one partition keeps
// keeps at most a slab of the answer; parts larger than a slab share the
// rest of the answer, one buffer as before.
func TestFetchStreamSlabs(t *testing.T) {
	for _, tc := range []struct {
		parts, size int
		maxRun      int // the most bytes of consecutive parts in one buffer
	}{
		{100, 100 << 10, slabSize},
		{8, 2 << 20, 8 * 2 << 20},
	} {
		res := kmsg.NewPtrFetchResponse()
		res.SetVersion(Versions[kmsg.Fetch])
		rt := kmsg.NewFetchResponseTopic()
		rt.Topic = "t"
		for i := range tc.parts {
			p := kmsg.NewFetchResponseTopicPartition()
			p.Partition, p.RecordBatches = int32(i), bytes.Repeat([]byte{byte(i)}, tc.size)
			rt.Partitions = append(rt.Partitions, p)
		}
		res.Topics = append(res.Topics, rt)
		body := res.AppendTo(nil)
		got := kmsg.NewPtrFetchResponse()
		got.SetVersion(Versions[kmsg.Fetch])
		if err := readFetch(bufio.NewReader(bytes.NewReader(body)), int64(len(body)), got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, res) {
			t.Fatalf("%d parts of %d bytes: read other values", tc.parts, tc.size)
		}
		ps := got.Topics[0].Partitions
		run, longest := len(ps[0].RecordBatches), 0
		for i := 1; i < len(ps); i++ {
			prev, b := ps[i-1].RecordBatches, ps[i].RecordBatches
			if cap(prev) != len(prev) {
				t.Errorf("partition %d's bytes have room for %d more: an append would write over the next", i-1, cap(prev)-len(prev))
			}
			if unsafe.Add(unsafe.Pointer(unsafe.SliceData(prev)), len(prev)) == unsafe.Pointer(unsafe.SliceData(b)) {
				run += len(b)
			} else {
				longest, run = max(longest, run), len(b)
			}
		}
		longest = max(longest, run)
		if longest > tc.maxRun || tc.size > slabSize && longest != tc.maxRun {
			t.Errorf("%d parts of %d bytes: %d bytes of consecutive parts in one buffer, want at most %d (and all of them when parts exceed a slab)",
				tc.parts, tc.size, longest, tc.maxRun)
		}
	}
}

// A body's size is only claimed until its bytes arrive: array lengths that
// fit the claim but not what was sent size no allocation, and the read
// ends in an error when the bytes stop.
func TestFetchStreamHostileLengths(t *testing.T) {
	var body []byte
	body = binary.BigEndian.AppendUint32(body, 0)     // throttle
	body = binary.BigEndian.AppendUint16(body, 0)     // error code
	body = binary.BigEndian.AppendUint32(body, 0)     // session
	body = binary.BigEndian.AppendUint32(body, 1)     // one topic
	body = binary.BigEndian.AppendUint16(body, 1)     // its name's length
	body = append(body, 't')                          // its name
	body = binary.BigEndian.AppendUint32(body, 1<<24) // 16 million partitions, none sent
	res := kmsg.NewPtrFetchResponse()
	res.SetVersion(Versions[kmsg.Fetch])
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := readFetch(bufio.NewReader(bytes.NewReader(body)), 1<<30, res)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a body cut short after its partitions' count read without an error")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Errorf("reading it allocated %d bytes, want at most 4 MiB: the claimed count sized an allocation", grew)
	}
}
