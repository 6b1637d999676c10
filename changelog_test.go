package tidemark_test

// State that follows its partition (Config.StateChangelog): the changes
// written to a compacted changelog topic, Kafka's commit never past them,
// and a new owner restoring the state from there.

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// counter counts each message under its key in the partition's state.
var counter = handler.TxHandlerFunc(func(_ context.Context, st handler.State, msgs []kafka.Message) error {
	for _, m := range msgs {
		v, err := st.Get(m.Key)
		if err != nil {
			return err
		}
		if err := st.Put(m.Key, binary.BigEndian.AppendUint64(nil, frameworktest.StateCount(v)+1)); err != nil {
			return err
		}
	}
	return nil
})

// changelogConfig is a counting consumer of topic with the changelog
// suffix "-state", on its own offset file in dir.
func changelogConfig(t *testing.T, cl *testsupport.Cluster, group, topic, file string) framework.Config {
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, nil)
	cfg.TxHandler, cfg.StateChangelog = counter, "-state"
	return cfg
}

// wantCounts checks, through ViewState, that c holds for each partition of
// parts exactly want's counts.
func wantCounts(t *testing.T, c *framework.Consumer, topic string, parts []int, want map[int]map[string]uint64) {
	t.Helper()
	for _, p := range parts {
		got := map[string]uint64{}
		if err := c.ViewState(topic, p, func(st handler.State) error {
			return st.ForEach(func(k, v []byte) error {
				got[string(k)] = frameworktest.StateCount(v)
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		wrong := 0
		for k, n := range want[p] {
			if got[k] != n {
				if wrong++; wrong <= 5 {
					t.Errorf("partition %d key %s: counted %d, want %d", p, k, got[k], n)
				}
			}
		}
		if len(got) != len(want[p]) {
			t.Errorf("partition %d: %d keys, want %d", p, len(got), len(want[p]))
		}
		if wrong > 0 {
			t.Fatalf("partition %d: %d keys counted wrong", p, wrong)
		}
	}
}

// readChangelog returns the records of topic's partition p.
func readChangelog(t *testing.T, cl *testsupport.Cluster, topic string, p int32) []*kgo.Record {
	t.Helper()
	kc := testsupport.NewProducer(t, cl.Brokers, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().AtStart()}}))
	_, end := cl.Bounds(t, topic, int(p)+1)
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for int64(len(out)) < end[int(p)] && ctx.Err() == nil {
		kc.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// One consumer writes every change to the changelog (created at Run,
// compacted, with the topic's partition count), a marker first, and
// commits the log end once the changelog holds everything; a second
// consumer on a file of its own, after the first stopped, restores each
// partition's state from the changelog and goes on with exact counts.
func TestChangelogHandOff(t *testing.T) {
	const parts, perPart, keys = 3, 400, 50
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "k%02d", (p*perPart+seq)%keys) }
	cl.ProduceKeyed(t, topic, parts, 0, perPart, key)
	want := func(n int) map[int]map[string]uint64 {
		out := map[int]map[string]uint64{}
		for p := range parts {
			out[p] = map[string]uint64{}
			for seq := range n {
				out[p][string(key(p, seq))]++
			}
		}
		return out
	}
	all := []int{0, 1, 2}

	dir := t.TempDir()
	r1 := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "a.db")))
	testsupport.WaitFor(t, 30*time.Second, "the first consumer committing the log end", func() bool {
		return frameworktest.CommittedAt(perPart, r1) == parts
	})
	r1.Stop(t)
	for p := range parts {
		recs := readChangelog(t, cl, topic+"-state", int32(p))
		if len(recs) == 0 || len(recs[0].Key) != 0 || len(recs[0].Headers) == 0 || recs[0].Headers[0].Key != framework.HeaderChangelogMarker {
			t.Fatalf("partition %d: the changelog does not start with a marker: %d records", p, len(recs))
		}
		seen := map[string]bool{}
		for _, r := range recs[1:] {
			seen[string(r.Key)] = true
		}
		if len(seen) != len(want(perPart)[p]) {
			t.Fatalf("partition %d: the changelog holds %d keys, want %d", p, len(seen), len(want(perPart)[p]))
		}
	}

	cl.ProduceKeyed(t, topic, parts, perPart, perPart, key)
	r2 := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "b.db")))
	testsupport.WaitFor(t, 30*time.Second, "the second consumer committing the new log end", func() bool {
		return frameworktest.CommittedAt(2*perPart, r2) == parts
	})
	var restored uint64
	for _, p := range r2.C.Stats().Partitions {
		restored += p.RestoreTotal
	}
	if restored == 0 {
		t.Fatal("the second consumer restored nothing from the changelog")
	}
	wantCounts(t, r2.C, topic, all, want(2*perPart))
	r2.Stop(t)
	t.Logf("hand-off: %d changelog records restored", restored)
}

// A changelog topic with another partition count, or not compacted, ends
// Run with an error naming it; nothing is consumed.
func TestChangelogTopicRefused(t *testing.T) {
	cl := testsupport.Start(t)
	for _, tc := range []struct {
		name    string
		parts   int
		configs map[string]string
		want    []string
	}{
		{"partitions", 2, map[string]string{"cleanup.policy": "compact"}, []string{"has 2 partitions", "has 3"}},
		{"delete", 3, map[string]string{"cleanup.policy": "delete"}, []string{`cleanup.policy "delete"`, "compact"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
			cl.CreateTopic(t, topic, 3)
			cl.CreateTopicWith(t, topic+"-state", tc.parts, tc.configs)
			cl.Produce(t, topic, 3, 0, 10)
			r := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db")))
			returned, err := r.Wait(20 * time.Second)
			if !returned || err == nil {
				t.Fatalf("Run returned %v, %v; want an error", returned, err)
			}
			for _, w := range append(tc.want, topic+"-state") {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("Run's error %q does not say %q", err, w)
				}
			}
			if h := r.Handled(); h != 0 {
				t.Fatalf("%d messages handled", h)
			}
		})
	}
}
