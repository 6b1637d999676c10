package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// consumed runs a consumer over a new topic of parts partitions of n
// messages each until Kafka confirmed the commit of n everywhere, and
// stops it.
func consumed(t *testing.T, parts, n int) (cl *testsupport.Cluster, topic, group, file string) {
	t.Helper()
	cl, topic = testsupport.NewTopic(t, parts, n)
	group = testsupport.Name(t, "g")
	file = filepath.Join(t.TempDir(), "offsets.db")
	rec := &testsupport.Recorder{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, rec))
	testsupport.WaitFor(t, time.Minute, "everything handled and committed", func() bool {
		return rec.Count() == parts*n && testsupport.EqualOffsets(cl.Committed(t, group, topic, parts), testsupport.Offsets(parts, int64(n)))
	})
	r.Stop(t)
	return cl, topic, group, file
}

// deleteOffset deletes the group's committed offset of one partition, as
// kafka-consumer-groups --delete-offsets does (or expiry would).
func deleteOffset(t *testing.T, cl *testsupport.Cluster, group, topic string, partition int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cl.Client().OffsetDelete(ctx, &kafka.OffsetDeleteRequest{GroupID: group, Topics: map[string][]int{topic: {partition}}})
	if err == nil {
		err = res.Error
		for _, p := range res.Topics[topic] {
			if p.Error != nil {
				err = p.Error
			}
		}
	}
	if err != nil {
		t.Fatalf("deleting the committed offset of %s/%d: %v", topic, partition, err)
	}
	if c := cl.Committed(t, group, topic, partition+1)[partition]; c >= 0 {
		t.Fatalf("Kafka still holds %d for %s/%d after the delete", c, topic, partition)
	}
}

// Kafka's committed offset reset below what the file saw it confirm
// (partition 0), or deleted (partition 1): diff predicts the reset and how
// many messages the next start handles again, and the next start does
// that. Before diff ran reconciliation's decision it said "commit
// pending" and "no findings" here.
func TestDiffPredictsReset(t *testing.T) {
	const n = 200
	cl, topic, group, file := consumed(t, 3, n)
	cl.CommitOffsets(t, group, topic, map[int]int64{0: 0})
	deleteOffset(t, cl, group, topic, 1)

	r := tidemark(t, "diff", file, "--brokers", cl.Upstream).want(t, 1,
		"partition 0: FINDING reset at next start: Kafka's committed offset 0 is below the 200 it confirmed before (local 200)",
		"the consumer resumes at 0 and handles offsets 0 to 199 again: 200 messages",
		"partition 1: FINDING reset at next start: Kafka has no committed offset, but confirmed 200 before (local 200)",
		"2 findings")
	if got := r.stdout; strings.Contains(got, "commit pending") {
		t.Errorf("diff still says commit pending:\n%s", got)
	}
	var doc diffJSON
	must(t, json.Unmarshal([]byte(tidemark(t, "diff", file, "--brokers", cl.Upstream, "--json").want(t, 1).stdout), &doc))
	for _, p := range doc.Partitions {
		want := [3]any{"reset", int64(0), int64(n)}
		if p.Partition == 2 {
			want = [3]any{"resume", int64(n), int64(0)}
		}
		if got := [3]any{p.Next, p.NextStart, p.HandledAgain}; got != want {
			t.Errorf("partition %d: next, next_start, handled_again = %v, want %v", p.Partition, got, want)
		}
		if p.LogStable != p.LogEnd || p.Confirmed != n {
			t.Errorf("partition %d: log_stable %d (log end %d, no transaction), confirmed %d (want %d)", p.Partition, p.LogStable, p.LogEnd, p.Confirmed, n)
		}
	}
	tidemark(t, "diff", file, "--brokers", cl.Upstream, "--out-of-range", "stall").want(t, 1,
		"partition 0: FINDING stall at next start", "partition 1: FINDING stall at next start", "2 findings")
	tidemark(t, "diff", file, "--brokers", cl.Upstream, "--out-of-range", "sideways").want(t, 2, "--out-of-range must be")

	// The next start does what diff said.
	rec := &testsupport.Recorder{}
	run := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, rec))
	testsupport.WaitFor(t, time.Minute, "the predicted messages handled again", func() bool { return rec.Count() == 2*n })
	time.Sleep(200 * time.Millisecond)
	run.Stop(t)
	testsupport.ExactlyOnce(t, rec, map[int]int64{0: 0, 1: 0, 2: n}, testsupport.Offsets(3, n))
}

// With OutOfRange Stall, an operator's rewind stalls the partition, and
// tidemark set decides: partition 0 is set to the operator's offset (40:
// handle again from there), partition 1 back to the file's 100 (ignore the
// rewind). The restarted consumer resumes where set put each one. Before,
// set kept the confirmed offset, and both stalled again.
func TestSetUndoesRewind(t *testing.T) {
	const n = 100
	cl, topic, group, file := consumed(t, 2, n)
	cl.CommitOffsets(t, group, topic, map[int]int64{0: 40, 1: 40})

	start := func() (*frameworktest.Running, *testsupport.Recorder) {
		rec := &testsupport.Recorder{}
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.OutOfRange = framework.Stall
		return frameworktest.Start(t, cfg), rec
	}
	stalled := func(r *frameworktest.Running) int {
		k := 0
		for _, p := range r.C.Stats().Partitions {
			if p.State == framework.StateStalled {
				k++
			}
		}
		return k
	}
	r, rec := start()
	testsupport.WaitFor(t, 20*time.Second, "both partitions stalled", func() bool { return stalled(r) == 2 })
	r.Stop(t)
	if k := rec.Count(); k != 0 {
		t.Fatalf("stalled partitions handled %d messages", k)
	}
	tidemark(t, "diff", file, "--brokers", cl.Upstream, "--out-of-range", "stall").want(t, 1, "stall at next start", "2 findings")

	tidemark(t, "set", file, "--group", group, "--topic", topic, "--partition", "0", "--offset", "40").want(t, 0, "written to")
	tidemark(t, "set", file, "--group", group, "--topic", topic, "--partition", "1", "--offset", "100").want(t, 0, "written to")
	tidemark(t, "diff", file, "--brokers", cl.Upstream, "--out-of-range", "stall").want(t, 0, "no findings")

	cl.Produce(t, topic, 2, n, 10)
	r, rec = start()
	testsupport.WaitFor(t, 20*time.Second, "resumed where set put them", func() bool { return rec.Count() == 70+10 })
	time.Sleep(200 * time.Millisecond)
	if k := stalled(r); k != 0 {
		t.Errorf("%d partitions stalled after set", k)
	}
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, map[int]int64{0: 40, 1: n}, testsupport.Offsets(2, n+10))
	if c := cl.Committed(t, group, topic, 2); !testsupport.EqualOffsets(c, testsupport.Offsets(2, n+10)) {
		t.Errorf("Kafka committed %v at the end, want %d everywhere", c, n+10)
	}
}

// A reset drops the file's completed ranges: diff counts the offsets they
// hold among those handled again.
func TestJudgeCompletedAgain(t *testing.T) {
	r := diffRow{Local: 100, Confirmed: 100, Kafka: -1, LogStart: 0, LogEnd: 300, LogStable: 300, NextStart: -1,
		completed: []offsetfile.Range{{From: 150, To: 160}, {From: 250, To: 400}}}
	judge(&r, policy{})
	if r.Next != "reset" || r.NextStart != 0 || r.HandledAgain != 100 || r.CompletedAgain != 60 || len(r.Findings) != 1 {
		t.Fatalf("judge: %+v", r)
	}
	if want := "handles offsets 0 to 99 again: 100 messages (unless the topic was recreated: then they are new); the 60 offsets completed above the watermark are handled again too"; !strings.Contains(r.Findings[0], want) {
		t.Errorf("finding %q does not say %q", r.Findings[0], want)
	}
	// Resuming at the watermark restores them: none handled again.
	r = diffRow{Local: 100, Confirmed: 100, Kafka: 100, LogStart: 0, LogEnd: 300, LogStable: 300, NextStart: -1,
		completed: []offsetfile.Range{{From: 150, To: 160}}}
	judge(&r, policy{})
	if r.Next != "resume" || r.NextStart != 100 || r.CompletedAgain != 0 || len(r.Findings) != 0 {
		t.Fatalf("judge: %+v", r)
	}
}
