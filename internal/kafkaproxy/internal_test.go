package kafkaproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// requestFrame encodes req the way a client sends it.
func requestFrame(t testing.TB, req kmsg.Request, corr int32) []byte {
	t.Helper()
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("test-client")).AppendRequest(nil, req, corr)
}

// sampleRequest returns a request of key at version v that names two items
// (partitions, groups, keys, topics) wherever its shape allows.
func sampleRequest(key kmsg.Key, v int16) kmsg.Request {
	topicID := [16]byte{1, 2, 3}
	var req kmsg.Request
	switch key {
	case kmsg.Produce:
		r := kmsg.NewPtrProduceRequest()
		r.Acks = -1
		r.TransactionID = kmsg.StringPtr("txn")
		t := kmsg.NewProduceRequestTopic()
		t.Topic, t.TopicID = "t", topicID
		for p := range int32(2) {
			tp := kmsg.NewProduceRequestTopicPartition()
			tp.Partition = p
			t.Partitions = append(t.Partitions, tp)
		}
		r.Topics = append(r.Topics, t)
		req = r
	case kmsg.Fetch:
		r := kmsg.NewPtrFetchRequest()
		t := kmsg.NewFetchRequestTopic()
		t.Topic, t.TopicID = "t", topicID
		for p := range int32(2) {
			tp := kmsg.NewFetchRequestTopicPartition()
			tp.Partition = p
			t.Partitions = append(t.Partitions, tp)
		}
		r.Topics = append(r.Topics, t)
		req = r
	case kmsg.ListOffsets:
		r := kmsg.NewPtrListOffsetsRequest()
		t := kmsg.NewListOffsetsRequestTopic()
		t.Topic = "t"
		for p := range int32(2) {
			tp := kmsg.NewListOffsetsRequestTopicPartition()
			tp.Partition = p
			t.Partitions = append(t.Partitions, tp)
		}
		r.Topics = append(r.Topics, t)
		req = r
	case kmsg.OffsetCommit:
		r := kmsg.NewPtrOffsetCommitRequest()
		r.Group, r.Generation, r.MemberID = "g", 3, "m"
		t := kmsg.NewOffsetCommitRequestTopic()
		t.Topic, t.TopicID = "t", topicID
		for p := range int32(2) {
			tp := kmsg.NewOffsetCommitRequestTopicPartition()
			tp.Partition, tp.Offset = p, 42
			t.Partitions = append(t.Partitions, tp)
		}
		r.Topics = append(r.Topics, t)
		req = r
	case kmsg.OffsetFetch:
		r := kmsg.NewPtrOffsetFetchRequest()
		r.Group = "g"
		t := kmsg.NewOffsetFetchRequestTopic()
		t.Topic, t.Partitions = "t", []int32{0, 1}
		r.Topics = append(r.Topics, t)
		g := kmsg.NewOffsetFetchRequestGroup()
		g.Group = "g"
		gt := kmsg.NewOffsetFetchRequestGroupTopic()
		gt.Topic, gt.TopicID, gt.Partitions = "t", topicID, []int32{0, 1}
		g.Topics = append(g.Topics, gt)
		r.Groups = append(r.Groups, g)
		req = r
	case kmsg.FindCoordinator:
		r := kmsg.NewPtrFindCoordinatorRequest()
		r.CoordinatorKey = "g"
		r.CoordinatorKeys = []string{"g", "h"}
		req = r
	case kmsg.LeaveGroup:
		r := kmsg.NewPtrLeaveGroupRequest()
		r.Group, r.MemberID = "g", "m"
		for _, id := range []string{"m", "n"} {
			m := kmsg.NewLeaveGroupRequestMember()
			m.MemberID = id
			r.Members = append(r.Members, m)
		}
		req = r
	case kmsg.DescribeGroups:
		r := kmsg.NewPtrDescribeGroupsRequest()
		r.Groups = []string{"g", "h"}
		req = r
	case kmsg.CreateTopics:
		r := kmsg.NewPtrCreateTopicsRequest()
		for _, name := range []string{"t", "u"} {
			t := kmsg.NewCreateTopicsRequestTopic()
			t.Topic = name
			r.Topics = append(r.Topics, t)
		}
		req = r
	case kmsg.DeleteTopics:
		r := kmsg.NewPtrDeleteTopicsRequest()
		r.TopicNames = []string{"t", "u"}
		for _, name := range r.TopicNames {
			t := kmsg.NewDeleteTopicsRequestTopic()
			t.Topic = kmsg.StringPtr(name)
			r.Topics = append(r.Topics, t)
		}
		req = r
	default:
		req = key.Request()
	}
	req.SetVersion(v)
	return req
}

// errorCodes collects every ErrorCode field reachable from v.
func errorCodes(v reflect.Value) []int16 {
	var out []int16
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			out = append(out, errorCodes(v.Elem())...)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			if f.Name == "ErrorCode" && f.Type.Kind() == reflect.Int16 {
				out = append(out, int16(v.Field(i).Int()))
				continue
			}
			out = append(out, errorCodes(v.Field(i))...)
		}
	case reflect.Slice:
		if k := v.Type().Elem().Kind(); k == reflect.Struct || k == reflect.Pointer {
			for i := range v.Len() {
				out = append(out, errorCodes(v.Index(i))...)
			}
		}
	}
	return out
}

// decodeResponse decodes a full response frame to the request req.
func decodeResponse(t testing.TB, frame []byte, req kmsg.Request) (int32, kmsg.Response) {
	t.Helper()
	if got := int(binary.BigEndian.Uint32(frame)); got != len(frame)-4 {
		t.Fatalf("frame size prefix %d, frame holds %d bytes", got, len(frame)-4)
	}
	n, err := responseHeaderLen(req.Key(), req.GetVersion(), frame[4:])
	if err != nil {
		t.Fatalf("response header: %v", err)
	}
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if err := resp.ReadFrom(frame[4+n:]); err != nil {
		t.Fatalf("decoding %s v%d response: %v", kmsg.NameForKey(req.Key()), req.GetVersion(), err)
	}
	return int32(binary.BigEndian.Uint32(frame[4:])), resp
}

// TestSynthesizeEveryVersion builds an error response for every failable key
// at every version kmsg knows, and checks that it decodes at that version,
// answers the right correlation id, and carries the error code on every item.
func TestSynthesizeEveryVersion(t *testing.T) {
	const code = 16
	itemized := map[kmsg.Key]bool{
		kmsg.Produce: true, kmsg.Fetch: true, kmsg.ListOffsets: true, kmsg.OffsetCommit: true,
		kmsg.OffsetFetch: true, kmsg.DescribeGroups: true, kmsg.CreateTopics: true, kmsg.DeleteTopics: true,
	}
	for _, key := range FailableKeys() {
		for v := int16(0); v <= key.Request().MaxVersion(); v++ {
			req := sampleRequest(key, v)
			frame := requestFrame(t, req, 1000+int32(v))
			h, err := parseRequestHeader(frame)
			if err != nil {
				t.Fatal(err)
			}
			out, err := synthesize(h, frame, code)
			if err != nil {
				t.Fatalf("%s v%d: %v", key.Name(), v, err)
			}
			corr, resp := decodeResponse(t, out, req)
			if corr != 1000+int32(v) {
				t.Errorf("%s v%d: correlation id %d, want %d", key.Name(), v, corr, 1000+v)
			}
			set := 0
			for _, c := range errorCodes(reflect.ValueOf(resp)) {
				switch c {
				case code:
					set++
				case 0: // a field the version does not carry
				default:
					t.Errorf("%s v%d: stray error code %d", key.Name(), v, c)
				}
			}
			want := 1
			if itemized[key] {
				want = 2
			}
			if set < want {
				t.Errorf("%s v%d: %d error codes set, want at least %d: %+v", key.Name(), v, set, want, resp)
			}
		}
	}
}

func TestSynthesizeOffsetCommitEchoesPartitions(t *testing.T) {
	for v := int16(0); v <= kmsg.OffsetCommit.Request().MaxVersion(); v++ {
		req := sampleRequest(kmsg.OffsetCommit, v)
		frame := requestFrame(t, req, 7)
		h, _ := parseRequestHeader(frame)
		out, err := synthesize(h, frame, 27)
		if err != nil {
			t.Fatal(err)
		}
		_, resp := decodeResponse(t, out, req)
		r := resp.(*kmsg.OffsetCommitResponse)
		if len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 2 {
			t.Fatalf("v%d: topics %+v", v, r.Topics)
		}
		if v < 10 && r.Topics[0].Topic != "t" || v >= 10 && r.Topics[0].TopicID != [16]byte{1, 2, 3} {
			t.Errorf("v%d: topic not echoed: %+v", v, r.Topics[0])
		}
		for i, p := range r.Topics[0].Partitions {
			if p.Partition != int32(i) || p.ErrorCode != 27 {
				t.Errorf("v%d: partition %+v", v, p)
			}
		}
	}
}

func TestSynthesizeUnsupported(t *testing.T) {
	req := kmsg.NewPtrMetadataRequest()
	frame := requestFrame(t, req, 1)
	h, _ := parseRequestHeader(frame)
	if _, err := synthesize(h, frame, 1); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
}

func TestProduceAcks(t *testing.T) {
	for v := int16(0); v <= kmsg.Produce.Request().MaxVersion(); v++ {
		for _, txn := range []*string{nil, kmsg.StringPtr(""), kmsg.StringPtr("some-txn")} {
			for _, acks := range []int16{0, 1, -1} {
				req := sampleRequest(kmsg.Produce, v).(*kmsg.ProduceRequest)
				req.TransactionID, req.Acks = txn, acks
				frame := requestFrame(t, req, 1)
				h, _ := parseRequestHeader(frame)
				body, err := requestBody(h, frame)
				if err != nil {
					t.Fatal(err)
				}
				got, err := produceAcks(v, body)
				if err != nil || got != acks {
					t.Fatalf("v%d txn=%v: acks %d, %v; want %d", v, txn, got, err, acks)
				}
			}
		}
	}
}

func TestReadFrameRejectsBadSizes(t *testing.T) {
	for _, size := range []int32{-1, 0, 3, maxFrameSize + 1} {
		b := binary.BigEndian.AppendUint32(nil, uint32(size))
		if _, err := readFrame(bufio.NewReader(bytes.NewReader(b))); !errors.Is(err, errMalformed) {
			t.Errorf("size %d: err = %v, want errMalformed", size, err)
		}
	}
}

// testProxy returns a Proxy that is not listening, for rewrite and rule
// tests: upstream 127.0.0.1:9092, advertised as 127.0.0.1:40000.
func testProxy() *Proxy {
	return &Proxy{
		up:     endpoint{"127.0.0.1", 9092},
		adv:    endpoint{"127.0.0.1", 40000},
		upNode: -1,
		log:    zap.NewNop(),
		rng:    defaultRand(1),
		conns:  map[*conn]struct{}{},
	}
}

// upstreamResponse frames resp as a broker would, with a tag in the header
// of flexible versions so that header preservation is tested too.
func upstreamResponse(resp kmsg.Response, corr int32) []byte {
	header := binary.BigEndian.AppendUint32(nil, uint32(corr))
	if resp.IsFlexible() {
		header = append(header, 1, 5, 2, 'h', 'i') // one tag: key 5, 2 bytes
	}
	return appendFrame(nil, header, resp.AppendTo(nil))
}

func TestRewriteMetadataEveryVersion(t *testing.T) {
	for v := int16(0); v <= kmsg.Metadata.Response().MaxVersion(); v++ {
		p := testProxy()
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(v)
		for _, b := range []struct {
			id   int32
			host string
			port int32
		}{{1, "localhost", 9092}, {2, "other", 9092}, {3, "127.0.0.1", 9093}} {
			mb := kmsg.NewMetadataResponseBroker()
			mb.NodeID, mb.Host, mb.Port = b.id, b.host, b.port
			resp.Brokers = append(resp.Brokers, mb)
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(v)
		in := upstreamResponse(resp, 9)
		out, err := p.inspectResponse(reqHeader{key: 3, version: v, corr: 9}, in, p.log)
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if resp.IsFlexible() && !bytes.Contains(out[:16], []byte{1, 5, 2, 'h', 'i'}) {
			t.Errorf("v%d: header tags lost: % x", v, out[:16])
		}
		_, got := decodeResponse(t, out, req)
		bs := got.(*kmsg.MetadataResponse).Brokers
		if bs[0].Host != "127.0.0.1" || bs[0].Port != 40000 {
			t.Errorf("v%d: upstream broker not rewritten: %+v", v, bs[0])
		}
		if bs[1].Host != "other" || bs[2].Port != 9093 {
			t.Errorf("v%d: other brokers touched: %+v", v, bs[1:])
		}
		if p.stats.Rewritten != 1 || p.stats.Unmatched != 2 || p.upNode != 1 {
			t.Errorf("v%d: stats %+v, upNode %d", v, p.stats, p.upNode)
		}
	}
}

func TestRewriteSingleBrokerAndLearnedNode(t *testing.T) {
	p := testProxy()
	meta := kmsg.NewPtrMetadataResponse()
	meta.SetVersion(12)
	b := kmsg.NewMetadataResponseBroker()
	b.NodeID, b.Host, b.Port = 7, "kafka.internal", 29092 // advertised under another name
	meta.Brokers = []kmsg.MetadataResponseBroker{b}
	out, err := p.inspectResponse(reqHeader{key: 3, version: 12, corr: 1}, upstreamResponse(meta, 1), p.log)
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(12)
	_, got := decodeResponse(t, out, req)
	if gb := got.(*kmsg.MetadataResponse).Brokers[0]; gb.Host != "127.0.0.1" || gb.Port != 40000 {
		t.Fatalf("single broker not rewritten: %+v", gb)
	}
	// The coordinator is then recognised by node id.
	fc := kmsg.NewPtrFindCoordinatorResponse()
	fc.SetVersion(2)
	fc.NodeID, fc.Host, fc.Port = 7, "kafka.internal", 29092
	out, err = p.inspectResponse(reqHeader{key: 10, version: 2, corr: 2}, upstreamResponse(fc, 2), p.log)
	if err != nil {
		t.Fatal(err)
	}
	fcReq := kmsg.NewPtrFindCoordinatorRequest()
	fcReq.SetVersion(2)
	_, got = decodeResponse(t, out, fcReq)
	if r := got.(*kmsg.FindCoordinatorResponse); r.Host != "127.0.0.1" || r.Port != 40000 {
		t.Fatalf("coordinator not rewritten: %+v", r)
	}
}

func TestRewriteFindCoordinatorEveryVersion(t *testing.T) {
	for v := int16(0); v <= kmsg.FindCoordinator.Response().MaxVersion(); v++ {
		p := testProxy()
		resp := kmsg.NewPtrFindCoordinatorResponse()
		resp.SetVersion(v)
		resp.NodeID, resp.Host, resp.Port = 1, "127.0.0.1", 9092
		for _, c := range []struct {
			key  string
			host string
			port int32
		}{{"g", "localhost", 9092}, {"h", "elsewhere", 9092}} {
			rc := kmsg.NewFindCoordinatorResponseCoordinator()
			rc.Key, rc.NodeID, rc.Host, rc.Port = c.key, 1, c.host, c.port
			if c.host == "elsewhere" {
				rc.NodeID = 2
			}
			resp.Coordinators = append(resp.Coordinators, rc)
		}
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.SetVersion(v)
		out, err := p.inspectResponse(reqHeader{key: 10, version: v, corr: 3}, upstreamResponse(resp, 3), p.log)
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		_, got := decodeResponse(t, out, req)
		r := got.(*kmsg.FindCoordinatorResponse)
		if v < 4 {
			if r.Host != "127.0.0.1" || r.Port != 40000 {
				t.Errorf("v%d: coordinator not rewritten: %+v", v, r)
			}
			continue
		}
		if c := r.Coordinators[0]; c.Host != "127.0.0.1" || c.Port != 40000 {
			t.Errorf("v%d: coordinator g not rewritten: %+v", v, c)
		}
		if c := r.Coordinators[1]; c.Host != "elsewhere" || c.Port != 9092 {
			t.Errorf("v%d: coordinator h touched: %+v", v, c)
		}
	}
}

func TestRewriteDescribeClusterEveryVersion(t *testing.T) {
	for v := int16(0); v <= kmsg.DescribeCluster.Response().MaxVersion(); v++ {
		p := testProxy()
		resp := kmsg.NewPtrDescribeClusterResponse()
		resp.SetVersion(v)
		b := kmsg.NewDescribeClusterResponseBroker()
		b.NodeID, b.Host, b.Port = 1, "127.0.0.1", 9092
		resp.Brokers = []kmsg.DescribeClusterResponseBroker{b}
		req := kmsg.NewPtrDescribeClusterRequest()
		req.SetVersion(v)
		out, err := p.inspectResponse(reqHeader{key: 60, version: v, corr: 4}, upstreamResponse(resp, 4), p.log)
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		_, got := decodeResponse(t, out, req)
		if gb := got.(*kmsg.DescribeClusterResponse).Brokers[0]; gb.Host != "127.0.0.1" || gb.Port != 40000 {
			t.Errorf("v%d: broker not rewritten: %+v", v, gb)
		}
	}
}

func TestInspectResponseChecksCorrelation(t *testing.T) {
	p := testProxy()
	resp := kmsg.NewPtrHeartbeatResponse()
	in := upstreamResponse(resp, 5)
	if _, err := p.inspectResponse(reqHeader{key: 12, corr: 6}, in, p.log); !errors.Is(err, errMalformed) {
		t.Fatalf("err = %v, want errMalformed", err)
	}
	out, err := p.inspectResponse(reqHeader{key: 12, corr: 5}, in, p.log)
	if err != nil || !bytes.Equal(out, in) {
		t.Fatalf("untouched response changed: %v", err)
	}
}

func TestUndecodableResponseIsForwarded(t *testing.T) {
	p := testProxy()
	in := appendFrame(nil, binary.BigEndian.AppendUint32(nil, 8), []byte{0xff})
	out, err := p.inspectResponse(reqHeader{key: 3, version: 1, corr: 8}, in, p.log)
	if err != nil || !bytes.Equal(out, in) || p.stats.RewriteErrors != 1 {
		t.Fatalf("out=% x err=%v stats=%+v", out, err, p.stats)
	}
}

func TestJudge(t *testing.T) {
	p := testProxy()
	every, _ := p.Delay(kmsg.Fetch, time.Second, Every(3))
	times, _ := p.Fail(kmsg.OffsetCommit, 16, Times(2))
	_, _ = p.Delay(AnyKey, time.Millisecond)
	var delays []time.Duration
	for range 6 {
		delays = append(delays, p.judge(int16(kmsg.Fetch)).delay)
	}
	want := []time.Duration{time.Millisecond, time.Millisecond, time.Second + time.Millisecond,
		time.Millisecond, time.Millisecond, time.Second + time.Millisecond}
	if !reflect.DeepEqual(delays, want) {
		t.Errorf("delays %v, want %v", delays, want)
	}
	if every.Applied() != 2 {
		t.Errorf("Every(3) applied %d times, want 2", every.Applied())
	}
	var fails []bool
	for range 4 {
		fails = append(fails, p.judge(int16(kmsg.OffsetCommit)).fail)
	}
	if !reflect.DeepEqual(fails, []bool{true, true, false, false}) || times.Applied() != 2 {
		t.Errorf("Times(2): %v, applied %d", fails, times.Applied())
	}
	times.Remove()
	times.Remove()
	if p.judge(int16(kmsg.OffsetCommit)).fail {
		t.Error("removed rule still acts")
	}
	// A Fail rule on AnyKey leaves keys it cannot answer alone.
	_, _ = p.Fail(AnyKey, 16)
	if p.judge(int16(kmsg.Metadata)).fail || !p.judge(int16(kmsg.Heartbeat)).fail {
		t.Error("Fail(AnyKey) should fail Heartbeat but not Metadata")
	}
	p.ClearRules()
	if v := p.judge(int16(kmsg.Heartbeat)); v != (verdict{}) {
		t.Errorf("after ClearRules: %+v", v)
	}
}

func TestJudgeProbabilityIsSeeded(t *testing.T) {
	run := func(seed uint64) []bool {
		p := testProxy()
		p.rng = defaultRand(seed)
		_, _ = p.ResetOn(kmsg.Heartbeat, Probability(0.3))
		var out []bool
		for range 1000 {
			out = append(out, p.judge(int16(kmsg.Heartbeat)).reset)
		}
		return out
	}
	a, b := run(42), run(42)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different decisions")
	}
	n := 0
	for _, x := range a {
		if x {
			n++
		}
	}
	if n < 230 || n > 370 {
		t.Errorf("Probability(0.3) acted %d times in 1000", n)
	}
}

func TestLatencyJitterBounds(t *testing.T) {
	p := testProxy()
	p.Latency(10*time.Millisecond, 5*time.Millisecond)
	for range 500 {
		if d := p.judge(0).latency; d < 5*time.Millisecond || d > 15*time.Millisecond {
			t.Fatalf("latency %v outside [5ms, 15ms]", d)
		}
	}
	p.Latency(time.Millisecond, time.Second)
	for range 500 {
		if d := p.judge(0).latency; d < 0 {
			t.Fatalf("negative latency %v", d)
		}
	}
	p.Latency(0, 0)
	if d := p.judge(0).latency; d != 0 {
		t.Fatalf("latency %v after Latency(0, 0)", d)
	}
}
