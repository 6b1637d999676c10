package wire

import (
	"bufio"
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

// Every response the engine reads, decoded from hostile bytes at each
// version it is pinned at (Versions; ConsumerProtocolVersions, the consumer
// group protocol's membership: its heartbeat, Metadata with topic ids, and
// the commits and offset reads with the member epoch): an error, never a
// panic (a panic in a connection's goroutine would end the service). The
// first argument is the API key, so that the entries of
// testdata/fuzz/FuzzResponses (real responses, written by
// internal/fuzzcorpus) say which response they hold; a key the engine does
// not send picks one of those it does.
func FuzzResponses(f *testing.F) {
	keys := responseKeys()
	for _, k := range keys {
		for _, v := range pinnedVersions(k) {
			res := kmsg.ResponseForKey(int16(k))
			res.SetVersion(v)
			f.Add(int16(k), res.AppendTo(nil)) // an empty response, well formed
		}
	}
	f.Add(int16(kmsg.Fetch), []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, key int16, body []byte) {
		k := kmsg.Key(key)
		if len(pinnedVersions(k)) == 0 {
			k = keys[int(uint16(key))%len(keys)]
		}
		// An error is the expected answer to most bodies; a panic fails.
		for _, v := range pinnedVersions(k) {
			_, _ = decodeResponse(k, v, body)
		}
	})
}

// responseKeys are the APIs the engine sends, in either table, in order.
func responseKeys() []kmsg.Key {
	var keys []kmsg.Key
	for k := range Versions {
		keys = append(keys, k)
	}
	for k := range ConsumerProtocolVersions {
		if _, ok := Versions[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// pinnedVersions are the versions the engine sends k at: Versions', then
// the consumer protocol's where it differs.
func pinnedVersions(k kmsg.Key) []int16 {
	var vs []int16
	if v, ok := Versions[k]; ok {
		vs = append(vs, v)
	}
	if v, ok := ConsumerProtocolVersions[k]; ok && !slices.Contains(vs, v) {
		vs = append(vs, v)
	}
	return vs
}

// decodeResponse decodes a response body (after the correlation id) of key
// at version v as Conn.roundTrip does: the header's tagged fields of a
// flexible response first (never ApiVersions'), then the response.
func decodeResponse(k kmsg.Key, v int16, body []byte) (kmsg.Response, error) {
	res := kmsg.ResponseForKey(int16(k))
	res.SetVersion(v)
	if fr, ok := res.(*kmsg.FetchResponse); ok && !res.IsFlexible() {
		if err := readFetch(bufio.NewReader(bytes.NewReader(body)), int64(len(body)), fr); err != nil {
			return nil, err
		}
		return fr, nil
	}
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

// responseBody is body without the header's tagged fields of a flexible
// response (decodeResponse succeeded, so they are well formed): what the
// response encodes to.
func responseBody(k kmsg.Key, v int16, body []byte) []byte {
	res := kmsg.ResponseForKey(int16(k))
	res.SetVersion(v)
	if res.IsFlexible() && k != kmsg.ApiVersions {
		body, _ = skipTags(body)
	}
	return body
}

// The consumer group protocol's responses cut short or corrupted decode to
// an error, never a panic: every proper prefix of a heartbeat answer with
// an assignment, and of v9 commit and offset-read answers, is refused, and
// so is an impossible array length.
func TestConsumerProtocolResponsesCutShort(t *testing.T) {
	hb := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	hb.SetVersion(ConsumerProtocolVersions[kmsg.ConsumerGroupHeartbeat])
	hb.MemberID, hb.MemberEpoch, hb.HeartbeatIntervalMillis = kmsg.StringPtr("m-1"), 7, 5000
	a := kmsg.NewConsumerGroupHeartbeatResponseAssignment()
	at := kmsg.NewConsumerGroupHeartbeatResponseAssignmentTopic()
	at.TopicID, at.Partitions = [16]byte{1, 2, 3}, []int32{0, 2, 4}
	a.Topics = append(a.Topics, at)
	hb.Assignment = &a
	oc := kmsg.NewPtrOffsetCommitResponse()
	oc.SetVersion(ConsumerProtocolVersions[kmsg.OffsetCommit])
	oct := kmsg.NewOffsetCommitResponseTopic()
	oct.Topic = "t"
	ocp := kmsg.NewOffsetCommitResponseTopicPartition()
	ocp.Partition, ocp.ErrorCode = 3, 113 // STALE_MEMBER_EPOCH
	oct.Partitions = append(oct.Partitions, ocp)
	oc.Topics = append(oc.Topics, oct)
	of := kmsg.NewPtrOffsetFetchResponse()
	of.SetVersion(ConsumerProtocolVersions[kmsg.OffsetFetch])
	og := kmsg.NewOffsetFetchResponseGroup()
	og.Group, og.ErrorCode = "g", 113
	ogt := kmsg.NewOffsetFetchResponseGroupTopic()
	ogt.Topic = "t"
	ogp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
	ogp.Partition, ogp.Offset, ogp.LeaderEpoch = 1, 42, -1
	ogt.Partitions = append(ogt.Partitions, ogp)
	og.Topics = append(og.Topics, ogt)
	of.Groups = append(of.Groups, og)

	for _, res := range []kmsg.Response{hb, oc, of} {
		k, v := kmsg.Key(res.Key()), res.GetVersion()
		body := append([]byte{0}, res.AppendTo(nil)...) // the header's empty tags, as a broker sends them
		got, err := decodeResponse(k, v, body)
		if err != nil {
			t.Fatalf("%s v%d: the whole response: %v", k.Name(), v, err)
		}
		if again := got.AppendTo(nil); !bytes.Equal(again, body[1:]) {
			t.Fatalf("%s v%d: decodes to another response", k.Name(), v)
		}
		for n := range len(body) {
			if _, err := decodeResponse(k, v, body[:n]); err == nil {
				t.Errorf("%s v%d: the response cut to %d of its %d bytes decoded", k.Name(), v, n, len(body))
			}
		}
	}
	// An assignment claiming 2^28 topics in a few bytes: refused, neither a
	// panic nor an allocation of that size.
	hb.Assignment.Topics = nil
	body := append([]byte{0}, hb.AppendTo(nil)...)
	// The body ends with the topics' compact length (1: none), the
	// assignment's tags and the response's tags.
	if n := len(body); body[n-3] != 1 || body[n-2] != 0 || body[n-1] != 0 {
		t.Fatalf("unexpected heartbeat encoding %v", body)
	}
	huge := append(slices.Clone(body[:len(body)-3]), 0x81, 0x80, 0x80, 0x80, 0x01, 0, 0)
	if _, err := decodeResponse(kmsg.ConsumerGroupHeartbeat, hb.GetVersion(), huge); err == nil {
		t.Error("a heartbeat answer claiming 2^28 assigned topics in 7 bytes decoded")
	}
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
		vs := pinnedVersions(k)
		if len(vs) == 0 {
			t.Errorf("%s: API key %d (%s) is not one the engine sends", path, key, k.Name())
			continue
		}
		// An entry holds a response at one of its API's pinned versions
		// (Versions', or the consumer protocol's): it must decode at one
		// and encode back to the same bytes.
		var errs []string
		for _, v := range vs {
			res, err := decodeResponse(k, v, body)
			if err == nil && !bytes.Equal(res.AppendTo(nil), responseBody(k, v, body)) {
				err = fmt.Errorf("%d bytes encode back to other bytes: the decoder misread them", len(body))
			}
			if err != nil {
				errs = append(errs, fmt.Sprintf("v%d: %v", v, err))
				continue
			}
			errs = nil
			break
		}
		if len(errs) > 0 {
			t.Errorf("%s: %s at no pinned version: %s", path, k.Name(), strings.Join(errs, "; "))
			continue
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
	for _, k := range responseKeys() {
		if !apis[k] && k != kmsg.SASLAuthenticate {
			t.Errorf("no real %s response in testdata/fuzz/FuzzResponses", k.Name())
		}
	}
	t.Logf("%d real responses decode, of %d APIs, by source %v", len(files), len(apis), sources)
}

// readResponseEntry reads a FuzzResponses corpus file: "go test fuzz v1",
// int16(KEY), []byte("BODY").
func readResponseEntry(t testing.TB, path string) (int16, []byte) {
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
