// The end-to-end suite: every scenario runs against the in-process kfake
// broker, and against a real Kafka when KAFKA_BROKERS is set (make
// test-kafka), with faults injected by a Kafka-aware proxy in both cases.
package tidemark_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
)

func TestMain(m *testing.M) {
	if childMain() {
		return
	}
	goleak.VerifyTestMain(m)
}

// Scenario 1: one commit in twenty is delayed 150 ms, past the 100 ms
// deadline a kafka-go user gives ReadMessage. tidemark loses nothing (and,
// without restarts, handles nothing twice); kafka-go's ReadMessage pattern,
// in the same run and under the same fault, loses messages.
func TestCommitDelaysLoseNothing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		perPart  int
		contrast bool
	}{
		{"1024", 256, true},
		{"100000", 25000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.perPart > 1000 && testing.Short() {
				t.Skip("100,000 messages: skipped in -short mode")
			}
			const parts = 4
			cl, topic := newTopic(t, parts, tc.perPart)
			end := offsets(parts, int64(tc.perPart))

			rule, err := cl.Proxy.Delay(kmsg.OffsetCommit, 150*time.Millisecond, kafkaproxy.Every(20))
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder()
			rec.before = func(ctx context.Context, m kafka.Message) error {
				// The user's own deadline, as with ReadMessage: tidemark's
				// commit is not part of it.
				ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				// Some work, so that the run spans many commit intervals.
				if tc.perPart <= 1000 {
					time.Sleep(2 * time.Millisecond)
				} else {
					time.Sleep(20 * time.Microsecond)
				}
				return ctx.Err()
			}
			group := testsupport.Name(t, "g")
			cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "offsets.db"), rec)
			cfg.CommitInterval = 10 * time.Millisecond // many commits, so that many are delayed
			if tc.perPart > 1000 {
				cfg.CommitInterval = time.Millisecond // the run is short: commit very often
			}
			r := startConsumer(t, cfg)
			stopWatch := watchInvariant(t, r, cl, group, topic, parts)
			waitFor(t, 3*time.Minute, "every message handled", func() bool { return rec.count() == parts*tc.perPart })
			samples := stopWatch()
			r.stop(t)

			lost, dups := rec.check(parts, offsets(parts, 0), end)
			if len(lost) > 0 || dups > 0 {
				t.Fatalf("tidemark lost %d messages (%v) and handled %d twice", len(lost), head(lost), dups)
			}
			if bad := rec.badValues(); len(bad) > 0 {
				t.Fatalf("wrong payloads: %v", head(bad))
			}
			if got := cl.Committed(t, group, topic, parts); !equalOffsets(got, end) {
				t.Fatalf("committed %v after shutdown, want %v", got, end)
			}
			delayed := rule.Applied()
			if delayed == 0 {
				t.Fatal("the fault never fired: no commit was delayed")
			}
			t.Logf("tidemark: %d messages, 0 lost, 0 handled twice; %d of %d commits delayed 150ms; committed <= durable <= processed in %d samples",
				parts*tc.perPart, delayed, cl.Proxy.Counts(kmsg.OffsetCommit).Seen, samples)

			if !tc.contrast {
				return
			}
			// The same fault against kafka-go's ReadMessage with a 100 ms
			// deadline, on a fresh group over the same messages.
			rm := readMessagePattern(t, cl, topic, parts, tc.perPart)
			t.Logf("kafka-go ReadMessage with a 100ms deadline: %d of %d messages received; %d reported failed by ReadMessage; "+
				"%d lost (failed, never delivered again, Kafka's commit past them: %v); %d never received but not committed past (a stuck Reader, not loss); committed %v",
				rm.received, parts*tc.perPart, len(rm.failed), len(rm.lost), head(rm.lost), rm.stuck, rm.committed)
			if rm.unexplained > 0 {
				t.Errorf("kafka-go: %d messages below Kafka's committed offset were neither received nor reported failed", rm.unexplained)
			}
			if len(rm.lost) == 0 {
				t.Fatalf("kafka-go's ReadMessage pattern lost nothing under the same fault: the contrast does not hold")
			}
		})
	}
}

// readMessageResult is what the ReadMessage pattern did with a topic.
type readMessageResult struct {
	received int // distinct messages ReadMessage returned
	// failed: the messages ReadMessage fetched but reported failed (its
	// commit did not answer within the deadline); the application drops
	// them.
	failed []string
	// lost: failed messages never delivered again although Kafka's
	// committed offset passed them: the failed commit landed after all.
	lost []string
	// stuck counts messages never received and not below Kafka's
	// committed offset: the Reader still owes them (it is stuck, or
	// slow); not loss.
	stuck int
	// unexplained counts messages below the committed offset that were
	// neither received nor reported failed.
	unexplained int
	committed   map[int]int64
}

// readMessagePattern consumes topic with kafka-go's group Reader the way
// its README shows, ReadMessage with a short deadline, dropping a message
// whose call returned an error. ReadMessage is FetchMessage then
// CommitMessages (kafka-go's reader.go); they are called here in that order
// with the same deadline, so that the message whose commit failed is known.
// A message is lost when its call failed, the Reader never delivered it
// again, and Kafka's committed offset passed it; a message the Reader
// simply has not delivered yet is not.
func readMessagePattern(t *testing.T, cl *testsupport.Cluster, topic string, parts, perPart int) readMessageResult {
	group := testsupport.Name(t, "rm")
	rd := kafka.NewReader(kafka.ReaderConfig{
		Brokers:           cl.Brokers,
		GroupID:           group,
		Topic:             topic,
		MaxWait:           200 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout:    sessionTimeout,
		ReadLagInterval:   -1,
	})
	defer rd.Close()
	type po struct {
		p int
		o int64
	}
	seen := map[po]bool{}
	failed := map[po]bool{}
	var committed map[int]int64
	end := offsets(parts, int64(perPart))
	deadline := time.Now().Add(2 * time.Minute)
	progressAt := time.Now()
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		m, err := rd.FetchMessage(ctx)
		if err == nil {
			if err = rd.CommitMessages(ctx, m); err != nil {
				failed[po{m.Partition, m.Offset}] = true // ReadMessage returns the error: the message is dropped
			} else {
				seen[po{m.Partition, m.Offset}] = true
			}
			progressAt = time.Now()
		}
		cancel()
		if err == nil {
			continue
		}
		// Done when Kafka has everything committed and nothing arrives; or
		// when nothing has arrived for 10s: the Reader is stuck.
		if idle := time.Since(progressAt); idle > 2*time.Second {
			c, cerr := cl.TryCommitted(group, topic, parts)
			if cerr == nil {
				committed = c
			}
			if cerr == nil && equalOffsets(c, end) || idle > 10*time.Second {
				break
			}
		}
	}
	if c, err := cl.TryCommitted(group, topic, parts); err == nil {
		committed = c
	}
	res := readMessageResult{received: len(seen), committed: committed}
	for p := 0; p < parts; p++ {
		for o := int64(0); o < int64(perPart); o++ {
			k := po{p, o}
			at := fmt.Sprintf("%d@%d", p, o)
			if failed[k] {
				res.failed = append(res.failed, at)
			}
			switch {
			case seen[k]:
			case o >= committed[p]:
				res.stuck++
			case failed[k]:
				res.lost = append(res.lost, at)
			default:
				res.unexplained++
			}
		}
	}
	return res
}

func equalOffsets(a, b map[int]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func head(s []string) []string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

// Scenario 5: a graceful shutdown drains, commits exactly the local
// watermark, returns nil and leaves no goroutine behind.
func TestGracefulShutdown(t *testing.T) {
	const parts, perPart = 3, 300
	cl, topic := newTopic(t, parts, perPart)

	rec := newRecorder()
	group := testsupport.Name(t, "g")
	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "offsets.db"), rec)
	cfg.CommitInterval = time.Hour // only the shutdown commits
	before := goleak.IgnoreCurrent()
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "every message handled", func() bool { return rec.count() == parts*perPart })
	checkInvariant(t, r.c.Stats())
	r.stop(t)
	if err := goleak.Find(before); err != nil {
		t.Fatalf("goroutines left after Run returned: %v", err)
	}

	st := r.c.Stats()
	committed := cl.Committed(t, group, topic, parts)
	for _, p := range st.Partitions {
		if p.Durable != int64(perPart) || committed[p.Partition] != p.Durable || p.Committed != p.Durable {
			t.Errorf("%s/%d: durable %d, Kafka committed %d (stats %d), want all %d", p.Topic, p.Partition,
				p.Durable, committed[p.Partition], p.Committed, perPart)
		}
		if p.State != framework.StateRevoked {
			t.Errorf("%s/%d state %s after Run, want %s", p.Topic, p.Partition, p.State, framework.StateRevoked)
		}
	}
	checkInvariant(t, st)
	if err := r.c.Run(context.Background()); !errors.Is(err, framework.ErrConsumerUsed) {
		t.Fatalf("second Run = %v, want ErrConsumerUsed", err)
	}
}
