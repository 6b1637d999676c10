package offsetfile

import (
	"bytes"
	"testing"
)

// An outbox record from a damaged file decodes or is refused, never a
// panic; one that decodes encodes back to the same entries.
func FuzzDecodeOutboxRecord(f *testing.F) {
	f.Add(appendRun(nil, 7, []change{{key: []byte("a"), value: []byte{stateValueV1, '1'}}, {key: []byte("b")}}))
	f.Add([]byte{outboxEntryV1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 1, 'k', 'v'})
	f.Add([]byte{outboxRunV1, 0, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, v []byte) {
		es, err := decodeEntries(nil, 5, v)
		if err != nil {
			return
		}
		n, err := recordEntries(v)
		if err != nil || n != uint64(len(es)) {
			t.Fatalf("decoded %d entries, the head says %d (%v)", len(es), n, err)
		}
		again, err := decodeEntries(nil, 5, appendRun(nil, es[0].Offset, entryChanges(es)))
		if err != nil || len(again) != len(es) {
			t.Fatalf("re-encoded: %d entries, %v", len(again), err)
		}
		for i := range es {
			a, b := es[i], again[i]
			if a.Seq != b.Seq || a.Offset != b.Offset || a.Delete != b.Delete || !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) {
				t.Fatalf("entry %d: %+v, re-encoded %+v", i, a, b)
			}
		}
	})
}
