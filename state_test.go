package tidemark_test

// A TxHandler's state in the offset file: each message's effect exactly
// once across SIGKILLs, and a partition whose state would miss messages
// stalls instead of going on.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// One consumer counts each message under its key (1,000 keys) in its
// partition's state, over 200,000 messages, SIGKILLed 10 times at random
// moments: at the end every key's count is its number of messages, exactly.
func TestTxHandlerSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("ten restarts: skipped in -short mode")
	}
	const parts, perPart, keys, kills = 4, 50000, 1000, 10
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "key-%03d", (p*perPart+seq)%keys) }
	cl.ProduceKeyed(t, topic, parts, 0, perPart, key)
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	// A static member: each restart takes its place at once, without a
	// rebalance.
	child := frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: file, Ledger: ledgerPath, State: true,
		InstanceID: "counter"}

	for k := range kills {
		c := frameworktest.StartChild(t, child)
		l := testsupport.ReadLedger(t, ledgerPath)
		// Killed after a random share of what is left, so that every kill
		// falls inside the topic.
		left := parts*perPart - l.Distinct()
		more := 1 + rng.IntN(max(1, left/(kills-k+1)))
		testsupport.WaitFor(t, 2*time.Minute, fmt.Sprintf("run %d handling %d more", k+1, more), func() bool {
			now := testsupport.ReadLedger(t, ledgerPath)
			return now.Len() >= l.Len()+more || now.Distinct() == parts*perPart
		})
		c.Kill(t)
		t.Logf("%s: kill %d after %d more messages (%d distinct so far)", time.Now().Format("15:04:05.000"), k+1, more,
			testsupport.ReadLedger(t, ledgerPath).Distinct())
	}
	c := frameworktest.StartChild(t, child)
	testsupport.WaitFor(t, 3*time.Minute, "everything handled after the last restart", func() bool {
		return testsupport.ReadLedger(t, ledgerPath).Distinct() == parts*perPart
	})
	if err := c.Stop(t); err != nil {
		t.Fatalf("graceful stop of the last run: %v", err)
	}
	ledger := testsupport.ReadLedger(t, ledgerPath)

	s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wrong := 0
	for p := range parts {
		want := map[string]uint64{}
		for seq := range perPart {
			want[string(key(p, seq))]++
		}
		got := map[string]uint64{}
		k := offsetfile.Key{Group: group, Topic: topic, Partition: int32(p)}
		if err := s.ViewState(k, func(st *offsetfile.StateTx) error {
			return st.ForEach(func(key, value []byte) error {
				got[string(key)] = frameworktest.StateCount(value)
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		for key, n := range want {
			if got[key] != n {
				if wrong++; wrong <= 5 {
					t.Errorf("partition %d key %s: counted %d, want %d", p, key, got[key], n)
				}
			}
		}
		if len(got) != len(want) {
			t.Errorf("partition %d: %d keys in the state, want %d", p, len(got), len(want))
		}
	}
	if wrong > 0 {
		t.Fatalf("%d keys counted wrong", wrong)
	}
	t.Logf("%d messages, %d keys per partition, %d SIGKILLs: every count exact; %d messages handled again after a kill (their runs dropped with it)",
		parts*perPart, keys, kills, ledger.Len()-parts*perPart)
	if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, perPart)) {
		t.Fatalf("committed %v after the graceful stop, want %d everywhere", c, perPart)
	}
}

// A partition whose Kafka position is ahead of its state (another member
// handled the messages between) stalls with an error saying so; a
// partition consumed for the first time starts with an empty state. The
// state is readable while the consumer runs (ViewState).
func TestTxHandlerStallsWhenStateIsBehind(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 100)
	cl.Commit(t, group, topic, 1, 50)
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), nil)
	cfg.Handler = nil
	cfg.TxHandler = handler.TxHandlerFunc(func(_ context.Context, st handler.State, msgs []kafka.Message) error {
		v, err := st.Get([]byte("n"))
		if err != nil {
			return err
		}
		return st.Put([]byte("n"), binary.BigEndian.AppendUint64(nil, frameworktest.StateCount(v)+uint64(len(msgs))))
	})
	r := frameworktest.Start(t, cfg)
	var stalled framework.PartitionStats
	// ViewState reads the file: partition 0 is waited for until its
	// watermark is synced, not only handled (its last run may still be
	// queued for the writer).
	testsupport.WaitFor(t, 30*time.Second, "partition 0 handled and synced, partition 1 stalled", func() bool {
		ok0, ok1 := false, false
		for _, p := range r.C.Stats().Partitions {
			switch {
			case p.Partition == 0:
				ok0 = p.Processed == 100 && p.Synced == 100
			case p.Partition == 1 && p.State == framework.StateStalled:
				ok1, stalled = true, p
			}
		}
		return ok0 && ok1
	})
	if !strings.Contains(stalled.LastError, "state is as of offset -1") || !strings.Contains(stalled.LastError, "docs/state.md") {
		t.Fatalf("the stalled partition's error: %q", stalled.LastError)
	}
	// Partition 0's state, read while the consumer runs: its 100
	// messages counted once each.
	err := r.C.ViewState(topic, 0, func(st handler.State) error {
		v, err := st.Get([]byte("n"))
		if err != nil {
			return err
		}
		if n := frameworktest.StateCount(v); n != 100 {
			return fmt.Errorf("count %d, want 100", n)
		}
		if st.Put([]byte("x"), nil) == nil {
			return fmt.Errorf("ViewState's state accepted a Put")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ViewState: %v", err)
	}
}

// With StateRebuild, a partition whose state is behind Kafka's committed
// offset (a new offset file: the service moved host) is not stalled: its
// state is rebuilt from the log's first offset. The counts are exact, and
// Kafka's committed offset never moves back below where the rebuild began.
func TestTxHandlerRebuildsStateFromLogStart(t *testing.T) {
	const parts, perPart, keys = 2, 300, 20
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "k%02d", seq%keys) }
	cl.ProduceKeyed(t, topic, parts, 0, perPart, key)
	dir := t.TempDir()
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(dir, "a.db"), nil)
	cfg.Handler, cfg.TxHandler = nil, counter
	a := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the first file's consumer committing the log end", func() bool {
		return frameworktest.CommittedAt(perPart, a) == parts
	})
	a.Stop(t)

	// The same group on an empty file: Kafka holds perPart, the file
	// nothing. More messages arrive meanwhile.
	cl.ProduceKeyed(t, topic, parts, perPart, perPart, key)
	var (
		mu        sync.Mutex
		belowFrom []framework.CommitOffset
	)
	cfg = frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(dir, "b.db"), nil)
	// Slow runs, so that the committer's rounds (every 100 ms) see the
	// rebuild's watermarks below Kafka's committed offset.
	cfg.Handler, cfg.StateRebuild, cfg.BatchSize = nil, true, 20
	cfg.TxHandler = handler.TxHandlerFunc(func(ctx context.Context, st handler.State, msgs []kafka.Message) error {
		time.Sleep(10 * time.Millisecond)
		return counter(ctx, st, msgs)
	})
	cfg.OnCommit = func(e framework.CommitEvent) {
		mu.Lock()
		defer mu.Unlock()
		for _, o := range e.Offsets {
			if o.Offset < perPart {
				belowFrom = append(belowFrom, o)
			}
		}
	}
	b := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the rebuilt partitions committing the new log end", func() bool {
		return frameworktest.CommittedAt(2*perPart, b) == parts
	})
	want := map[int]map[string]uint64{}
	for p := range parts {
		want[p] = map[string]uint64{}
		for seq := range 2 * perPart {
			want[p][string(key(p, seq))]++
		}
	}
	wantCounts(t, b.C, topic, []int{0, 1}, want)
	for _, p := range b.C.Stats().Partitions {
		if p.StateRebuilds != 1 {
			t.Errorf("partition %d: %d rebuilds, want 1", p.Partition, p.StateRebuilds)
		}
	}
	b.Stop(t)
	mu.Lock()
	defer mu.Unlock()
	if len(belowFrom) > 0 {
		t.Fatalf("Kafka's committed offset moved back below %d during the rebuild: %v", perPart, belowFrom)
	}
}
