package tidemark_test

// One consumer subscribed to several topics; a subscribed topic deleted
// while it is consumed.

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/framework"

	"github.com/tidemark/tidemark/internal/testsupport"
)

// topicRecorder is a Handler counting handlings per topic, partition and
// offset, checking each payload against its partition and offset.
type topicRecorder struct {
	mu     sync.Mutex
	seen   map[string]map[int]map[int64]int
	bad    []string
	before func(ctx context.Context, m kafka.Message) error
}

func newTopicRecorder() *topicRecorder {
	return &topicRecorder{seen: map[string]map[int]map[int64]int{}}
}

func (r *topicRecorder) Handle(ctx context.Context, m kafka.Message) error {
	if r.before != nil {
		if err := r.before(ctx, m); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if want := testsupport.Value(m.Partition, int(m.Offset)); string(m.Value) != string(want) {
		r.bad = append(r.bad, fmt.Sprintf("%s/%d@%d: value %q, want %q", m.Topic, m.Partition, m.Offset, m.Value, want))
	}
	if r.seen[m.Topic] == nil {
		r.seen[m.Topic] = map[int]map[int64]int{}
	}
	if r.seen[m.Topic][m.Partition] == nil {
		r.seen[m.Topic][m.Partition] = map[int64]int{}
	}
	r.seen[m.Topic][m.Partition][m.Offset]++
	return nil
}

// count is the number of distinct offsets of topic handled.
func (r *topicRecorder) count(topic string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, offs := range r.seen[topic] {
		n += len(offs)
	}
	return n
}

// check returns the offsets of topic in [0, end[p]) never handled, the
// extra handlings of any offset of topic, and the handlings at or beyond
// end.
func (r *topicRecorder) check(topic string, end map[int]int64) (lost []string, dups int, beyond []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, e := range end {
		for o := int64(0); o < e; o++ {
			if r.seen[topic][p][o] == 0 {
				lost = append(lost, fmt.Sprintf("%s/%d@%d", topic, p, o))
			}
		}
	}
	for p, offs := range r.seen[topic] {
		for o, n := range offs {
			if n > 1 {
				dups += n - 1
			}
			if e, ok := end[p]; !ok || o >= e {
				beyond = append(beyond, fmt.Sprintf("%s/%d@%d", topic, p, o))
			}
		}
	}
	sort.Strings(lost)
	return lost, dups, beyond
}

// handledBelow is, per partition of topic, one past the highest offset
// below which every offset was handled.
func (r *topicRecorder) handledBelow(topic string, parts int) map[int]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int]int64{}
	for p := 0; p < parts; p++ {
		o := int64(0)
		for r.seen[topic][p][o] > 0 {
			o++
		}
		out[p] = o
	}
	return out
}

// Three topics of 2, 3 and 4 partitions in one consumer, more messages
// produced to each while it runs: every message of every topic handled
// exactly once, and Kafka's committed offsets at each topic's log end.
func TestSeveralTopics(t *testing.T) {
	cl := testsupport.Start(t)
	partsOf := map[string]int{}
	var topics []string
	for i, parts := range []int{2, 3, 4} {
		topic := testsupport.Name(t, fmt.Sprintf("t%d", i))
		cl.CreateTopic(t, topic, parts)
		cl.Produce(t, topic, parts, 0, 500)
		partsOf[topic] = parts
		topics = append(topics, topic)
	}
	group := testsupport.Name(t, "g")
	rec := newTopicRecorder()
	cfg := baseConfig(t, cl, group, topics[0], filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Topics = topics
	r := startConsumer(t, cfg)

	// The first 500 of each partition, then 300 more to each while it runs.
	waitFor(t, time.Minute, "the first 500 messages of every partition of every topic handled", func() bool {
		for _, topic := range topics {
			if rec.count(topic) != 500*partsOf[topic] {
				return false
			}
		}
		return true
	})
	for _, topic := range topics {
		cl.Produce(t, topic, partsOf[topic], 500, 300)
	}
	const perPart = 800
	atLogEnd := func() bool {
		ps := r.c.Stats().Partitions
		n := 0
		for _, p := range ps {
			if p.Committed == perPart && p.Durable == perPart {
				n++
			}
		}
		return n == 2+3+4 && len(ps) == 2+3+4
	}
	waitFor(t, time.Minute, "every partition of every topic handled and committed at its log end", atLogEnd)
	st := r.c.Stats()
	r.stop(t)

	perTopic := map[string]int{}
	for _, p := range st.Partitions {
		perTopic[p.Topic]++
	}
	for _, topic := range topics {
		end := offsets(partsOf[topic], perPart)
		lost, dups, beyond := rec.check(topic, end)
		if len(lost) > 0 || dups > 0 || len(beyond) > 0 {
			t.Errorf("%s: %d lost (%v), %d handled twice, %d beyond the log end (%v)", topic, len(lost), head(lost), dups, len(beyond), head(beyond))
		}
		if got := cl.Committed(t, group, topic, partsOf[topic]); !equalOffsets(got, end) {
			t.Errorf("%s: Kafka's committed offsets %v, want %v", topic, got, end)
		}
		if perTopic[topic] != partsOf[topic] {
			t.Errorf("%s: Stats lists %d partitions, want %d", topic, perTopic[topic], partsOf[topic])
		}
	}
	if len(rec.bad) > 0 {
		t.Errorf("wrong payloads: %v", head(rec.bad))
	}
	t.Logf("3 topics (2, 3, 4 partitions, %d messages each): every message handled once, committed at each log end", perPart)
}

// A subscribed topic deleted while it is being consumed. What the code
// does: fetches for the deleted topic fail with UNKNOWN_TOPIC_OR_PARTITION
// (the partition's LastError) and its leader lookups fail (logged); the
// member's partition watch (every 5s) sees the topic's partitions gone and
// rejoins; the new assignment leaves them out, so they are revoked
// (drained; their final commit fails, logged) and stay in Stats as
// revoked with the error. Run keeps going, the other topic is consumed as
// it grows, and a clean stop returns nil. The test asserts that: the
// deleted topic's partitions end revoked with the error in Stats and the
// log names the topic; nothing of it is handled twice, nothing after the
// deletion beyond what had been fetched; and no offset committed for it, in
// Kafka or in the offset file, passes what was handled.
func TestTopicDeletedWhileConsumed(t *testing.T) {
	const parts, doomedPerPart, keptPerPart = 2, 5000, 500
	cl := testsupport.Start(t)
	kept, doomed := testsupport.Name(t, "kept"), testsupport.Name(t, "doomed")
	cl.CreateTopic(t, kept, parts)
	cl.Produce(t, kept, parts, 0, keptPerPart)
	cl.CreateTopic(t, doomed, parts)
	cl.Produce(t, doomed, parts, 0, doomedPerPart)
	group := testsupport.Name(t, "g")
	// The doomed topic is handled slowly and fetched in small pieces, so
	// that it is deleted with most of it neither handled nor fetched.
	rec := newTopicRecorder()
	rec.before = func(ctx context.Context, m kafka.Message) error {
		if m.Topic == doomed {
			time.Sleep(time.Millisecond)
		}
		return nil
	}
	logger, logs := observedLogger(t)
	file := filepath.Join(t.TempDir(), "o.db")
	cfg := baseConfig(t, cl, group, kept, file, rec)
	cfg.Topics = []string{kept, doomed}
	cfg.Logger = logger
	cfg.FetchMaxBytes, cfg.MaxBufferedBytes = 8<<10, 32<<10
	r := startConsumer(t, cfg)

	waitFor(t, time.Minute, "some of the doomed topic handled", func() bool { return rec.count(doomed) >= 200 })
	cl.DeleteTopic(t, doomed)
	handledAtDelete := rec.count(doomed)
	t.Logf("deleted %s with %d of %d of its messages handled", doomed, handledAtDelete, parts*doomedPerPart)
	// The consumer goes on with the other topic.
	cl.Produce(t, kept, parts, keptPerPart, keptPerPart)

	// The deleted topic's partitions end revoked, with the reason in Stats.
	isGone := func(e string) bool { return strings.Contains(e, "Unknown Topic Or Partition") }
	waitFor(t, 30*time.Second, "the deleted topic's partitions revoked, the error in Stats", func() bool {
		n := 0
		for _, p := range r.c.Stats().Partitions {
			if p.Topic == doomed && p.State == framework.StateRevoked && isGone(p.LastError) {
				n++
			}
		}
		return n == parts
	})
	waitFor(t, time.Minute, "the kept topic handled and committed at its new end", func() bool {
		n := 0
		for _, p := range r.c.Stats().Partitions {
			if p.Topic == kept && p.Committed == 2*keptPerPart && p.State == framework.StateRunning {
				n++
			}
		}
		return n == parts
	})
	st := r.c.Stats()
	select {
	case err := <-r.done:
		t.Fatalf("Run returned %v after the topic was deleted; want it to keep going", err)
	default:
	}
	handledDoomed := rec.count(doomed)
	if handledDoomed >= parts*doomedPerPart {
		t.Errorf("all %d messages of the deleted topic were handled: it was not deleted while being consumed", handledDoomed)
	}
	var told []string
	for _, e := range logs.All() {
		if e.Level < zapcore.WarnLevel {
			continue
		}
		for _, f := range e.Context {
			if strings.Contains(f.String, doomed) || f.Interface != nil && strings.Contains(fmt.Sprint(f.Interface), doomed) {
				told = append(told, e.Message)
				break
			}
		}
	}
	if len(told) == 0 {
		t.Errorf("no warning or error in the log names the deleted topic %s", doomed)
	}
	t.Logf("%d warnings and errors name the deleted topic, e.g. %q", len(told), head(told))
	r.stop(t)

	// Nothing of the deleted topic handled twice; no commit past what was
	// handled, in Kafka (if it still answers for the topic) or the file.
	handled := rec.handledBelow(doomed, parts)
	if _, dups, _ := rec.check(doomed, map[int]int64{}); dups > 0 {
		t.Errorf("%s: %d messages handled twice", doomed, dups)
	}
	if c, err := cl.TryCommitted(group, doomed, parts); err == nil {
		for p, o := range c {
			if o > handled[p] {
				t.Errorf("Kafka's committed offset of %s/%d is %d, past what was handled (%d)", doomed, p, o, handled[p])
			}
		}
		t.Logf("Kafka's committed offsets of the deleted topic: %v (everything handled below %v)", c, handled)
	} else {
		t.Logf("Kafka's committed offsets of the deleted topic: %v", err)
	}
	_, recs := storeFailures(t, file, group, doomed, parts)
	for p, rcd := range recs {
		if rcd.Watermark > handled[p] || rcd.Committed > handled[p] {
			t.Errorf("the offset file's record of %s/%d: watermark %d, committed %d, past what was handled (%d)", doomed, p, rcd.Watermark, rcd.Committed, handled[p])
		}
	}
	lost, dups, beyond := rec.check(kept, offsets(parts, 2*keptPerPart))
	if len(lost) > 0 || dups > 0 || len(beyond) > 0 {
		t.Errorf("%s: %d lost (%v), %d handled twice, %d beyond its end", kept, len(lost), head(lost), dups, len(beyond))
	}
	if got := cl.Committed(t, group, kept, parts); !equalOffsets(got, offsets(parts, 2*keptPerPart)) {
		t.Errorf("%s: committed %v, want %d everywhere", kept, got, 2*keptPerPart)
	}
	t.Logf("%d of %d messages of the deleted topic handled (%d when it was deleted); stats:\n%s", handledDoomed, parts*doomedPerPart, handledAtDelete, statsString(st))
}
