package tidemark_test

// Online migration between the group protocols on Kafka 4.x (kfake
// converts no group with members): a group of tidemark classic members
// that a consumer-protocol member joins is upgraded by the broker to a
// consumer group, its classic members carrying on through the classic
// protocol, and downgraded to a classic group when the last
// consumer-protocol member leaves. Run with Kafka and its tools:
// scripts/kafka-local run -- go test -run TestOnlineMigration .

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// groupType is the group's type as the broker lists it (ListGroups v5):
// "classic" or "consumer"; "" if it does not list the group.
func groupType(t *testing.T, kc *kgo.Client, group string) string {
	t.Helper()
	req := kmsg.NewPtrListGroupsRequest()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := req.RequestWith(ctx, kc)
	if err != nil {
		t.Logf("listing the groups: %v", err)
		return ""
	}
	if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
		t.Logf("listing the groups: %v", err)
		return ""
	}
	for _, g := range res.Groups {
		if g.Group == group {
			return g.GroupType
		}
	}
	return ""
}

// adminClient is a franz-go client of the real broker, for the group's
// type.
func adminClient(t *testing.T, cl *testsupport.Cluster) *kgo.Client {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc
}

// javaConsumer is Kafka's own VerifiableConsumer in the group, with the
// consumer group protocol: each record it reports (record_data) is
// recorded in the tally as handled by "java".
type javaConsumer struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when its output is read to the end and it exited
	mu   sync.Mutex
	// assigned is what it owns, by its partitions_assigned and
	// partitions_revoked events; events counts them by name.
	assigned map[int]bool
	events   map[string]int
	stderr   strings.Builder
}

func startJava(t *testing.T, brokers, topic, group string, ta *tally) *javaConsumer {
	t.Helper()
	j := &javaConsumer{done: make(chan struct{}), assigned: map[int]bool{}, events: map[string]int{}}
	j.cmd = exec.Command(os.Getenv("TIDEMARK_KAFKA_LOCAL"), "tool", "org.apache.kafka.tools.VerifiableConsumer",
		"--bootstrap-server", brokers, "--topic", topic, "--group-id", group, "--group-protocol", "consumer", "--verbose")
	out, err := j.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	j.cmd.Stderr = &lockedWriter{mu: &j.mu, w: &j.stderr}
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("starting Kafka's VerifiableConsumer: %v", err)
	}
	go func() {
		defer close(j.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			j.event(sc.Bytes(), ta)
		}
		_ = j.cmd.Wait()
	}()
	t.Cleanup(func() { j.stop(t) })
	return j
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (j *javaConsumer) event(line []byte, ta *tally) {
	var e struct {
		Name       string `json:"name"`
		Value      string `json:"value"`
		Partition  int    `json:"partition"`
		Offset     int64  `json:"offset"`
		Partitions []struct {
			Partition int `json:"partition"`
		} `json:"partitions"`
	}
	if json.Unmarshal(line, &e) != nil {
		return // a log line
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events[e.Name]++
	switch e.Name {
	case "record_data":
		ta.record("java", e.Partition, e.Offset, []byte(e.Value))
	case "partitions_assigned":
		for _, p := range e.Partitions {
			j.assigned[p.Partition] = true
		}
	case "partitions_revoked":
		for _, p := range e.Partitions {
			delete(j.assigned, p.Partition)
		}
	}
}

// owns is how many partitions it owns now.
func (j *javaConsumer) owns() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.assigned)
}

// stop ends it with SIGTERM (it closes its consumer, leaving the group),
// waiting up to 30 s before a SIGKILL. Stopping twice is harmless.
func (j *javaConsumer) stop(t *testing.T) {
	t.Helper()
	select {
	case <-j.done:
		return
	default:
	}
	_ = j.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-j.done:
	case <-time.After(30 * time.Second):
		_ = j.cmd.Process.Kill()
		<-j.done
		t.Errorf("Kafka's VerifiableConsumer did not stop within 30 s of SIGTERM")
	}
}

// tidemarkTwice lists the offsets handled again after a tidemark member
// handled them: what a graceful hand-off from tidemark must never cause.
// An offset the Java consumer handled first may be handled again: it does
// not commit on close, nor while a rebalance is pending.
func (ta *tally) tidemarkTwice() (bad []string, afterJava int) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	for p, hs := range ta.parts {
		first := map[int64]string{}
		for _, h := range hs {
			f, again := first[h.offset]
			switch {
			case !again:
				first[h.offset] = h.member
			case f == "java":
				afterJava++
			default:
				bad = append(bad, fmt.Sprintf("%d@%d by %s, then by %s", p, h.offset, f, h.member))
			}
		}
	}
	sort.Strings(bad)
	return bad, afterJava
}

// migrationGroup is the start both migration tests share: a topic under
// load and two tidemark classic members a and b settled in their group.
func migrationGroup(t *testing.T, parts int) (cl *testsupport.Cluster, topic, group string, ta *tally, ld *load, members map[string]*frameworktest.Running, kc *kgo.Client) {
	t.Helper()
	cl = testsupport.Start(t)
	if !cl.Real || os.Getenv("TIDEMARK_KAFKA_LOCAL") == "" {
		t.Skip("online migration needs Kafka 4.x and its tools (kfake converts no group with members): scripts/kafka-local run -- go test -run " + t.Name() + " .")
	}
	topic, group = testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	ta = newTally()
	ld = startLoad(t, cl, topic, parts, 2, 50*time.Millisecond)
	kc = adminClient(t, cl)
	dir := t.TempDir()
	members = map[string]*frameworktest.Running{}
	for _, name := range []string{"a", "b"} {
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(dir, name+".db"), ta.handler(name))
		cfg.ClientID = name
		members[name] = frameworktest.Start(t, cfg)
	}
	testsupport.WaitFor(t, time.Minute, "a and b sharing the partitions", func() bool {
		return len(runningOn(members["a"])) > 0 && len(runningOn(members["b"])) > 0 &&
			len(runningOn(members["a"]))+len(runningOn(members["b"])) == parts
	})
	ta.settle(t, parts, "a and b", "a", "b")
	if typ := groupType(t, kc, group); typ != "classic" {
		t.Fatalf("the group of two classic members is a %q group", typ)
	}
	return cl, topic, group, ta, ld, members, kc
}

// Kafka's Java consumer with the consumer protocol joins a group of two
// tidemark classic members: the broker upgrades the group to a consumer
// group, the Java consumer gets partitions, a and b keep theirs flowing
// (heartbeating and rejoining with the classic protocol); when it leaves,
// the group downgrades to classic and a and b own every partition again.
// Nothing lost; tidemark's hand-offs never cause a second handling (the
// Java consumer's may: it commits neither on close nor during a rebalance).
func TestOnlineMigrationWithJavaConsumer(t *testing.T) {
	const parts = 6
	cl, topic, group, ta, ld, members, kc := migrationGroup(t, parts)
	java := startJava(t, strings.Join(strings.Split(os.Getenv(testsupport.EnvBrokers), ","), ","), topic, group, ta)
	testsupport.WaitFor(t, 90*time.Second, "the group upgraded to a consumer group", func() bool { return groupType(t, kc, group) == "consumer" })
	testsupport.WaitFor(t, 90*time.Second, "the Java consumer owning partitions", func() bool { return java.owns() > 0 })
	ta.settle(t, parts, "java joined", "java", "a", "b")
	testsupport.WaitFor(t, time.Minute, "the Java consumer handling 200 messages", func() bool { return ta.by("java") >= 200 })
	upgraded := fmt.Sprintf("a %v, b %v, java %d partitions", runningOn(members["a"]), runningOn(members["b"]), java.owns())

	java.stop(t)
	testsupport.WaitFor(t, 90*time.Second, "the group downgraded to a classic group", func() bool { return groupType(t, kc, group) == "classic" })
	testsupport.WaitFor(t, 90*time.Second, "a and b owning every partition", func() bool {
		return len(runningOn(members["a"]))+len(runningOn(members["b"])) == parts
	})
	ta.settle(t, parts, "java left", "a", "b")

	end := ld.stopAndWait(t, ta, parts)
	testsupport.WaitFor(t, time.Minute, "committed offsets at the log end", func() bool {
		c, err := cl.TryCommitted(group, topic, parts)
		return err == nil && testsupport.EqualOffsets(c, end)
	})
	members["a"].Stop(t)
	members["b"].Stop(t)
	if bad := ta.badValues(); len(bad) > 0 {
		t.Errorf("wrong payloads: %v", head(bad))
	}
	d := testsupport.NoneLost(t, ta, testsupport.Offsets(parts, 0), end)
	bad, afterJava := ta.tidemarkTwice()
	java.mu.Lock()
	events := fmt.Sprint(java.events)
	java.mu.Unlock()
	t.Logf("%d messages: upgraded with %s; downgraded; handled by a %d, b %d, java %d; %d handled again after the Java consumer (%s); Java events %s",
		ta.distinct(), upgraded, ta.by("a"), ta.by("b"), ta.by("java"), afterJava, d, events)
	if len(bad) > 0 {
		t.Errorf("handled again after a tidemark member had handled them (%d): %v", len(bad), head(bad))
	}
}

// A tidemark member with GroupProtocol "consumer" joins a group of two
// tidemark classic members: the group upgrades, c gets partitions through
// ConsumerGroupHeartbeat while a and b stay on the classic protocol; when
// c stops, the group downgrades and a and b own every partition. Every
// hand-off is graceful: nothing lost, nothing handled twice.
func TestOnlineMigrationTidemarkMembers(t *testing.T) {
	const parts = 6
	cl, topic, group, ta, ld, members, kc := migrationGroup(t, parts)
	cfg := consumerConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "c.db"), ta.handler("c"))
	cfg.ClientID = "c"
	c := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 90*time.Second, "the group upgraded to a consumer group", func() bool { return groupType(t, kc, group) == "consumer" })
	testsupport.WaitFor(t, 90*time.Second, "c running partitions", func() bool { return len(runningOn(c)) > 0 })
	ta.settle(t, parts, "c joined", "c", "a", "b")
	if st := c.C.Stats(); st.GroupProtocol != framework.GroupProtocolConsumer || st.MemberEpoch <= 0 {
		t.Errorf("c's Stats: protocol %q, member epoch %d", st.GroupProtocol, st.MemberEpoch)
	}
	upgraded := fmt.Sprintf("a %v, b %v, c %v (member epoch %d)", runningOn(members["a"]), runningOn(members["b"]), runningOn(c), c.C.Stats().MemberEpoch)

	c.Stop(t)
	testsupport.WaitFor(t, 90*time.Second, "the group downgraded to a classic group", func() bool { return groupType(t, kc, group) == "classic" })
	testsupport.WaitFor(t, 90*time.Second, "a and b owning every partition", func() bool {
		return len(runningOn(members["a"]))+len(runningOn(members["b"])) == parts
	})
	ta.settle(t, parts, "c left", "a", "b")

	end := ld.stopAndWait(t, ta, parts)
	testsupport.WaitFor(t, time.Minute, "committed offsets at the log end", func() bool {
		cm, err := cl.TryCommitted(group, topic, parts)
		return err == nil && testsupport.EqualOffsets(cm, end)
	})
	members["a"].Stop(t)
	members["b"].Stop(t)
	if bad := ta.badValues(); len(bad) > 0 {
		t.Errorf("wrong payloads: %v", head(bad))
	}
	d := testsupport.ExactlyOnce(t, ta, testsupport.Offsets(parts, 0), end)
	t.Logf("%d messages: upgraded with %s; downgraded; handled by a %d, b %d, c %d; %s",
		ta.distinct(), upgraded, ta.by("a"), ta.by("b"), ta.by("c"), d)
}
