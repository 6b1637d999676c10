package wire

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
		// An error is the expected answer to most bodies; a panic fails.
		_, _ = decodeResponse(k, body)
	})
}

// decodeResponse decodes a response body (after the correlation id) of key
// at its pinned version as Conn.roundTrip does: the header's tagged fields
// of a flexible response first (never ApiVersions'), then the response.
func decodeResponse(k kmsg.Key, body []byte) (kmsg.Response, error) {
	res := kmsg.ResponseForKey(int16(k))
	res.SetVersion(Versions[k])
	if res.IsFlexible() && k != kmsg.ApiVersions {
		var err error
		if body, err = skipTags(body); err != nil {
			return nil, fmt.Errorf("header: %w", err)
		}
	}
	if err := res.ReadFrom(body); err != nil {
		return nil, err
	}
	return res, nil
}

// The seed corpus from real brokers (make fuzz-corpus: kfake and Kafka
// 4.4.0) decodes without an error, each response of an API the engine
// sends, at its pinned version, and encodes back to the same bytes: a
// decoder that refuses, or misreads, what a real broker sent fails here,
// not only under the fuzzer (which wants no more than no panic).
func TestRealCorpusDecodes(t *testing.T) {
	files, err := filepath.Glob("testdata/fuzz/FuzzResponses/*")
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]int{}
	apis := map[kmsg.Key]bool{}
	for _, path := range files {
		key, body := readResponseEntry(t, path)
		k := kmsg.Key(key)
		if _, ok := Versions[k]; !ok {
			t.Errorf("%s: API key %d (%s) is not one the engine sends", path, key, k.Name())
			continue
		}
		res, err := decodeResponse(k, body)
		if err != nil {
			t.Errorf("%s: %s v%d: %v", path, k.Name(), Versions[k], err)
			continue
		}
		if again := res.AppendTo(nil); !bytes.Equal(again, body) {
			t.Errorf("%s: %s v%d: %d bytes encode back to %d other bytes: the decoder misread them", path, k.Name(), Versions[k], len(body), len(again))
		}
		source, _, _ := strings.Cut(filepath.Base(path), "-")
		sources[source]++
		apis[k] = true
	}
	// Both sources, and every API the engine sends but the ones it sends
	// only on a SASL connection (SASLAuthenticate's body is the mechanism's).
	if sources["kafka"] == 0 || sources["kfake"] == 0 {
		t.Errorf("corpus entries by source %v: want kfake's and Kafka's (make fuzz-corpus)", sources)
	}
	for k := range Versions {
		if !apis[k] && k != kmsg.SASLAuthenticate {
			t.Errorf("no real %s response in testdata/fuzz/FuzzResponses", k.Name())
		}
	}
	t.Logf("%d real responses decode, of %d APIs, by source %v", len(files), len(apis), sources)
}

// readResponseEntry reads a FuzzResponses corpus file: "go test fuzz v1",
// int16(KEY), []byte("BODY").
func readResponseEntry(t *testing.T, path string) (int16, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 || lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a go test fuzz v1 file of two values", path)
	}
	keyLit, ok1 := strings.CutPrefix(lines[1], "int16(")
	bodyLit, ok2 := strings.CutPrefix(lines[2], "[]byte(")
	if !ok1 || !ok2 || !strings.HasSuffix(keyLit, ")") || !strings.HasSuffix(bodyLit, ")") {
		t.Fatalf("%s: want int16(KEY) and []byte(BODY), got %q, %q", path, lines[1], lines[2])
	}
	key, err := strconv.ParseInt(strings.TrimSuffix(keyLit, ")"), 0, 16)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	body, err := strconv.Unquote(strings.TrimSuffix(bodyLit, ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return int16(key), []byte(body)
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
