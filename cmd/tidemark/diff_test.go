package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// diff against the in-process broker (or KAFKA_BROKERS): every finding
// and note, from a file whose partitions are each in one situation.
func TestDiff(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := cl.FixedName(t, "orders"), cl.FixedName(t, "billing")
	cl.CreateTopic(t, topic, 4)
	cl.Produce(t, topic, 4, 0, 10)
	cl.DeleteRecords(t, topic, 3, 6)
	cl.CommitOffsets(t, group, topic, map[int]int64{0: 10, 1: 5, 2: 4, 3: 2})
	gone := topic + "-gone"

	path := filepath.Join(t.TempDir(), "offsets.db")
	st, err := offsetfile.Open(path, nil)
	must(t, err)
	put := func(tp string, p int32, wm, committed int64) {
		must(t, st.Put(offsetfile.Key{Group: group, Topic: tp, Partition: p}, offsetfile.Record{
			Watermark: wm, RecordedAt: t0, Generation: 1, Member: "m", Committed: committed, CommittedAt: t0}))
	}
	put(topic, 0, 10, 10) // in sync
	put(topic, 1, 8, 5)   // commit pending
	put(topic, 2, 25, 4)  // beyond the log end: recreated
	put(topic, 3, 3, 2)   // below the log start, and so is Kafka's committed offset
	put(topic, 7, 1, -1)  // no such partition
	put(gone, 0, 5, 5)    // no such topic
	must(t, st.Close())

	fixedNow(t, t0.Add(time.Minute))
	r := tidemark(t, "diff", path, "--brokers", cl.Upstream).want(t, 1,
		"local beyond log end: watermark 25 > log end 10",
		"local below log start: retention deleted offsets 3 to 5 before they were handled",
		"committed below log start: Kafka's committed offset 2 < log start 6",
		"the topic has no partition 7",
		"5 findings")
	if !testsupport.RealBroker() {
		golden(t, "diff", mask(r.stdout+r.stderr, false, path, "FILE", cl.Upstream, "BROKER"))
	}

	var doc diffJSON
	r = tidemark(t, "diff", path, "--brokers", cl.Upstream, "--json", "--topic", topic).want(t, 1)
	must(t, json.Unmarshal([]byte(r.stdout), &doc))
	want := map[int32][5]int64{ // local, kafka, start, end, lag
		0: {10, 10, 0, 10, 0},
		1: {8, 5, 0, 10, 2},
		2: {25, 4, 0, 10, 0},
		3: {3, 2, 6, 10, 7},
		7: {1, -1, -1, -1, -1},
	}
	if len(doc.Partitions) != len(want) || doc.Findings != 4 {
		t.Fatalf("diff --json: %d partitions, %d findings: %+v", len(doc.Partitions), doc.Findings, doc)
	}
	for _, p := range doc.Partitions {
		got := [5]int64{p.Local, p.Kafka, p.LogStart, p.LogEnd, p.Lag}
		if got != want[p.Partition] {
			t.Errorf("partition %d: local, kafka, start, end, lag = %v, want %v", p.Partition, got, want[p.Partition])
		}
	}
	if p := doc.Partitions[1]; p.LocalAhead != 3 || p.Status != "commit pending" {
		t.Errorf("partition 1: %+v", p)
	}

	// Cross-check the log bounds with kcat, where Debian's is installed.
	if kcat, err := exec.LookPath("kcat"); err == nil {
		for _, p := range doc.Partitions {
			if p.LogEnd < 0 {
				continue
			}
			for ts, wantOff := range map[string]int64{"-2": p.LogStart, "-1": p.LogEnd} {
				tp := topic + ":" + strconv.Itoa(int(p.Partition)) + ":" + ts
				out, err := exec.Command(kcat, "-Q", "-b", cl.Upstream, "-t", tp).CombinedOutput()
				if err != nil {
					t.Fatalf("kcat -Q -t %s: %v\n%s", tp, err, out)
				}
				m := regexp.MustCompile(`\[\d+\] offset (-?\d+)`).FindSubmatch(out)
				if m == nil {
					t.Fatalf("kcat -Q -t %s: %s", tp, out)
				}
				if got, _ := strconv.ParseInt(string(m[1]), 10, 64); got != wantOff {
					t.Errorf("kcat -Q -t %s: offset %d, diff says %d", tp, got, wantOff)
				}
			}
		}
	} else {
		t.Log("kcat not installed: no cross-check")
	}

	// A commit pending for longer than --max-pending is a finding.
	fixedNow(t, t0.Add(time.Hour))
	tidemark(t, "diff", path, "--brokers", cl.Upstream, "--topic", topic, "--max-pending", "10m").want(t, 1,
		"commit pending too long: watermark recorded 2026-03-01 12:00:00.000Z, more than 10m0s ago, and not committed", "5 findings")
	tidemark(t, "diff", path, "--brokers", cl.Upstream, "--group", group, "--topic", topic+"-nope").want(t, 2, "no partition of group")
}

func TestDiffUnreachable(t *testing.T) {
	path := fixture(t)
	r := tidemark(t, "diff", path, "--brokers", "127.0.0.1:1", "--timeout", "1s").want(t, 2, "asking Kafka at 127.0.0.1:1")
	checkFast(t, r, 4*time.Second)
}

// While commits fail, the watermark keeps moving: --max-pending measures
// from the last confirmed commit instead.
func TestDiffFailingCommits(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := cl.FixedName(t, "orders"), cl.FixedName(t, "billing")
	cl.CreateTopic(t, topic, 1)
	cl.Produce(t, topic, 1, 0, 10)
	cl.CommitOffsets(t, group, topic, map[int]int64{0: 4})
	path := filepath.Join(t.TempDir(), "offsets.db")
	st, err := offsetfile.Open(path, nil)
	must(t, err)
	must(t, st.Put(offsetfile.Key{Group: group, Topic: topic, Partition: 0}, offsetfile.Record{
		Watermark: 9, RecordedAt: t0.Add(59 * time.Minute), Generation: 1, Member: "m", Committed: 4, CommittedAt: t0,
		LastCommit: &offsetfile.CommitAttempt{Offset: 9, Generation: 1, At: t0.Add(59 * time.Minute), Outcome: offsetfile.CommitError, Error: "coordinator not available"}}))
	must(t, st.Close())
	fixedNow(t, t0.Add(time.Hour))
	tidemark(t, "diff", path, "--brokers", cl.Upstream, "--max-pending", "30m").want(t, 1,
		"commit pending too long: commits are failing, last confirmed commit 2026-03-01 12:00:00.000Z, more than 30m0s ago")
	tidemark(t, "diff", path, "--brokers", cl.Upstream, "--max-pending", "2h").want(t, 0, "commit pending", "no findings")
	tidemark(t, "diff", path, "--brokers", cl.Upstream).want(t, 0, "+5")
}
