package tidemark_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// Incremental fetch sessions (KIP-227) through the faults a broker and a
// network add to them: sessions the broker no longer knows (evicted),
// epochs out of step, requests lost before the broker saw them, and
// answers lost after it applied them (its epoch moved on, the consumer's
// did not). Every message is handled exactly once, on kfake and on Kafka,
// and each refusal costs one full request (Stats.FetchSessionResets).
func TestFetchSessionFaults(t *testing.T) {
	const parts, waves, perWave = 6, 4, 200
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	cl.WaitLeaders(t, topic, parts)

	notFound, err := cl.Proxy.Fail(kmsg.Fetch, int16(kafka.FetchSessionIDNotFound), kafkaproxy.Every(5))
	if err != nil {
		t.Fatal(err)
	}
	badEpoch, err := cl.Proxy.Fail(kmsg.Fetch, int16(kafka.InvalidFetchSessionEpoch), kafkaproxy.Every(7))
	if err != nil {
		t.Fatal(err)
	}
	reset, err := cl.Proxy.ResetOn(kmsg.Fetch, kafkaproxy.Every(11), kafkaproxy.Times(3))
	if err != nil {
		t.Fatal(err)
	}
	// Held past the consumer's timeout: the broker applied the request and
	// moved its session's epoch on; the consumer never saw the answer.
	late, err := cl.Proxy.DelayResponse(kmsg.Fetch, 4*time.Second, kafkaproxy.Every(13), kafkaproxy.Times(2))
	if err != nil {
		t.Fatal(err)
	}

	rec := &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Timeout = 2 * time.Second
	r := frameworktest.Start(t, cfg)
	for w := range waves {
		cl.Produce(t, topic, parts, w*perWave, perWave)
		want := (w + 1) * perWave * parts
		testsupport.WaitFor(t, 60*time.Second, fmt.Sprintf("%d messages handled", want), func() bool { return rec.Count() >= want })
	}
	applied := notFound.Applied() + badEpoch.Applied()
	for _, rule := range []*kafkaproxy.Rule{notFound, badEpoch, reset, late} {
		t.Logf("%s", rule)
		rule.Remove()
	}
	// The last wave, with sessions left alone.
	cl.Produce(t, topic, parts, waves*perWave, perWave)
	total := (waves + 1) * perWave * parts
	testsupport.WaitFor(t, 60*time.Second, fmt.Sprintf("%d messages handled", total), func() bool { return rec.Count() >= total })
	st := r.C.Stats()
	r.Stop(t)

	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, int64((waves+1)*perWave)))
	t.Logf("%d fetch requests, %d session refusals injected, %d sessions reset, %d requests reset, %d answers held past the timeout",
		st.FetchRequests, applied, st.FetchSessionResets, reset.Applied(), late.Applied())
	if applied == 0 || late.Applied() == 0 {
		t.Fatalf("the faults never acted: %d refusals, %d late answers", applied, late.Applied())
	}
	// Each refusal the loop read resets its session once; one may have
	// been in flight at the stop.
	if st.FetchSessionResets+1 < uint64(applied) || st.FetchSessionResets > uint64(applied) {
		t.Errorf("Stats.FetchSessionResets %d, want the %d refusals injected", st.FetchSessionResets, applied)
	}
}

// A broker whose session cache has room for one session, shared by two
// consumers of one topic in two groups: each full request evicts the other
// consumer's session, whose next request is refused (FETCH_SESSION_ID_NOT_
// FOUND) and sent again in full. Both handle every message exactly once.
// kfake only: Kafka's cache size is a static broker setting.
func TestFetchSessionsEvicted(t *testing.T) {
	if testsupport.RealBroker() {
		t.Skip("needs a broker with max.incremental.fetch.session.cache.slots=1 (kfake's BrokerConfigs); Kafka's is static")
	}
	const parts, waves, perWave = 4, 3, 100
	cl := testsupport.Start(t, kfake.BrokerConfigs(map[string]string{"max.incremental.fetch.session.cache.slots": "1"}))
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	cl.WaitLeaders(t, topic, parts)

	recs := []*testsupport.Recorder{{}, {}}
	var rs []*frameworktest.Running
	for i, rec := range recs {
		cfg := frameworktest.Config(t, cl.Brokers, testsupport.Name(t, fmt.Sprintf("g%d", i)), topic, filepath.Join(t.TempDir(), "o.db"), rec)
		rs = append(rs, frameworktest.Start(t, cfg))
	}
	for w := range waves {
		cl.Produce(t, topic, parts, w*perWave, perWave)
		want := (w + 1) * perWave * parts
		testsupport.WaitFor(t, 60*time.Second, fmt.Sprintf("%d messages handled by each consumer", want), func() bool {
			return recs[0].Count() >= want && recs[1].Count() >= want
		})
	}
	for i, r := range rs {
		st := r.C.Stats()
		r.Stop(t)
		testsupport.ExactlyOnce(t, recs[i], testsupport.Offsets(parts, 0), testsupport.Offsets(parts, waves*perWave))
		t.Logf("consumer %d: %d fetch requests, %d sessions reset", i, st.FetchRequests, st.FetchSessionResets)
		if st.FetchSessionResets == 0 {
			t.Errorf("consumer %d: no session was refused, though two consumers share a cache of one", i)
		}
	}
}
