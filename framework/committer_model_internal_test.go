package framework

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"pgregory.net/rapid"

	"github.com/tidemark/tidemark/internal/testsupport"
)

// The committer against random histories of one partition: this consumer
// handles, flushes, checkpoints and commits; it loses the partition
// without a commit and gets it back, while another member may go further
// in between. The committer's requests (seen through OnCommit; the group
// refuses them, having no members, so Kafka's offset is the other
// member's) must never send an offset below Kafka's committed one (chaos
// seed 83 sent the file's old checkpoint, 1774, after resuming at Kafka's
// 2141), and after a checkpoint a commit round must send the checkpointed
// watermark when Kafka does not hold it (a floor that blocks progress
// fails here). No reset is drawn: every position stays inside the log.
func TestCommitterModel(t *testing.T) {
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, 1)
	const logEnd = 2000
	cl.Produce(t, topic, 1, 0, logEnd)
	ctx := context.Background()
	rapid.Check(t, func(rt *rapid.T) {
		group := testsupport.Name(t, "g")
		var sent []int64
		c, stop, err := handDriven(Config{Brokers: cl.Brokers, GroupID: group, Topics: []string{topic},
			FlushInterval: time.Millisecond, Logger: zap.NewNop(),
			OnCommit: func(ev CommitEvent) {
				for _, o := range ev.Offsets {
					sent = append(sent, o.Offset)
				}
			}}, t.TempDir())
		if err != nil {
			rt.Fatal(err)
		}
		defer func() {
			if err := stop(); err != nil {
				rt.Error(err)
			}
		}()
		tp := topicPartition{topic, 0}
		key := storeKey(group, tp)
		var (
			p     *partition // owned, or nil
			pos   int64      // the next offset this owner handles
			kafka = int64(-1)
			gen   = int32(0)
		)
		commit := func(rt *rapid.T) {
			sent = sent[:0]
			c.committer.mu.Lock()
			c.committer.fencedGen = -1 // refused: the next round sends again
			c.committer.mu.Unlock()
			_ = c.committer.commit([]*partition{p}, "interval")
			for _, o := range sent {
				if o < kafka {
					rt.Fatalf("the committer sent %d, below Kafka's committed offset %d (resumed at %d)", o, kafka, p.start)
				}
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"assign": func(rt *rapid.T) {
				if p != nil {
					rt.Skip("owned")
				}
				gen++
				c.identity.setGen(gen)
				p = handPartition(c, topic, kafka, gen)
				bounds := c.assignment.positions.bounds(ctx, []topicPartition{tp}, c.assignment.watch)
				starts, _, back := c.assignment.reconcile(ctx, []*partition{p}, bounds)
				start, ok := starts[0]
				if !ok {
					rt.Fatalf("stalled at Kafka %d", kafka)
				}
				c.assignment.persist(ctx, []*partition{p}, starts, back)
				p.start, pos = start, start
			},
			"handle": func(rt *rapid.T) {
				if p == nil {
					rt.Skip("not owned")
				}
				n := rapid.Int64Range(1, 50).Draw(rt, "n")
				pos = min(pos+n, logEnd)
				if err := c.store.SetWatermark(key, pos, gen, "m"); err != nil {
					rt.Fatal(err)
				}
			},
			"flush": func(rt *rapid.T) {
				if err := c.store.Flush(ctx); err != nil {
					rt.Fatal(err)
				}
			},
			"commit": func(rt *rapid.T) {
				if p == nil {
					rt.Skip("not owned")
				}
				commit(rt)
			},
			"checkpoint and commit": func(rt *rapid.T) {
				if p == nil {
					rt.Skip("not owned")
				}
				if err := c.store.Sync(ctx); err != nil {
					rt.Fatal(err)
				}
				wm, _, _ := c.store.SyncedProgress(key)
				commit(rt)
				if wm > kafka && (len(sent) == 0 || sent[len(sent)-1] != wm) {
					rt.Fatalf("after a checkpoint at %d (Kafka at %d, resumed at %d) the committer sent %v", wm, kafka, p.start, sent)
				}
			},
			"lose": func(rt *rapid.T) {
				if p == nil {
					rt.Skip("not owned")
				}
				p = nil // no final commit
			},
			"another member goes further": func(rt *rapid.T) {
				if p != nil {
					rt.Skip("owned")
				}
				kafka = min(max(kafka, 0)+rapid.Int64Range(0, 100).Draw(rt, "n"), logEnd)
				cl.Commit(t, group, topic, 0, kafka)
			},
		})
	})
}
