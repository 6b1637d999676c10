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
	"github.com/twmb/franz-go/pkg/kmsg"

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

// Three member processes share a topic's partitions, with a changelog:
// rebalances as they come and go, a SIGKILL in the middle of handling,
// a graceful stop, a restart of the killed one on its stale file. At the
// end a fourth consumer, on an empty file of its own, restores every
// partition from the changelog: each key's count is its number of
// messages, exactly, and Kafka's committed offsets are the log end.
func TestChangelogThreeMembersSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("member processes: skipped in -short mode")
	}
	const parts, perPhase, keys = 6, 1500, 60
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "key-%02d", (p*7+seq)%keys) }
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger")
	member := func(name string) frameworktest.Child {
		return frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: filepath.Join(dir, name+".db"),
			Ledger: ledger, State: true, Changelog: "-state", Work: time.Millisecond}
	}
	handled := func() int { return testsupport.ReadLedger(t, ledger).Len() }
	waitHandled := func(what string, n int) {
		testsupport.WaitFor(t, 2*time.Minute, what, func() bool { return handled() >= n })
	}

	a := frameworktest.StartChild(t, member("a"))
	b := frameworktest.StartChild(t, member("b"))
	cl.ProduceKeyed(t, topic, parts, 0, perPhase, key)
	waitHandled("a and b handling the first phase", parts*perPhase/2)
	c := frameworktest.StartChild(t, member("c")) // a rebalance under load
	cl.ProduceKeyed(t, topic, parts, perPhase, perPhase, key)
	waitHandled("three members handling the second phase", parts*perPhase+parts*perPhase/3)
	a.Kill(t) // SIGKILL mid-handling: its uncommitted runs, and changes not yet acknowledged, go to the next owners
	t.Logf("a killed after %d handled", handled())
	cl.ProduceKeyed(t, topic, parts, 2*perPhase, perPhase, key)
	waitHandled("b and c handling the third phase", 2*parts*perPhase+parts*perPhase/2)
	if err := b.Stop(t); err != nil { // a graceful hand-off
		t.Fatalf("b's graceful stop: %v", err)
	}
	a = frameworktest.StartChild(t, member("a")) // back on its stale file: restores
	cl.ProduceKeyed(t, topic, parts, 3*perPhase, perPhase, key)
	end := 4 * perPhase
	testsupport.WaitFor(t, 2*time.Minute, "a and c committing the log end", func() bool {
		got, err := cl.TryCommitted(group, topic, parts)
		return err == nil && testsupport.EqualOffsets(got, testsupport.Offsets(parts, int64(end)))
	})
	for name, m := range map[string]*testsupport.Child{"a": a, "c": c} {
		if err := m.Stop(t); err != nil {
			t.Fatalf("%s's graceful stop: %v", name, err)
		}
	}
	l := testsupport.ReadLedger(t, ledger)
	if l.Distinct() != parts*end {
		t.Fatalf("%d distinct messages handled, want %d", l.Distinct(), parts*end)
	}

	want := map[int]map[string]uint64{}
	all := make([]int, parts)
	for p := range parts {
		all[p] = p
		want[p] = map[string]uint64{}
		for seq := range end {
			want[p][string(key(p, seq))]++
		}
	}
	d := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "d.db")))
	testsupport.WaitFor(t, time.Minute, "a fresh consumer restoring every partition", everyPartition(d, parts, func(p framework.PartitionStats) bool {
		return p.State == framework.StateRunning && p.Synced == int64(end) && p.RestoreTotal > 0
	}))
	wantCounts(t, d.C, topic, all, want)
	d.Stop(t)
	t.Logf("%d messages, %d handled in all (%d again after the kill and the moves): every count exact after a restore from the changelog",
		parts*end, l.Len(), l.Len()-parts*end)
}

// While the changelog's writes fail, the partitions go on handling and
// their offsets are durable in the file, but Kafka's committed offset
// stays at what the changelog acknowledged; once writes succeed again
// the commits reach the log end, and a restore elsewhere counts exactly.
func TestChangelogWriteFailureHoldsCommit(t *testing.T) {
	const parts, perPart, keys = 2, 200, 20
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "k%02d", (p+seq)%keys) }
	cl.ProduceKeyed(t, topic, parts, 0, perPart, key)
	dir := t.TempDir()
	r := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "a.db")))
	testsupport.WaitFor(t, 30*time.Second, "the first half committed", func() bool {
		return frameworktest.CommittedAt(perPart, r) == parts
	})
	rule, err := cl.Proxy.Fail(kmsg.Produce, 6) // NOT_LEADER_OR_FOLLOWER, to every changelog write
	if err != nil {
		t.Fatal(err)
	}
	cl.ProduceKeyed(t, topic, parts, perPart, perPart, key)
	testsupport.WaitFor(t, 30*time.Second, "the second half handled and synced", func() bool {
		n := 0
		for _, p := range r.C.Stats().Partitions {
			if p.Synced == 2*perPart {
				n++
			}
		}
		return n == parts
	})
	// Several commit intervals (100 ms) with the writes failing: the
	// commits stay where the changelog is.
	for range 10 {
		if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, perPart)) {
			t.Fatalf("committed %v while the changelog writes fail, want %d everywhere", c, perPart)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rule.Applied() == 0 {
		t.Fatal("no changelog write was refused")
	}
	rule.Remove()
	testsupport.WaitFor(t, 30*time.Second, "the log end committed once the writes succeed", func() bool {
		return frameworktest.CommittedAt(2*perPart, r) == parts
	})
	r.Stop(t)
	r2 := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "b.db")))
	testsupport.WaitFor(t, 30*time.Second, "a second consumer restoring", everyPartition(r2, parts, func(p framework.PartitionStats) bool {
		return p.State == framework.StateRunning && p.Synced == 2*perPart
	}))
	want := map[int]map[string]uint64{}
	for p := range parts {
		want[p] = map[string]uint64{}
		for seq := range 2 * perPart {
			want[p][string(key(p, seq))]++
		}
	}
	wantCounts(t, r2.C, topic, []int{0, 1}, want)
	r2.Stop(t)
	t.Logf("%d changelog writes refused; the commit waited for them", rule.Applied())
}

// A consumed topic created after Run started gets its changelog when its
// partitions are first assigned: created compacted, with its partition
// count, and its commits reach the end.
func TestChangelogTopicCreatedLater(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	r := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db")))
	testsupport.WaitFor(t, 20*time.Second, "the consumer a member, the topic missing", func() bool {
		return len(r.C.Stats().MissingTopics) == 1
	})
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 50)
	testsupport.WaitFor(t, 30*time.Second, "the new topic's commits at its end", func() bool {
		return frameworktest.CommittedAt(50, r) == 2
	})
	if n := cl.WaitLeaders(t, topic+"-state", 2); n == 0 {
		t.Fatal("no changelog topic")
	}
	r.Stop(t)
}

// A crash between the changelog's writes and Kafka's commit, then a
// move, then a second move: member a (a process) writes changes to the
// changelog while every commit fails, and is SIGKILLed; b restores the
// state as of Kafka's committed offset (ignoring a's changes above it),
// handles those messages again and hands over gracefully; c restores what
// b left. Both hold exact counts.
func TestChangelogCrashBeforeCommitTwoMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("a member process: skipped in -short mode")
	}
	const parts, half, keys = 2, 150, 15
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "k%02d", (p+seq)%keys) }
	cl.ProduceKeyed(t, topic, parts, 0, half, key)
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger")
	a := frameworktest.StartChild(t, frameworktest.Child{Brokers: cl.Brokers, Group: group, Topic: topic, File: filepath.Join(dir, "a.db"),
		Ledger: ledger, State: true, Changelog: "-state"})
	testsupport.WaitFor(t, 30*time.Second, "a committing the first half", func() bool {
		c, err := cl.TryCommitted(group, topic, parts)
		return err == nil && testsupport.EqualOffsets(c, testsupport.Offsets(parts, half))
	})
	_, logged := cl.Bounds(t, topic+"-state", parts)
	rule, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15) // COORDINATOR_NOT_AVAILABLE: every commit fails
	if err != nil {
		t.Fatal(err)
	}
	cl.ProduceKeyed(t, topic, parts, half, half, key)
	testsupport.WaitFor(t, 30*time.Second, "a handling the second half and writing its changes", func() bool {
		_, end := cl.Bounds(t, topic+"-state", parts)
		return testsupport.ReadLedger(t, ledger).Distinct() == 2*parts*half && end[0] > logged[0] && end[1] > logged[1] && rule.Applied() > 0
	})
	a.Kill(t)
	if rule.Applied() == 0 {
		t.Fatal("no commit was refused")
	}
	rule.Remove()
	if c := cl.Committed(t, group, topic, parts); !testsupport.EqualOffsets(c, testsupport.Offsets(parts, half)) {
		t.Fatalf("committed %v after the kill, want %d", c, half)
	}

	want := map[int]map[string]uint64{}
	for p := range parts {
		want[p] = map[string]uint64{}
		for seq := range 2 * half {
			want[p][string(key(p, seq))]++
		}
	}
	running := func(r *frameworktest.Running) func() bool {
		return everyPartition(r, parts, func(p framework.PartitionStats) bool {
			return p.State == framework.StateRunning && p.Synced == 2*half && p.Committed == 2*half
		})
	}
	for _, name := range []string{"b", "c"} {
		r := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, name+".db")))
		testsupport.WaitFor(t, time.Minute, name+" restoring and committing the end", running(r))
		wantCounts(t, r.C, topic, []int{0, 1}, want)
		r.Stop(t)
	}
}

// Partitions that leave a consumer and come back to it (a second member
// joins, then leaves) keep one changelog writer's sequence numbers going:
// each start's marker lands at the changelog's end (three markers on a
// partition that moved twice), and a fresh restore counts exactly.
func TestChangelogPartitionsComeBack(t *testing.T) {
	const parts, n, keys = 4, 100, 10
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	key := func(p, seq int) []byte { return fmt.Appendf(nil, "k%02d", (p+seq)%keys) }
	dir := t.TempDir()
	a := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "a.db")))
	cl.ProduceKeyed(t, topic, parts, 0, n, key)
	testsupport.WaitFor(t, 30*time.Second, "a committing the first round", func() bool { return frameworktest.CommittedAt(n, a) == parts })
	b := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "b.db")))
	cl.ProduceKeyed(t, topic, parts, n, n, key)
	testsupport.WaitFor(t, 30*time.Second, "a and b committing the second round", func() bool {
		return frameworktest.CommittedAt(2*n, a, b) == parts && len(b.C.Stats().Partitions) > 0
	})
	b.Stop(t)
	cl.ProduceKeyed(t, topic, parts, 2*n, n, key)
	testsupport.WaitFor(t, 30*time.Second, "a committing the third round alone", func() bool { return frameworktest.CommittedAt(3*n, a) == parts })
	a.Stop(t)
	moved := 0
	for p := range parts {
		markers := 0
		for _, r := range readChangelog(t, cl, topic+"-state", int32(p)) {
			if len(r.Key) == 0 {
				markers++
			}
		}
		if markers >= 3 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no partition went to b and back with a marker each time")
	}
	want := map[int]map[string]uint64{}
	for p := range parts {
		want[p] = map[string]uint64{}
		for seq := range 3 * n {
			want[p][string(key(p, seq))]++
		}
	}
	d := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "d.db")))
	testsupport.WaitFor(t, 30*time.Second, "a fresh consumer restoring", everyPartition(d, parts, func(p framework.PartitionStats) bool {
		return p.State == framework.StateRunning && p.Synced == 3*n
	}))
	wantCounts(t, d.C, topic, []int{0, 1, 2, 3}, want)
	d.Stop(t)
	t.Logf("%d partitions went to b and back", moved)
}

// everyPartition is a WaitFor condition: r's Stats list parts partitions
// for which ok holds.
func everyPartition(r *frameworktest.Running, parts int, ok func(framework.PartitionStats) bool) func() bool {
	return func() bool {
		n := 0
		for _, p := range r.C.Stats().Partitions {
			if ok(p) {
				n++
			}
		}
		return n == parts
	}
}

// A changelog holds one group's changes: a second group given the same
// suffix finds the first group's markers in it and stalls each partition
// with ErrChangelogOtherGroup, rather than restore or tombstone the other
// group's state; nothing is handled, nothing committed.
func TestChangelogOtherGroupRefused(t *testing.T) {
	const parts, perPart = 2, 50
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	cl.CreateTopic(t, topic, parts)
	cl.ProduceKeyed(t, topic, parts, 0, perPart, func(p, seq int) []byte { return fmt.Appendf(nil, "k%d", seq%5) })
	dir := t.TempDir()

	a := frameworktest.Start(t, changelogConfig(t, cl, testsupport.Name(t, "a"), topic, filepath.Join(dir, "a.db")))
	testsupport.WaitFor(t, 30*time.Second, "group a committing the log end", func() bool {
		return frameworktest.CommittedAt(perPart, a) == parts
	})
	a.Stop(t)

	groupB := testsupport.Name(t, "b")
	b := frameworktest.Start(t, changelogConfig(t, cl, groupB, topic, filepath.Join(dir, "b.db")))
	testsupport.WaitFor(t, 30*time.Second, "group b's partitions refusing group a's changelog", everyPartition(b, parts, func(p framework.PartitionStats) bool {
		return strings.Contains(p.LastError, framework.ErrChangelogOtherGroup.Error()) && strings.Contains(p.LastError, "StateChangelog")
	}))
	st := b.C.Stats()
	for _, p := range st.Partitions {
		if p.Handled != 0 {
			t.Errorf("group b handled %d messages of partition %d on a changelog it refused", p.Handled, p.Partition)
		}
	}
	b.Stop(t)
	if off := cl.Committed(t, groupB, topic, parts); off[0] >= 0 || off[1] >= 0 {
		t.Errorf("group b committed %v on a changelog it refused", off)
	}
	t.Logf("group b's partition error: %s", st.Partitions[0].LastError)
}

// A restore replaces the file's state and empties its outbox once the
// restore is durable. Until then the file's outbox still holds the changes
// of the file's earlier ownership, never acknowledged: the changelog writer
// must not send them as the new owner's, with its epoch, where a later
// restore would count them over everything in between (TestChaosState,
// seed 83, lost 21 counts of one key that way).
func TestChangelogRestoreDropsTheOldOutbox(t *testing.T) {
	const first, keys = 100, 10
	o := refusedOutbox(t, first, 50, keys)
	cl, topic, group, dir, fileA, key := o.cl, o.topic, o.group, o.dir, o.fileA, o.key
	// A's 50 last changes stay in its outbox. B resumes at 100 and goes
	// on to 200.
	cl.ProduceKeyed(t, topic, 1, first+50, 50, key)
	b := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "b.db")))
	testsupport.WaitFor(t, 30*time.Second, "B committed 200", func() bool { return frameworktest.CommittedAt(200, b) == 1 })
	b.Stop(t)
	// A again: its file at 150, Kafka at 200, and B resumed below 150: a
	// full restore, which stays queued (not durable) while the flush
	// waits. Then A changes keys 0-4 only.
	cfg := changelogConfig(t, cl, group, topic, fileA)
	cfg.FlushInterval = time.Second
	a := frameworktest.Start(t, cfg)
	cl.ProduceKeyed(t, topic, 1, 200, 5, key)
	testsupport.WaitFor(t, 30*time.Second, "A committed 205", func() bool { return frameworktest.CommittedAt(205, a) == 1 })
	a.Stop(t)
	// A new consumer restores from the changelog: every key counted once
	// per message.
	c := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "c.db")))
	testsupport.WaitFor(t, 30*time.Second, "C restored", everyPartition(c, 1, func(p framework.PartitionStats) bool {
		return p.State == framework.StateRunning && p.Synced == 205
	}))
	want := map[int]map[string]uint64{0: {}}
	for seq := range 205 {
		want[0][string(key(0, seq))]++
	}
	wantCounts(t, c.C, topic, []int{0}, want)
	c.Stop(t)
}

// The other side of TestChangelogRestoreDropsTheOldOutbox: a file nobody
// moved past is trusted at its restart, and the changes its outbox kept
// (the changelog refused them) are its own: they are sent, under its new
// epoch, and a restore elsewhere counts them. Held back like a restore's,
// they would hold Kafka's commit below the file's watermark for good.
func TestChangelogTrustedFileSendsItsOutbox(t *testing.T) {
	const first, held, keys = 100, 50, 10
	o := refusedOutbox(t, first, held, keys)
	cl, topic, group, dir, fileA, key := o.cl, o.topic, o.group, o.dir, o.fileA, o.key
	if c := cl.Committed(t, group, topic, 1); c[0] != first {
		t.Fatalf("committed %d with the changelog refusing A's last changes, want %d", c[0], first)
	}
	// A again, nobody in between: its file is trusted, nothing restored.
	// It changes keys 0-4 only: the last changes of keys 5-9 are those
	// its outbox kept.
	a := frameworktest.Start(t, changelogConfig(t, cl, group, topic, fileA))
	cl.ProduceKeyed(t, topic, 1, first+held, keys/2, key)
	const end = first + held + keys/2
	testsupport.WaitFor(t, 30*time.Second, "A committed the log end", func() bool { return frameworktest.CommittedAt(end, a) == 1 })
	if p := a.C.Stats().Partitions[0]; p.RestoreTotal != 0 {
		t.Errorf("A read %d changelog records at its restart, want none (its file is trusted)", p.RestoreTotal)
	}
	want := map[int]map[string]uint64{0: {}}
	for seq := range end {
		want[0][string(key(0, seq))]++
	}
	wantCounts(t, a.C, topic, []int{0}, want)
	a.Stop(t)
	// A new consumer restores from the changelog: the changes once
	// refused are in it, once.
	c := frameworktest.Start(t, changelogConfig(t, cl, group, topic, filepath.Join(dir, "c.db")))
	testsupport.WaitFor(t, 30*time.Second, "C restored", everyPartition(c, 1, func(p framework.PartitionStats) bool {
		return p.State == framework.StateRunning && p.Synced == end
	}))
	if p := c.C.Stats().Partitions[0]; p.RestoreTotal == 0 {
		t.Error("C read no changelog record: its file is new, it must restore")
	}
	wantCounts(t, c.C, topic, []int{0}, want)
	c.Stop(t)
}

// outbox is what refusedOutbox leaves: a one-partition topic whose key of
// message seq is seq%keys, and consumer A's offset file, fileA, in dir.
type outbox struct {
	cl                       *testsupport.Cluster
	topic, group, dir, fileA string
	key                      func(_, seq int) []byte
}

// refusedOutbox runs consumer A over first messages, committed, then over
// held more while the changelog refuses every write: A stops with them in
// its outbox, its file at first+held and Kafka's commit at first. The
// changelog takes writes again after.
func refusedOutbox(t *testing.T, first, held, keys int) outbox {
	t.Helper()
	o := outbox{cl: testsupport.Start(t), topic: testsupport.Name(t, "t"), group: testsupport.Name(t, "g"), dir: t.TempDir()}
	o.fileA = filepath.Join(o.dir, "a.db")
	o.key = func(_, seq int) []byte { return fmt.Appendf(nil, "k%02d", seq%keys) }
	o.cl.CreateTopic(t, o.topic, 1)
	o.cl.ProduceKeyed(t, o.topic, 1, 0, first, o.key)
	a := frameworktest.Start(t, changelogConfig(t, o.cl, o.group, o.topic, o.fileA))
	testsupport.WaitFor(t, 30*time.Second, "A committed the first messages", func() bool { return frameworktest.CommittedAt(int64(first), a) == 1 })
	rule, err := o.cl.Proxy.Fail(kmsg.Produce, 6) // NOT_LEADER_OR_FOLLOWER, to every changelog write
	if err != nil {
		t.Fatal(err)
	}
	o.cl.ProduceKeyed(t, o.topic, 1, first, held, o.key)
	testsupport.WaitFor(t, 30*time.Second, "A handled them", everyPartition(a, 1, func(p framework.PartitionStats) bool { return p.Synced == int64(first+held) }))
	a.Stop(t)
	if rule.Applied() == 0 {
		t.Fatal("no changelog write was refused")
	}
	rule.Remove()
	return o
}
