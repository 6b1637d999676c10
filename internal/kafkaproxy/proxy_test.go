package kafkaproxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// TestProduceConsumeStaysOnProxy produces and consumes with kafka-go through
// the proxy and checks that every request the broker received went through
// the proxy, i.e. that address rewriting kept every client on it.
func TestProduceConsumeStaysOnProxy(t *testing.T) {
	t.Parallel()
	topic := testsupport.Name(t, "kafkaproxy-t")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	tr := newTransport(t)

	w := &kafka.Writer{
		Addr: kafka.TCP(px.Addr()), Topic: topic, Transport: tr,
		BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafka.RequireAll,
	}
	const n = 20
	for i := range n {
		msg := kafka.Message{Key: []byte(strconv.Itoa(i)), Value: []byte(fmt.Sprintf("v%d", i))}
		if err := w.WriteMessages(ctxTimeout(t, 10*time.Second), msg); err != nil {
			t.Fatalf("WriteMessages %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Writer.Close: %v", err)
	}

	// kafka.Reader dials with a Dialer and finds the leader through Metadata.
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{px.Addr()}, Topic: topic, Partition: 0,
		MaxWait: 100 * time.Millisecond, ReadLagInterval: -1,
	})
	for i := range n {
		m, err := r.ReadMessage(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatalf("ReadMessage %d: %v", i, err)
		}
		if m.Offset != int64(i) || string(m.Value) != fmt.Sprintf("v%d", i) {
			t.Fatalf("message %d: offset %d value %q", i, m.Offset, m.Value)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Reader.Close: %v", err)
	}

	// kafka.Client: Metadata names the proxy, Fetch works through it.
	cl := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: tr}
	md, err := cl.Metadata(ctxTimeout(t, 10*time.Second), &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatalf("Metadata: %v", err)
	}
	for _, br := range append(md.Brokers, md.Controller) {
		if got := net.JoinHostPort(br.Host, strconv.Itoa(br.Port)); got != px.Addr() {
			t.Errorf("Metadata names broker %s, want the proxy %s", got, px.Addr())
		}
	}
	fr, err := cl.Fetch(ctxTimeout(t, 10*time.Second), &kafka.FetchRequest{
		Topic: topic, Partition: 0, Offset: 0, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond,
	})
	if err != nil || fr.Error != nil || fr.HighWatermark != n {
		t.Fatalf("Fetch: err=%v resp.Error=%v hwm=%d", err, fr.Error, fr.HighWatermark)
	}
	tr.CloseIdleConnections()

	st := px.Stats()
	if st.Rewritten == 0 || st.Unmatched != 0 || st.RewriteErrors != 0 {
		t.Errorf("rewrite stats %+v", st)
	}
	for _, k := range []kmsg.Key{kmsg.ApiVersions, kmsg.Metadata, kmsg.Produce, kmsg.Fetch} {
		if c := px.Counts(k); c.Forwarded == 0 || c.Seen != c.Forwarded {
			t.Errorf("%s counts %+v", k.Name(), c)
		}
	}
	if b.obs == nil {
		return
	}
	// Everything the broker saw came through the proxy. The proxy counts a
	// request just before writing it, so the broker may lag a moment.
	want := map[kmsg.Key]int64{}
	for k, c := range px.Stats().Keys {
		want[k] = c.Forwarded
	}
	testsupport.WaitFor(t, 5*time.Second, "broker and proxy counts to agree", func() bool {
		got := b.obs.counts()
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// TestFailOffsetCommitClient fails kafka.Client.OffsetCommit (a recent
// OffsetCommit version) and checks that the client sees the error and the
// broker keeps the old offset.
func TestFailOffsetCommitClient(t *testing.T) {
	t.Parallel()
	topic, group := testsupport.Name(t, "kafkaproxy-t"), testsupport.Name(t, "kafkaproxy-g")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	cl := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: newTransport(t)}

	mustCommit(t, cl, group, topic, 3)

	rule := mustRule(t)(px.Fail(kmsg.OffsetCommit, 16)) // NOT_COORDINATOR
	err := commit(t, cl, group, topic, 7)
	if !errors.Is(err, kafka.NotCoordinatorForGroup) {
		t.Fatalf("failed commit returned %v, want NotCoordinatorForGroup", err)
	}
	if got := committed(t, b, group, topic); got != 3 {
		t.Fatalf("broker's committed offset %d after the failed commit, want 3", got)
	}
	if c := px.Counts(kmsg.OffsetCommit); c.Failed != 1 || rule.Applied() != 1 {
		t.Fatalf("counts %+v, rule applied %d", c, rule.Applied())
	}
	if b.obs != nil {
		vs := b.obs.versions(kmsg.OffsetCommit)
		if len(vs) != 1 || vs[0] < 3 {
			t.Fatalf("broker saw OffsetCommit versions %v; want one recent version", vs)
		}
		t.Logf("kafka.Client sent OffsetCommit v%d", vs[0])
	}

	rule.Remove()
	mustCommit(t, cl, group, topic, 7)
	if got := committed(t, b, group, topic); got != 7 {
		t.Fatalf("committed offset %d, want 7", got)
	}
}

// TestFailGenerationCommit fails Generation.CommitOffsets (OffsetCommit v2)
// of a kafka-go consumer group that joined through the proxy.
func TestFailGenerationCommit(t *testing.T) {
	t.Parallel()
	topic, group := testsupport.Name(t, "kafkaproxy-t"), testsupport.Name(t, "kafkaproxy-g")
	b := startBroker(t, topic)
	px := newProxy(t, b)

	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: group, Brokers: []string{px.Addr()}, Topics: []string{topic},
		HeartbeatInterval: 500 * time.Millisecond, SessionTimeout: 10 * time.Second,
		RebalanceTimeout: 2 * time.Second, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cg.Close(); err != nil {
			t.Errorf("ConsumerGroup.Close: %v", err)
		}
	}()
	gen, err := cg.Next(ctxTimeout(t, 15*time.Second))
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{topic: {0: 2}}); err != nil {
		t.Fatalf("first CommitOffsets: %v", err)
	}

	rule := mustRule(t)(px.Fail(kmsg.OffsetCommit, 16))
	err = gen.CommitOffsets(map[string]map[int]int64{topic: {0: 9}})
	if !errors.Is(err, kafka.NotCoordinatorForGroup) {
		t.Fatalf("failed CommitOffsets returned %v, want NotCoordinatorForGroup", err)
	}
	if got := committed(t, b, group, topic); got != 2 {
		t.Fatalf("broker's committed offset %d after the failed commit, want 2", got)
	}
	if b.obs != nil {
		if vs := b.obs.versions(kmsg.OffsetCommit); len(vs) != 1 || vs[0] != 2 {
			t.Fatalf("broker saw OffsetCommit versions %v, want [2]", vs)
		}
	}
	rule.Remove()
	if err := gen.CommitOffsets(map[string]map[int]int64{topic: {0: 9}}); err != nil {
		t.Fatalf("CommitOffsets after Remove: %v", err)
	}
	if got := committed(t, b, group, topic); got != 9 {
		t.Fatalf("committed offset %d, want 9", got)
	}
	if st := px.Stats(); st.Unmatched != 0 || px.Counts(kmsg.FindCoordinator).Forwarded == 0 {
		t.Errorf("the group's coordinator was not reached through the proxy: %+v", st)
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	topic, group := testsupport.Name(t, "kafkaproxy-t"), testsupport.Name(t, "kafkaproxy-g")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	cl := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: newTransport(t)}

	mustCommit(t, cl, group, topic, 0) // the group coordinator is up

	const d = 300 * time.Millisecond
	rule := mustRule(t)(px.Delay(kmsg.OffsetCommit, d, kafkaproxy.Every(2)))
	var took []time.Duration
	for i := range 2 {
		start := time.Now()
		if err := commit(t, cl, group, topic, int64(i+1)); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
		took = append(took, time.Since(start))
	}
	if took[1] < d {
		t.Errorf("second commit took %v, want at least %v", took[1], d)
	}
	if c := px.Counts(kmsg.OffsetCommit); c.Delayed != 1 || rule.Applied() != 1 {
		t.Errorf("counts %+v, rule applied %d; want one delay", c, rule.Applied())
	}
	t.Logf("commit durations %v (only the second is delayed)", took)
}

// DelayResponse forwards the request at once: a commit whose client gave up
// waiting is applied by the broker all the same (an unknown outcome).
func TestDelayResponse(t *testing.T) {
	t.Parallel()
	topic, group := testsupport.Name(t, "kafkaproxy-t"), testsupport.Name(t, "kafkaproxy-g")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	cl := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: newTransport(t)}
	mustCommit(t, cl, group, topic, 0)

	rule := mustRule(t)(px.DelayResponse(kmsg.OffsetCommit, 2*time.Second, kafkaproxy.Times(1)))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 7}}}})
	if err == nil {
		t.Fatal("the commit answered despite a 2s response delay and a 300ms deadline")
	}
	testsupport.WaitFor(t, 5*time.Second, "the broker to hold the commit the client gave up on", func() bool {
		return committed(t, b, group, topic) == 7
	})
	if rule.Applied() != 1 || px.Counts(kmsg.OffsetCommit).Delayed != 1 {
		t.Fatalf("rule applied %d, counts %+v", rule.Applied(), px.Counts(kmsg.OffsetCommit))
	}
	if s := rule.String(); s != "delay-response OffsetCommit 2s times=1" {
		t.Fatalf("rule.String() = %q", s)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	px := newProxy(t, b)
	const d = 100 * time.Millisecond
	px.Latency(d, 20*time.Millisecond)
	rc := dialRaw(t, px.Addr())
	start := time.Now()
	for corr := int32(1); corr <= 3; corr++ { // pipelined: each waits its turn
		rc.send(kmsg.NewPtrApiVersionsRequest(), corr)
	}
	for corr := int32(1); corr <= 3; corr++ {
		if got, _, err := rc.recv(5 * time.Second); err != nil || got != corr {
			t.Fatalf("response %d: got %d, %v", corr, got, err)
		}
	}
	if took := time.Since(start); took < 3*(d-20*time.Millisecond) {
		t.Fatalf("3 requests with %v±20ms latency took %v", d, took)
	}
	px.Latency(0, 0)
	start = time.Now()
	rc.send(kmsg.NewPtrApiVersionsRequest(), 4)
	if _, _, err := rc.recv(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("without latency: %v", time.Since(start))
}

func TestResetOn(t *testing.T) {
	t.Parallel()
	topic, group := testsupport.Name(t, "kafkaproxy-t"), testsupport.Name(t, "kafkaproxy-g")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	cl := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: newTransport(t)}
	rule := mustRule(t)(px.ResetOn(kmsg.OffsetCommit))
	err := commit(t, cl, group, topic, 5)
	if err == nil {
		t.Fatal("commit succeeded through a ResetOn rule")
	}
	t.Logf("client error: %v", err)
	if c := px.Counts(kmsg.OffsetCommit); c.Reset == 0 || c.Forwarded != 0 {
		t.Fatalf("counts %+v", c)
	}
	if got := committed(t, b, group, topic); got != -1 {
		t.Fatalf("committed offset %d, want none", got)
	}
	rule.Remove()
	mustCommit(t, cl, group, topic, 5)
	if got := committed(t, b, group, topic); got != 5 {
		t.Fatalf("committed offset %d after Remove, want 5", got)
	}
}

// TestResetIsAbrupt checks on the wire that a reset is a TCP RST, not a FIN.
func TestResetIsAbrupt(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	px := newProxy(t, b)
	mustRule(t)(px.ResetOn(kmsg.Heartbeat))
	rc := dialRaw(t, px.Addr())
	rc.send(kmsg.NewPtrHeartbeatRequest(), 1)
	_, _, err := rc.recv(5 * time.Second)
	if !errors.Is(err, errConnReset) {
		t.Fatalf("read after reset: %v, want connection reset by peer", err)
	}
}

// TestBlackhole checks that a ctx-bounded request times out while the proxy
// is blackholed, that held traffic flows again afterwards, and that clients
// recover.
func TestBlackhole(t *testing.T) {
	t.Parallel()
	topic := testsupport.Name(t, "kafkaproxy-t")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	cl := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: newTransport(t)}
	// Client.Metadata may be answered from the Transport's cache: ask for
	// offsets, which always go to the broker.
	md := func(d time.Duration) error {
		res, err := cl.ListOffsets(ctxTimeout(t, d), &kafka.ListOffsetsRequest{
			Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}},
		})
		if err != nil {
			return err
		}
		return res.Topics[topic][0].Error
	}
	if err := md(10 * time.Second); err != nil {
		t.Fatalf("ListOffsets before: %v", err)
	}

	px.Blackhole(true)
	raw := dialRaw(t, px.Addr()) // accepted while blackholed
	raw.send(kmsg.NewPtrApiVersionsRequest(), 1)
	start := time.Now()
	if err := md(300 * time.Millisecond); !isTimeout(err) { // kafka-go reports ctx deadlines as i/o timeouts
		t.Fatalf("ListOffsets while blackholed: %v, want a timeout", err)
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("ListOffsets failed after %v, before its deadline", took)
	}
	if _, _, err := raw.recv(100 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("raw read while blackholed: %v, want timeout", err)
	}

	px.Blackhole(false)
	corr, resp, err := raw.recv(5 * time.Second)
	if err != nil || corr != 1 || resp.(*kmsg.ApiVersionsResponse).ErrorCode != 0 {
		t.Fatalf("held ApiVersions after Blackhole(false): corr=%d err=%v", corr, err)
	}
	if err := md(10 * time.Second); err != nil {
		t.Fatalf("ListOffsets after Blackhole(false): %v", err)
	}
}

// TestOrderWithSyntheticResponses pipelines requests on one connection, some
// failed by the proxy and the first one delayed, and checks the responses
// come back in request order with the right contents.
func TestOrderWithSyntheticResponses(t *testing.T) {
	t.Parallel()
	topic := testsupport.Name(t, "kafkaproxy-t")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	mustRule(t)(px.Delay(kmsg.ApiVersions, 200*time.Millisecond))
	mustRule(t)(px.Fail(kmsg.OffsetCommit, 16))

	commit := func(v int16) *kmsg.OffsetCommitRequest {
		r := kmsg.NewPtrOffsetCommitRequest()
		r.SetVersion(v)
		r.Group, r.Generation = "g", -1
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = topic
		for p := range int32(3) {
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset = p, 10
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = []kmsg.OffsetCommitRequestTopic{rt}
		return r
	}
	meta := kmsg.NewPtrMetadataRequest()
	meta.SetVersion(12)
	apiv := kmsg.NewPtrApiVersionsRequest()
	apiv.SetVersion(3)
	apiv.ClientSoftwareName, apiv.ClientSoftwareVersion = "raw", "1"

	rc := dialRaw(t, px.Addr())
	rc.send(apiv, 1)      // delayed 200 ms, forwarded
	rc.send(commit(2), 2) // answered by the proxy
	rc.send(meta, 3)      // forwarded, flexible, rewritten
	rc.send(commit(8), 4) // answered by the proxy, flexible
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID = "g", "nobody"
	rc.send(hb, 5) // forwarded; the broker rejects the member
	for want := int32(1); want <= 5; want++ {
		corr, resp, err := rc.recv(5 * time.Second)
		if err != nil {
			t.Fatalf("response %d: %v", want, err)
		}
		if corr != want {
			t.Fatalf("got response %d, want %d: responses out of order", corr, want)
		}
		switch r := resp.(type) {
		case *kmsg.OffsetCommitResponse:
			if len(r.Topics) != 1 || r.Topics[0].Topic != topic || len(r.Topics[0].Partitions) != 3 {
				t.Fatalf("synthetic OffsetCommit: %+v", r.Topics)
			}
			for _, p := range r.Topics[0].Partitions {
				if p.ErrorCode != 16 {
					t.Fatalf("synthetic OffsetCommit partition %+v", p)
				}
			}
		case *kmsg.MetadataResponse:
			if len(r.Brokers) != 1 || net.JoinHostPort(r.Brokers[0].Host, strconv.Itoa(int(r.Brokers[0].Port))) != px.Addr() {
				t.Fatalf("Metadata brokers %+v, want the proxy %s", r.Brokers, px.Addr())
			}
		case *kmsg.ApiVersionsResponse:
			if r.ErrorCode != 0 || len(r.ApiKeys) == 0 {
				t.Fatalf("ApiVersions: %+v", r)
			}
		case *kmsg.HeartbeatResponse:
			if r.ErrorCode == 0 {
				t.Fatal("heartbeat of an unknown member succeeded")
			}
		}
	}
	if c := px.Counts(kmsg.OffsetCommit); c.Seen != 2 || c.Failed != 2 || c.Forwarded != 0 {
		t.Errorf("OffsetCommit counts %+v", c)
	}
	if b.obs != nil && len(b.obs.versions(kmsg.OffsetCommit)) != 0 {
		t.Error("a failed OffsetCommit reached the broker")
	}
}

// TestRulesChangeUnderTraffic changes every setting while a producer and a
// reader run, then checks that traffic recovers once everything is cleared.
func TestRulesChangeUnderTraffic(t *testing.T) {
	t.Parallel()
	topic := testsupport.Name(t, "kafkaproxy-t")
	b := startBroker(t, topic)
	px := newProxy(t, b, kafkaproxy.WithSeed(7))
	tr := newTransport(t)
	w := &kafka.Writer{
		Addr: kafka.TCP(px.Addr()), Topic: topic, Transport: tr,
		BatchTimeout: time.Millisecond, MaxAttempts: 2, WriteBackoffMin: time.Millisecond, WriteBackoffMax: 5 * time.Millisecond,
	}
	defer w.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				_ = w.WriteMessages(wctx, kafka.Message{Value: []byte("x")}) // errors expected
				wcancel()
			}
		})
	}
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			switch i % 6 {
			case 0:
				px.Latency(time.Millisecond, time.Millisecond)
			case 1:
				r, _ := px.Delay(kafkaproxy.AnyKey, 2*time.Millisecond, kafkaproxy.Probability(0.5))
				time.AfterFunc(20*time.Millisecond, r.Remove)
			case 2:
				_, _ = px.Fail(kmsg.Produce, 6, kafkaproxy.Times(3)) // NOT_LEADER_FOR_PARTITION
			case 3:
				px.Blackhole(true)
				time.Sleep(5 * time.Millisecond)
				px.Blackhole(false)
			case 4:
				_, _ = px.ResetOn(kmsg.Metadata, kafkaproxy.Every(5))
			case 5:
				px.ResetAll()
				px.ClearRules()
				px.Latency(0, 0)
			}
			_ = px.Stats()
			time.Sleep(10 * time.Millisecond)
		}
	})
	wg.Wait()

	px.ClearRules()
	px.Latency(0, 0)
	px.Blackhole(false)
	// A reset of the last round may have closed the connections the
	// writer keeps idle, unknown to it (its two attempts could both take
	// one): the final write dials afresh.
	tr.CloseIdleConnections()
	if err := w.WriteMessages(ctxTimeout(t, 10*time.Second), kafka.Message{Value: []byte("final")}); err != nil {
		t.Fatalf("write after clearing all faults: %v", err)
	}
	st := px.Stats()
	if st.Keys[kmsg.Produce].Forwarded == 0 {
		t.Fatalf("no Produce forwarded: %+v", st)
	}
	t.Logf("stats: accepted=%d produce=%+v metadata=%+v", st.Accepted, st.Keys[kmsg.Produce], st.Keys[kmsg.Metadata])
}

func TestCloseWithHeldConnections(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	px, err := kafkaproxy.New(b.addr)
	if err != nil {
		t.Fatal(err)
	}
	px.Blackhole(true)
	mustRule(t)(px.Delay(kmsg.Metadata, time.Hour))
	var raws []*rawClient
	for i := range 3 {
		rc := dialRaw(t, px.Addr())
		if i == 0 {
			rc.send(kmsg.NewPtrMetadataRequest(), 1)
		} else {
			rc.send(kmsg.NewPtrApiVersionsRequest(), 1)
		}
		raws = append(raws, rc)
	}
	testsupport.WaitFor(t, 5*time.Second, "3 open connections", func() bool { return px.Stats().Open == 3 })

	done := make(chan error, 1)
	go func() { done <- px.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on held connections")
	}
	for _, rc := range raws {
		if _, _, err := rc.recv(5 * time.Second); err == nil {
			t.Fatal("connection still served after Close")
		}
	}
	if err := px.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", px.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
}

func TestResetAll(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	px := newProxy(t, b)
	rc := dialRaw(t, px.Addr())
	rc.send(kmsg.NewPtrApiVersionsRequest(), 1)
	if _, _, err := rc.recv(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	px.ResetAll()
	if _, _, err := rc.recv(5 * time.Second); !errors.Is(err, errConnReset) {
		t.Fatalf("read after ResetAll: %v, want connection reset", err)
	}
	testsupport.WaitFor(t, 5*time.Second, "no open connections", func() bool { return px.Stats().Open == 0 })
	// New connections work.
	rc = dialRaw(t, px.Addr())
	rc.send(kmsg.NewPtrApiVersionsRequest(), 2)
	if _, _, err := rc.recv(5 * time.Second); err != nil {
		t.Fatalf("new connection after ResetAll: %v", err)
	}
	if st := px.Stats(); st.Accepted != 2 {
		t.Errorf("accepted %d connections, want 2", st.Accepted)
	}
}

func TestUpstreamDownDropsClient(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	px := newProxy(t, broker{addr: addr}, kafkaproxy.WithDialTimeout(time.Second))
	rc := dialRaw(t, px.Addr())
	rc.send(kmsg.NewPtrApiVersionsRequest(), 1)
	if _, _, err := rc.recv(5 * time.Second); err == nil || isTimeout(err) {
		t.Fatalf("read with the upstream down: %v, want the connection closed", err)
	}
}

func TestNewAndRuleValidation(t *testing.T) {
	t.Parallel()
	for _, up := range []string{"", "nohost", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:x"} {
		if px, err := kafkaproxy.New(up); err == nil {
			px.Close()
			t.Errorf("New(%q) succeeded", up)
		}
	}
	if _, err := kafkaproxy.New("127.0.0.1:9092", kafkaproxy.WithDialTimeout(0)); err == nil {
		t.Error("WithDialTimeout(0) accepted")
	}
	if _, err := kafkaproxy.New("127.0.0.1:9092", kafkaproxy.WithListenAddr("256.0.0.1:0")); err == nil {
		t.Error("bad listen address accepted")
	}

	px, err := kafkaproxy.New("127.0.0.1:9092", kafkaproxy.WithListenAddr("127.0.0.1:0"), kafkaproxy.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	if px.Upstream() != "127.0.0.1:9092" {
		t.Errorf("Upstream() = %q", px.Upstream())
	}
	if _, err := px.Fail(kmsg.Metadata, 3); !errors.Is(err, kafkaproxy.ErrUnsupported) {
		t.Errorf("Fail(Metadata): %v, want ErrUnsupported", err)
	}
	for name, opt := range map[string]kafkaproxy.RuleOption{
		"Every(0)": kafkaproxy.Every(0), "Times(0)": kafkaproxy.Times(0),
		"Probability(-0.1)": kafkaproxy.Probability(-0.1), "Probability(1.1)": kafkaproxy.Probability(1.1),
	} {
		if _, err := px.ResetOn(kmsg.Fetch, opt); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if _, err := px.Delay(kmsg.Fetch, -time.Second); err == nil {
		t.Error("negative delay accepted")
	}
	r := mustRule(t)(px.Fail(kafkaproxy.AnyKey, 16, kafkaproxy.Every(2), kafkaproxy.Probability(0.5), kafkaproxy.Times(3)))
	if got, want := r.String(), "fail AnyKey code=16 every=2 p=0.5 times=3"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestConsumerGroupHeartbeat: the consumer group protocol's heartbeat
// (KIP-848) through the proxy. Failed, it is answered by the proxy with the
// code and never reaches the broker; its response delayed, the broker has
// acted (the member joined, at epoch 1 or more) before the client hears
// of it; forwarded, the broker answers the member at its epoch.
func TestConsumerGroupHeartbeat(t *testing.T) {
	t.Parallel()
	topic, group := testsupport.Name(t, "kafkaproxy-t"), testsupport.Name(t, "kafkaproxy-g")
	b := startBroker(t, topic)
	px := newProxy(t, b)
	hb := func(epoch int32) *kmsg.ConsumerGroupHeartbeatRequest {
		r := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		r.SetVersion(0)
		r.Group, r.MemberID, r.MemberEpoch = group, "proxy-test-member-0001", epoch
		r.RebalanceTimeoutMillis = 10000
		r.SubscribedTopicNames = []string{topic}
		r.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		return r
	}
	rc := dialRaw(t, px.Addr())

	fail := mustRule(t)(px.Fail(kmsg.ConsumerGroupHeartbeat, 110)) // FENCED_MEMBER_EPOCH
	rc.send(hb(0), 1)
	_, resp, err := rc.recv(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.(*kmsg.ConsumerGroupHeartbeatResponse); r.ErrorCode != 110 || r.Assignment != nil {
		t.Fatalf("failed heartbeat answered %+v, want error 110 and no assignment", r)
	}
	if b.obs != nil && len(b.obs.versions(kmsg.ConsumerGroupHeartbeat)) != 0 {
		t.Fatal("a failed ConsumerGroupHeartbeat reached the broker")
	}
	fail.Remove()

	late := mustRule(t)(px.DelayResponse(kmsg.ConsumerGroupHeartbeat, time.Second, kafkaproxy.Times(1)))
	rc.send(hb(0), 2)
	if _, _, err := rc.recv(300 * time.Millisecond); err == nil {
		t.Fatal("the heartbeat was answered within 300ms despite a 1s response delay")
	}
	_, resp, err = rc.recv(5 * time.Second) // the held answer, now
	if err != nil {
		t.Fatal(err)
	}
	joined := resp.(*kmsg.ConsumerGroupHeartbeatResponse)
	if joined.ErrorCode != 0 || joined.MemberEpoch < 1 {
		t.Fatalf("the delayed join answered %+v, want the broker's answer with an epoch", joined)
	}
	if late.Applied() != 1 || px.Counts(kmsg.ConsumerGroupHeartbeat).Delayed != 1 {
		t.Fatalf("rule applied %d, counts %+v", late.Applied(), px.Counts(kmsg.ConsumerGroupHeartbeat))
	}

	rc.send(hb(joined.MemberEpoch), 3)
	_, resp, err = rc.recv(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.(*kmsg.ConsumerGroupHeartbeatResponse); r.ErrorCode != 0 || r.MemberEpoch < joined.MemberEpoch {
		t.Fatalf("the member's next heartbeat answered %+v", r)
	}
	leave := hb(-1)
	rc.send(leave, 4)
	if _, _, err := rc.recv(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if c := px.Counts(kmsg.ConsumerGroupHeartbeat); c.Seen != 4 || c.Failed != 1 || c.Forwarded != 3 {
		t.Errorf("ConsumerGroupHeartbeat counts %+v", c)
	}
}
