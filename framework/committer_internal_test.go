package framework

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tidemark/tidemark/internal/testsupport"
)

// A commit of many partitions goes in requests Kafka's coordinator can
// write as one batch each (Kafka 4.4.0 refused a commit of 10,000
// partitions whole: "larger than the maximum batch size of 1048588 bytes").
func TestCommitChunks(t *testing.T) {
	var todo []*partition
	meta := map[topicPartition]string{}
	for i := range 10_000 {
		p := &partition{tp: topicPartition{fmt.Sprintf("orders-%d", i%3), int32(i)}}
		if i%100 == 0 {
			meta[p.tp] = strings.Repeat("r", 1000) // completed ranges carried
		}
		todo = append(todo, p)
	}
	group := strings.Repeat("g", 200)
	chunks := commitChunks(group, todo, meta, maxCommitBytes)
	seen := 0
	for i, c := range chunks {
		size := 0
		for _, p := range c {
			if p != todo[seen] {
				t.Fatalf("chunk %d: partitions out of order or missing at %d", i, seen)
			}
			seen++
			size += commitBytes(group, p.tp.topic, meta[p.tp])
		}
		if len(c) == 0 || (size > maxCommitBytes && len(c) > 1) {
			t.Fatalf("chunk %d: %d partitions, %d bytes (limit %d)", i, len(c), size, maxCommitBytes)
		}
	}
	if seen != len(todo) || len(chunks) < 2 {
		t.Fatalf("%d chunks holding %d of %d partitions", len(chunks), seen, len(todo))
	}
	if c := commitChunks("g", todo[:5], nil, maxCommitBytes); len(c) != 1 || len(c[0]) != 5 {
		t.Fatalf("5 partitions: %d chunks", len(c))
	}
	// One partition larger than the limit still goes, alone.
	big := map[topicPartition]string{todo[1].tp: strings.Repeat("x", maxCommitBytes)}
	if c := commitChunks("g", todo[:3], big, maxCommitBytes); len(c) != 3 {
		t.Fatalf("a partition over the limit: %d chunks, want 3 (it alone)", len(c))
	}
	t.Logf("10,000 partitions, group of 200 bytes: %d requests", len(chunks))
}

// Kafka's committed offset never moves back because the offset file's
// checkpoint is behind the position reconciliation resumed from: a
// partition taken back after another member went further (chaos seed 83:
// 2141 committed back to 1774, the old synced watermark, 3 ms after the
// join). It moves back only where reconciliation reset the position.
func TestCommitNeverBelowTheReconciledStart(t *testing.T) {
	for _, tc := range []struct {
		name         string
		local, kafka int64   // -1: none
		want         []int64 // what the committer sends, before the checkpoint and after
	}{
		{"Kafka ahead of the file", 20, 50, nil},
		{"Kafka past the log's end, reset to its start", -1, 500, []int64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := testsupport.Start(t)
			topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
			cl.CreateTopic(t, topic, 1)
			cl.Produce(t, topic, 1, 0, 100)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var sent []int64
			c, stop, err := handDriven(Config{Brokers: cl.Brokers, GroupID: group, Topics: []string{topic},
				FlushInterval: 500 * time.Millisecond, Logger: zaptest.NewLogger(t),
				OnCommit: func(ev CommitEvent) {
					for _, o := range ev.Offsets {
						sent = append(sent, o.Offset)
					}
				}}, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := stop(); err != nil {
					t.Error(err)
				}
			}()
			key := storeKey(group, topicPartition{topic, 0})
			if tc.local >= 0 {
				// This consumer's last run: handled and checkpointed.
				if err := c.store.SetWatermark(key, tc.local, 1, "m"); err != nil {
					t.Fatal(err)
				}
				if err := c.store.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			cl.Commit(t, group, topic, 0, tc.kafka) // another member's
			p := handPartition(c, topic, tc.kafka, -1)
			bounds := c.assignment.positions.bounds(ctx, []topicPartition{p.tp}, c.assignment.watch)
			starts, _, back := c.assignment.reconcile(ctx, []*partition{p}, bounds)
			c.assignment.persist(ctx, []*partition{p}, starts, back)
			// The group (of no member here) refuses the generation: what
			// matters is what the committer sends.
			c.identity.setGen(1)
			// A committer round that checkpointed before the reconciled
			// position was queued: it sends what is synced.
			_ = c.committer.commit([]*partition{p}, "interval")
			c.committer.sync(ctx)
			_ = c.committer.commit([]*partition{p}, "interval")
			if !slices.Equal(sent, tc.want) {
				t.Fatalf("reconcile started at %v; the committer sent %v, want %v", starts, sent, tc.want)
			}
		})
	}
}
