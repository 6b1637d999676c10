package wire

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Every response the engine reads, decoded from hostile bytes at the pinned
// version: an error, never a panic (a panic in a connection's goroutine
// would end the service).
func FuzzResponses(f *testing.F) {
	keys := make([]kmsg.Key, 0, len(Versions))
	for k := range Versions {
		keys = append(keys, k)
	}
	for i, k := range keys {
		res := kmsg.ResponseForKey(int16(k))
		res.SetVersion(Versions[k])
		f.Add(uint8(i), res.AppendTo(nil)) // an empty response, well formed
	}
	f.Add(uint8(0), []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		k := keys[int(which)%len(keys)]
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
