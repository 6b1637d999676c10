package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// Every read command on a consumer running on the in-process broker (or
// KAFKA_BROKERS): inspect and export from its live snapshot, diff against
// the broker; check, set and import refused while it holds the file. Then
// the same file after the consumer stopped, read directly.
func TestLive(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := cl.FixedName(t, "orders"), cl.FixedName(t, "billing")
	cl.CreateTopic(t, topic, 3)
	cl.Produce(t, topic, 3, 0, 50)
	file := filepath.Join(t.TempDir(), "offsets.db")
	var failing atomic.Bool
	h := handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		if failing.Load() && m.Partition == 1 && m.Offset == 50 {
			return errors.New("downstream unavailable")
		}
		return nil
	})
	c := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, h))
	synced := func() bool {
		for _, p := range c.C.Stats().Partitions {
			if p.Committed != 50 {
				return false
			}
		}
		return len(c.C.Stats().Partitions) == 3
	}
	testsupport.WaitFor(t, 30*time.Second, "50 messages per partition handled and committed", synced)
	// Stats learns of a commit before the offset file records it (its next
	// flush, within FlushInterval): wait until the file shows it too.
	testsupport.WaitFor(t, 30*time.Second, "the commits recorded in the offset file", func() bool {
		out := tidemark(t, "inspect", file).stdout
		return strings.Count(out, "  running\n") == 3
	})
	pid := fmt.Sprint(os.Getpid())

	r := tidemark(t, "inspect", file).want(t, 0, "live snapshot from the consumer running as pid "+pid,
		"group "+group+"  topic "+topic, "PROCESSED", "LAG", "running")
	if r.took > 3*time.Second || strings.Count(r.stdout, "  running\n") != 3 {
		t.Errorf("took %v; want 3 running partitions", r.took)
	}
	var doc struct {
		Source     string
		Pid        int
		Group      string
		Partitions []struct {
			Topic     string
			Partition int32
			Watermark int64
			Committed int64
			State     []string
			Live      *framework.PartitionStats
		}
	}
	r = tidemark(t, "inspect", file, "--json").want(t, 0)
	snakeCaseKeys(t, "inspect --json (live)", r.stdout)
	must(t, json.Unmarshal([]byte(r.stdout), &doc))
	if doc.Source != "live" || doc.Pid != os.Getpid() || doc.Group != group || len(doc.Partitions) != 3 {
		t.Fatalf("inspect --json: %+v", doc)
	}
	for _, p := range doc.Partitions {
		if p.Topic != topic || p.Watermark != 50 || p.Live == nil || p.Live.Processed != 50 || p.Live.State != framework.StateRunning {
			t.Errorf("partition %+v (live %+v)", p, p.Live)
		}
	}

	r = tidemark(t, "export", file).want(t, 0, `"format": "tidemark-offsets"`, "exported the durable records of the running consumer (pid "+pid+")")
	snakeCaseKeys(t, "export (live)", r.stdout)
	var exp offsetsDoc
	must(t, json.Unmarshal([]byte(r.stdout), &exp))
	if len(exp.Groups) != 1 || len(exp.Groups[0].Topics[0].Partitions) != 3 {
		t.Errorf("export: %+v", exp)
	}
	testsupport.WaitFor(t, 30*time.Second, "diff in sync", func() bool {
		return tidemark(t, "diff", file, "--brokers", cl.Upstream).code == 0
	})
	tidemark(t, "diff", file, "--brokers", cl.Upstream).want(t, 0, "in sync", "no findings")
	snakeCaseKeys(t, "diff --json (live)", tidemark(t, "diff", file, "--brokers", cl.Upstream, "--json").want(t, 0).stdout)

	// Commit confirmations are recorded just after Stats shows them, in
	// the journal, and in the file at the committer's next round (every
	// CommitInterval, 1s): let the file settle first, unchanged over longer
	// than that.
	before, since := hashFileNoLock(t, file), time.Now()
	testsupport.WaitFor(t, 30*time.Second, "the file to settle", func() bool {
		time.Sleep(300 * time.Millisecond)
		if h := hashFileNoLock(t, file); h != before {
			before, since = h, time.Now()
		}
		return time.Since(since) > 1500*time.Millisecond
	})
	tidemark(t, "check", file).want(t, 2, "is in use by the consumer running as pid "+pid+": stop it first")
	tidemark(t, "set", file, "--group", group, "--topic", topic, "--partition", "0", "--offset", "1").want(t, 2, "in use by the consumer running as pid "+pid)
	in := filepath.Join(t.TempDir(), "in.json")
	must(t, os.WriteFile(in, []byte(r.stdout), 0o600))
	tidemark(t, "import", file, "--from", in, "--force").want(t, 2, "in use by the consumer running as pid "+pid)
	if hashFileNoLock(t, file) != before {
		// The consumer is idle (nothing to handle), so the file must not
		// have moved: the refused commands wrote nothing.
		t.Error("the file changed while refused commands ran")
	}

	// A failing message: its partition shows retrying, with the error.
	failing.Store(true)
	cl.Produce(t, topic, 3, 50, 1)
	testsupport.WaitFor(t, 30*time.Second, "partition 1 retrying", func() bool {
		return strings.Contains(tidemark(t, "inspect", file).stdout, "retrying")
	})
	tidemark(t, "inspect", file).want(t, 0, "partition 1: retrying offset 50, attempt", "last error: downstream unavailable")
	failing.Store(false)
	testsupport.WaitFor(t, 30*time.Second, "51 per partition committed", func() bool {
		for _, p := range c.C.Stats().Partitions {
			if p.Committed != 51 {
				return false
			}
		}
		return true
	})

	c.Stop(t)
	if _, err := os.Stat(file + inspect.SideFileSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("side file after the consumer stopped: %v", err)
	}
	r = tidemark(t, "inspect", file).want(t, 0, "the file (no consumer holds it)")
	if strings.Count(r.stdout, "  clean\n") != 3 {
		t.Errorf("after a clean stop, want 3 clean partitions")
	}
	r2 := tidemark(t, "check", file).want(t, 0, "findings  none")
	if !testsupport.RealBroker() {
		m := func(s string) string { return mask(s, true, file, "FILE", cl.Upstream, "BROKER") }
		golden(t, "framework-inspect", m(r.stdout))
		golden(t, "framework-check", maskLayout(m(r2.stdout)))
		golden(t, "framework-diff", m(tidemark(t, "diff", file, "--brokers", cl.Upstream).want(t, 0).stdout))
	}
}

// hashFileNoLock hashes the file's bytes (reading does not take the lock).
func hashFileNoLock(t *testing.T, path string) [32]byte { return hashFile(t, path) }

// A side file left by a crash, or naming a consumer that does not answer,
// never makes inspect hang: it reads the file directly when it can, and
// says why; when another process holds the lock it gives up in seconds.
func TestStaleSideFile(t *testing.T) {
	path := fixture(t)
	side := path + inspect.SideFileSuffix
	writeSide := func(pid int, network, addr string) {
		b, _ := json.Marshal(inspect.Endpoint{Version: 1, Pid: pid, Network: network, Address: addr, Token: "x", OffsetFile: path})
		must(t, os.WriteFile(side, b, 0o600))
	}
	dead := exec.Command("true")
	must(t, dead.Run())
	deadPid := dead.ProcessState.Pid()

	writeSide(deadPid, "unix", filepath.Join(t.TempDir(), "gone.sock"))
	r := tidemark(t, "inspect", path).want(t, 0, "the file (no consumer holds it); stale side file", fmt.Sprintf("pid %d is not running", deadPid))
	checkFast(t, r, 4*time.Second)

	writeSide(os.Getpid(), "unix", filepath.Join(t.TempDir(), "gone.sock"))
	r = tidemark(t, "inspect", path).want(t, 0, "the file (no consumer holds it)", "did not answer")
	checkFast(t, r, 4*time.Second)

	// A listener that accepts and never answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	writeSide(os.Getpid(), "tcp", l.Addr().String())
	r = tidemark(t, "inspect", path).want(t, 0, "the file (no consumer holds it)", "did not answer")
	checkFast(t, r, 4*time.Second)

	must(t, os.WriteFile(side, []byte("garbage"), 0o600))
	tidemark(t, "inspect", path).want(t, 0, "side file unusable")

	// Another process holds the lock and serves nothing.
	st, err := offsetfile.Open(path, nil)
	must(t, err)
	defer st.Close()
	must(t, os.Remove(side))
	r = tidemark(t, "inspect", path).want(t, 2, "is in use by another process and it publishes no live snapshot")
	checkFast(t, r, 4*time.Second)
	writeSide(os.Getpid(), "tcp", l.Addr().String())
	r = tidemark(t, "inspect", path).want(t, 2, "is in use by another process and the consumer named in", "did not answer")
	checkFast(t, r, 4*time.Second)
}

func checkFast(t *testing.T, r result, limit time.Duration) {
	t.Helper()
	if r.took > limit {
		t.Errorf("took %v, want at most %v", r.took, limit)
	}
}

// A partition held by an open transaction at read_committed: inspect says
// where and for how long, and --json carries the last stable offset.
func TestLiveOpenTransaction(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 1)
	file := filepath.Join(t.TempDir(), "offsets.db")
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
	cfg.IsolationLevel = kafka.ReadCommitted
	c := frameworktest.Start(t, cfg)
	kc := testsupport.NewProducer(t, []string{cl.Upstream}, kgo.TransactionalID(testsupport.Name(t, "txn")))
	if err := kc.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := testsupport.ProduceSync(kc, testsupport.ValueRecords(topic, 0, 0, 3)); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 30*time.Second, "the partition to be held by the open transaction", func() bool {
		ps := c.C.Stats().Partitions
		return len(ps) == 1 && ps[0].TransactionWait > 0
	})
	tidemark(t, "inspect", file).want(t, 0, "partition 0: held at the last stable offset 0 (log end 3) by an open transaction for ")
	tidemark(t, "inspect", file, "--json").want(t, 0, `"last_stable_offset": 0`, `"transaction_wait_ns": `)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kc.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
}

// A Handler's panic is shown by inspect with its stack, for the partition
// it holds.
func TestLivePanicStack(t *testing.T) {
	cl, topic := testsupport.NewTopic(t, 1, 3)
	file := filepath.Join(t.TempDir(), "offsets.db")
	cfg := frameworktest.Config(t, cl.Brokers, testsupport.Name(t, "g"), topic, file, handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		if m.Offset == 1 {
			panicOnOffsetOne()
		}
		return nil
	}))
	c := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "offset 1 retried", func() bool {
		ps := c.C.Stats().Partitions
		return len(ps) == 1 && ps[0].Attempts >= 2
	})
	tidemark(t, "inspect", file).want(t, 0, "last error: handler panicked on "+topic+"/0 at offset 1", "panic stack:\n", "panicOnOffsetOne")
}

func panicOnOffsetOne() { panic("cannot parse") }

// A consumed topic that does not exist is named by inspect.
func TestLiveMissingTopic(t *testing.T) {
	cl := testsupport.Start(t)
	file := filepath.Join(t.TempDir(), "offsets.db")
	missing := testsupport.Name(t, "paymnts")
	cfg := frameworktest.Config(t, cl.Brokers, testsupport.Name(t, "g"), missing, file, handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
	c := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the topic reported missing", func() bool { return len(c.C.Stats().MissingTopics) == 1 })
	tidemark(t, "inspect", file).want(t, 0, "missing topics: ["+missing+"] do not exist")
}
