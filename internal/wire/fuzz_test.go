package wire

import (
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Every response the engine reads, decoded from hostile bytes at the pinned
// version: an error, never a panic (a panic in a connection's goroutine
// would end the service). The first argument is the API key, so that the
// entries of testdata/fuzz/FuzzResponses (real responses, written by
// internal/fuzzcorpus) say which response they hold; a key the engine does
// not send picks one of those it does.
func FuzzResponses(f *testing.F) {
	keys := make([]kmsg.Key, 0, len(Versions))
	for k := range Versions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		res := kmsg.ResponseForKey(int16(k))
		res.SetVersion(Versions[k])
		f.Add(int16(k), res.AppendTo(nil)) // an empty response, well formed
	}
	f.Add(int16(kmsg.Fetch), []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, key int16, body []byte) {
		k := kmsg.Key(key)
		if _, ok := Versions[k]; !ok {
			k = keys[int(uint16(key))%len(keys)]
		}
		res := kmsg.ResponseForKey(int16(k))
		res.SetVersion(Versions[k])
		_ = res.ReadFrom(body)
		if _, err := skipTags(body); err == nil {
			return
		}
	})
}

// The tagged-field section of a flexible response header.
func TestSkipTags(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		rest int
		ok   bool
	}{
		{[]byte{0, 9}, 1, true},                 // no tags
		{[]byte{1, 5, 2, 'a', 'b', 9}, 1, true}, // one tag of 2 bytes
		{[]byte{1, 5, 3, 'a', 'b'}, 0, false},   // cut short
		{[]byte{2, 5, 0}, 0, false},             // a second tag missing
		{[]byte{0x80}, 0, false},                // a varint cut short
	} {
		rest, err := skipTags(tc.in)
		if (err == nil) != tc.ok || tc.ok && len(rest) != tc.rest {
			t.Errorf("skipTags(%v) = %v, %v; want %d bytes left, ok %v", tc.in, rest, err, tc.rest, tc.ok)
		}
	}
}
