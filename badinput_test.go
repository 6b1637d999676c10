package tidemark_test

// Bad input and a bad environment: offset files New refuses, invalid
// configs, an unreachable broker, positions outside the log (retention, a
// recreated topic), positions moved back (an operator's reset), and an
// offset file on a full disk.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testfs"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
	"github.com/tidemark/tidemark/tidemarktest"
)

// damagedFailurePage writes an offset file with failure entries and
// overwrites the root page of them with random bytes, as in issue 27; it
// returns the file's path.
func damagedFailurePage(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "damaged.db")
	s, err := offsetfile.Open(path, &offsetfile.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 64; p++ {
		k := offsetfile.Key{Group: "g", Topic: "t", Partition: p}
		for off := int64(0); off < 20; off++ {
			f := offsetfile.Failure{Offset: off, Action: offsetfile.FailureDeadLetter, Attempts: 3, Reason: "handler: timeout", DeadLetter: "t.dlq/0@1"}
			if err := s.RecordFailure(k, f); err != nil {
				t.Fatal(err)
			}
		}
		_ = s.SetWatermark(k, 1000+int64(p), 3, "m")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The root page of the failure entries of g/t.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	_ = db.View(func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket([]byte("failures")).Bucket([]byte("g")).Bucket([]byte("t")).Root())
		return nil
	})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if root == 0 {
		t.Fatal("the failure entries are inline, on no page of their own")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = rand.Read(b[root*4096 : (root+1)*4096])
	writeFile(t, path, b)
	return path
}

// Scenario 6a: a bad offset file is refused by New with an error naming the
// file and the cause; the file is left as it was and nothing is consumed.
func TestBadOffsetFile(t *testing.T) {
	nop := handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })
	cfgFor := func(path string) framework.Config {
		return framework.Config{Brokers: []string{"127.0.0.1:9"}, GroupID: "g", Topics: []string{"t"}, OffsetFile: path, Handler: nop}
	}
	goodFile := func(t *testing.T, dir string) string {
		path := filepath.Join(dir, "good.db")
		s, err := offsetfile.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for p := int32(0); p < 64; p++ {
			_ = s.SetWatermark(offsetfile.Key{Group: "g", Topic: "t", Partition: p}, 1000+int64(p), 3, "m")
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}

	// Each case sets up its bad path inside dir, a directory of its own;
	// "untouched" means nothing in dir changed: no entry created, removed
	// or renamed, no content, mode or modification time changed (a
	// directory's own time changes when an entry is created in it, even
	// one removed again).
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string) string
		want  []string // substrings of the error
		is    error
		// unprivileged: New runs with the file-system permissions of an
		// unprivileged user (see testfs.AsUnprivileged), as root too.
		unprivileged bool
	}{
		{"random bytes", func(t *testing.T, dir string) string {
			path := filepath.Join(dir, "random.db")
			b := make([]byte, 64<<10)
			_, _ = rand.Read(b)
			writeFile(t, path, b)
			return path
		}, []string{"random.db"}, nil, false},
		{"truncated", func(t *testing.T, dir string) string {
			path := goodFile(t, dir)
			b, _ := os.ReadFile(path)
			writeFile(t, path, b[:len(b)/2])
			return path
		}, []string{"good.db", "truncated"}, nil, false},
		{"another schema version", func(t *testing.T, dir string) string {
			path := goodFile(t, dir)
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				v := binary.BigEndian.AppendUint32(nil, 99)
				return tx.Bucket([]byte("meta")).Put([]byte("schema"), v)
			})
			if err2 := db.Close(); err == nil {
				err = err2
			}
			if err != nil {
				t.Fatal(err)
			}
			return path
		}, []string{"good.db", "schema version 99", "supports schema version 1"}, offsetfile.ErrSchema, false},
		{"a directory", func(t *testing.T, dir string) string {
			path := filepath.Join(dir, "dir.db")
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
			// Something inside, which must stay as it is.
			writeFile(t, filepath.Join(path, "inside"), []byte("keep"))
			return path
		}, []string{"dir.db", "directory"}, nil, false},
		{"missing folder", func(t *testing.T, dir string) string {
			return filepath.Join(dir, "no", "such", "offsets.db")
		}, []string{"offsets.db"}, nil, false},
		{"unwritable folder", func(t *testing.T, dir string) string {
			// Let an unprivileged user reach dir (t.TempDir's parent is
			// 0700); the folder is readable, not writable.
			if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			ro := filepath.Join(dir, "ro")
			if err := os.Mkdir(ro, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(ro, 0o555); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Chmod(ro, 0o755) })
			return filepath.Join(ro, "offsets.db")
		}, []string{"offsets.db", "permission denied"}, nil, true},
		// Issue 27: a damaged page of failure entries passed New, and the
		// consumer crashed at its first dead letter.
		{"a damaged page of failure entries", func(t *testing.T, dir string) string {
			return damagedFailurePage(t, dir)
		}, []string{"damaged.db", "damaged", `"failures"`, "tidemark export --salvage", "move it aside"}, offsetfile.ErrDamaged, false},
		// A 0-byte file may be one that lost its history: refused, not
		// initialised.
		{"0 bytes", func(t *testing.T, dir string) string {
			path := filepath.Join(dir, "empty.db")
			writeFile(t, path, nil)
			return path
		}, []string{"empty.db", "0 bytes", "move it aside or delete it to start with no history"}, offsetfile.ErrDamaged, false},
		{"locked by another process", func(t *testing.T, dir string) string {
			path := goodFile(t, dir)
			testsupport.HoldLock(t, path)
			return path
		}, []string{"good.db", "in use"}, offsetfile.ErrInUse, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tc.setup(t, dir)
			before := snapshotTree(t, dir)
			start := time.Now()
			var c *framework.Consumer
			var err error
			newConsumer := func() { c, err = framework.New(cfgFor(path)) }
			if tc.unprivileged {
				testfs.AsUnprivileged(t, newConsumer)
			} else {
				newConsumer()
			}
			if err == nil {
				_ = c.Close()
				t.Fatalf("New accepted a bad offset file %s", path)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("New took %s to refuse the file", took)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
			if diff := diffTrees(before, snapshotTree(t, dir)); len(diff) > 0 {
				t.Errorf("New changed %s: %s", dir, strings.Join(diff, "; "))
			}
			t.Logf("%s: %v (%d entries untouched)", tc.name, err, len(before))
		})
	}
}

// Scenario 6b: every invalid Config field is reported, by name, with no
// panic.
func TestInvalidConfig(t *testing.T) {
	nop := handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })
	txNop := handler.TxHandlerFunc(func(context.Context, handler.State, []kafka.Message) error { return nil })
	valid := func() framework.Config {
		return framework.Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"},
			OffsetFile: filepath.Join(t.TempDir(), "o.db"), Handler: nop}
	}
	cases := []struct {
		field string
		mod   func(*framework.Config)
	}{
		{"Brokers", func(c *framework.Config) { c.Brokers = nil }},
		{"Brokers", func(c *framework.Config) { c.Brokers = []string{"localhost"} }},
		{"GroupID", func(c *framework.Config) { c.GroupID = " " }},
		{"Topics", func(c *framework.Config) { c.Topics = nil }},
		{"Topics", func(c *framework.Config) { c.Topics = []string{"a", "a"} }},
		{"Topics", func(c *framework.Config) { c.Topics = []string{""} }},
		{"OffsetFile", func(c *framework.Config) { c.OffsetFile = "" }},
		{"Handler", func(c *framework.Config) { c.Handler = nil }},
		{"BatchHandler", func(c *framework.Config) { c.TxHandler = txNop }},
		{"Ordering", func(c *framework.Config) { c.Handler, c.TxHandler, c.Ordering = nil, txNop, framework.OrderKey }},
		{"Ordering", func(c *framework.Config) { c.Handler, c.TxHandler, c.Ordering = nil, txNop, framework.OrderNone }},
		{"StateChangelog", func(c *framework.Config) { c.StateChangelog = "-state" }},
		{"StateRebuild", func(c *framework.Config) { c.StateRebuild = true }},
		{"StateRebuild", func(c *framework.Config) {
			c.Handler, c.TxHandler, c.StateChangelog, c.StateRebuild = nil, txNop, "-state", true
		}},
		{"CommitInterval", func(c *framework.Config) { c.CommitInterval = -time.Second }},
		{"StartOffset", func(c *framework.Config) { c.StartOffset = 42 }},
		{"IsolationLevel", func(c *framework.Config) { c.IsolationLevel = 3 }},
		{"MetadataMaxAge", func(c *framework.Config) { c.MetadataMaxAge = -time.Second }},
		{"OutOfRange", func(c *framework.Config) { c.OutOfRange = 7 }},
		{"DrainTimeout", func(c *framework.Config) { c.DrainTimeout = time.Minute }},
		{"MaxRetryBackoff", func(c *framework.Config) { c.RetryBackoff, c.MaxRetryBackoff = time.Second, time.Millisecond }},
		{"HeartbeatInterval", func(c *framework.Config) { c.HeartbeatInterval = time.Minute }},
		{"FetchMaxBytes", func(c *framework.Config) { c.FetchMaxBytes = -1 }},
		{"Timeout", func(c *framework.Config) { c.Timeout = -1 }},
		{"Failure.MaxAttempts", func(c *framework.Config) { c.Failure = framework.FailurePolicy{MaxAttempts: 3} }},
		{"Failure.MaxAttempts", func(c *framework.Config) {
			c.Failure = framework.FailurePolicy{Action: framework.Skip, MaxAttempts: -1}
		}},
		{"Failure.DeadLetterTopic", func(c *framework.Config) { c.Failure = framework.FailurePolicy{Action: framework.DeadLetter} }},
		{"Failure.DeadLetterTopic", func(c *framework.Config) {
			c.Failure = framework.FailurePolicy{Action: framework.DeadLetter, DeadLetterTopic: "t"}
		}},
		{"Failure.Action", func(c *framework.Config) { c.Failure = framework.FailurePolicy{Action: 9} }},
		{"TopicFailure", func(c *framework.Config) {
			c.TopicFailure = map[string]framework.FailurePolicy{"other": {Action: framework.Skip}}
		}},
		{`TopicFailure["t"].DeadLetterTopic`, func(c *framework.Config) {
			c.TopicFailure = map[string]framework.FailurePolicy{"t": {Action: framework.DeadLetter}}
		}},
	}
	for _, tc := range cases {
		cfg := valid()
		tc.mod(&cfg)
		c, err := framework.New(cfg)
		if err == nil {
			_ = c.Close()
			t.Errorf("%s: New accepted %+v", tc.field, cfg)
			continue
		}
		var ce *framework.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("%s: error %v does not name the field", tc.field, err)
		}
		if _, statErr := os.Stat(cfg.OffsetFile); statErr == nil {
			t.Errorf("%s: New created the offset file although the config was invalid", tc.field)
		}
	}
	// All errors at once.
	_, err := framework.New(framework.Config{})
	for _, f := range []string{"Brokers", "GroupID", "Topics", "OffsetFile", "Handler"} {
		if err == nil || !strings.Contains(err.Error(), "Config."+f) {
			t.Errorf("New(Config{}) = %v, want it to name %s", err, f)
		}
	}
}

// A wrong broker address: Run retries (nothing to give up on), and Stats,
// readiness and the status page say what fails (the address, the error)
// and since when, not only the log.
func TestUnreachableBrokerIsNamed(t *testing.T) {
	const addr = "127.0.0.1:1"
	cfg := frameworktest.Fast(framework.Config{Brokers: []string{addr}, GroupID: "g", Topics: []string{"t"},
		Handler: &tidemarktest.Recorder{}, Logger: testsupport.Logger(t), Timeout: time.Second})
	var failed error
	var readyErr error
	tidemarktest.Run(t, cfg, steps(&failed, step{
		what: "a failed join in Stats", within: 30 * time.Second,
		done: func(c *framework.Consumer) (bool, error) {
			s := c.Stats()
			if s.JoinFailures < 2 {
				return false, nil
			}
			if !strings.Contains(s.JoinError, addr) || s.JoinFailingSince.IsZero() || time.Since(s.JoinFailingSince) > time.Minute {
				return false, fmt.Errorf("Stats: JoinError %q, JoinFailingSince %v, JoinFailures %d: want the address, the error and since when",
					s.JoinError, s.JoinFailingSince, s.JoinFailures)
			}
			readyErr = c.Ready()
			if readyErr == nil || !strings.Contains(readyErr.Error(), addr) || !strings.Contains(readyErr.Error(), "since") {
				return false, fmt.Errorf("Ready() = %v, want the address and since when", readyErr)
			}
			if err := c.Healthy(); err != nil {
				return false, fmt.Errorf("Healthy() = %v: an unreachable broker is not a reason to restart the process", err)
			}
			ready := frameworktest.Status(t, c, "/readyz")
			page := frameworktest.Status(t, c, "/status")
			if !strings.Contains(ready, addr) || !strings.Contains(page, `id="join-trouble"`) || !strings.Contains(page, addr) {
				return false, fmt.Errorf("/readyz %q; /status without the join trouble naming %s:\n%s", ready, addr, page)
			}
			return true, nil
		},
	}))
	if failed != nil {
		t.Fatal(failed)
	}
	t.Logf("Ready: %v", readyErr)
}

// Scenario 6d: positions outside the log. After retention deleted messages
// the watermark points to (below the log start) and after the topic was
// recreated (beyond the log end), the default policy resets to the log start,
// logs it at error level and records it in the offset file.
func TestOutOfRange(t *testing.T) {
	// retention consumes 100 messages, stops, lets 200 more arrive and
	// retention delete everything below 250, and restarts with policy.
	retention := func(t *testing.T, policy framework.OutOfRangePolicy) (*testsupport.Cluster, *testsupport.Recorder, *frameworktest.Running, *observer.ObservedLogs, string, string, string) {
		const perPart = 100
		cl, topic := testsupport.NewTopic(t, 1, perPart)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		rec := &testsupport.Recorder{}
		r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, rec))
		testsupport.WaitFor(t, time.Minute, "first batch", func() bool { return rec.Count() == perPart })
		r.Stop(t)

		cl.Produce(t, topic, 1, perPart, 2*perPart)
		cl.DeleteRecords(t, topic, 0, 250)

		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.Logger = log
		cfg.OutOfRange = policy
		return cl, rec, frameworktest.Start(t, cfg), logs, file, group, topic
	}
	t.Run("retention", func(t *testing.T) {
		_, rec, r, logs, file, group, topic := retention(t, framework.ResetToEarliest)
		testsupport.WaitFor(t, time.Minute, "messages after the reset", func() bool { return rec.Count() == 100+50 })
		r.Stop(t)
		testsupport.NoneLost(t, rec, map[int]int64{0: 250}, map[int]int64{0: 300})
		checkReset(t, logs, file, group, topic, 100, 250)
	})
	t.Run("retention, ResetToLatest", func(t *testing.T) {
		cl, rec, r, logs, file, group, topic := retention(t, framework.ResetToLatest)
		testsupport.WaitFor(t, time.Minute, "the reset to the log end", func() bool {
			ps := r.C.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateRunning && ps[0].Processed == 300
		})
		cl.Produce(t, topic, 1, 300, 5)
		testsupport.WaitFor(t, time.Minute, "messages produced after the reset", func() bool { return rec.Count() == 100+5 })
		r.Stop(t)
		testsupport.NoneLost(t, rec, map[int]int64{0: 300}, map[int]int64{0: 305})
		checkReset(t, logs, file, group, topic, 100, 300)
	})
	t.Run("retention, Stall", func(t *testing.T) {
		cl, rec, r, logs, file, group, topic := retention(t, framework.Stall)
		testsupport.WaitFor(t, time.Minute, "the partition stalled", func() bool {
			ps := r.C.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateStalled
		})
		p := r.C.Stats().Partitions[0]
		if !strings.Contains(p.LastError, "outside the log [250, 300]") {
			t.Errorf("stalled partition's LastError = %q", p.LastError)
		}
		if n := logs.FilterMessage("partition stalled: position out of range").Len(); n != 1 {
			t.Errorf("%d stall logs, want 1", n)
		}
		time.Sleep(300 * time.Millisecond)
		if n := rec.Count(); n != 100 {
			t.Errorf("a stalled partition handled %d messages", n-100)
		}
		r.Stop(t)
		if c := cl.Committed(t, group, topic, 1); c[0] != 100 {
			t.Errorf("Kafka committed %d for a stalled partition, want 100 (untouched)", c[0])
		}
		s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if rec, _ := s.Durable(offsetfile.Key{Group: group, Topic: topic}); rec.Watermark != 100 || rec.LastReset != nil {
			t.Errorf("offset file %+v after a stall, want watermark 100 and no reset", rec)
		}
	})
	t.Run("retention during consumption", func(t *testing.T) {
		// The handler is held at offset 10 of the first batch (0..99) while
		// 100..499 arrive and retention deletes everything below 450. With
		// FetchMaxBytes 1 a fetch brings one batch, and the partition is
		// fetched again once its buffer is empty: the fetch at 100 is out of
		// range, and the reset to 450 is recorded after 0..99 were handled.
		// Kafka's committed offset must never go back: a reset recorded
		// while older messages are still being handled would commit 450 and
		// then their lower watermarks. The holds at 150 and 200 catch an
		// engine that fetched ahead and handles 100..399 after recording the
		// reset (tidemark's engine before the fetch-by-broker rewrite did).
		cl, topic := testsupport.NewTopic(t, 1, 100)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		gate1, gate2 := make(chan struct{}), make(chan struct{})
		held := make(chan struct{})
		rec := &testsupport.Recorder{}
		var once sync.Once
		rec.Before = func(_ context.Context, m kafka.Message) error {
			switch m.Offset {
			case 10:
				once.Do(func() {
					close(held)
					<-gate1
				})
			case 150:
				<-gate2
			case 200:
				time.Sleep(500 * time.Millisecond) // long enough for a commit of its watermark
			}
			return nil
		}
		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.Logger = log
		cfg.FetchMaxBytes = 1
		r := frameworktest.Start(t, cfg)
		<-held
		cl.Produce(t, topic, 1, 100, 200)
		time.Sleep(time.Second)
		cl.Produce(t, topic, 1, 300, 100)
		time.Sleep(time.Second)
		cl.Produce(t, topic, 1, 400, 100)
		cl.DeleteRecords(t, topic, 0, 450)

		// Watch Kafka's committed offset from here on.
		var mu sync.Mutex
		var seen []int64
		stop := make(chan struct{})
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			for {
				if c, err := cl.TryCommitted(group, topic, 1); err == nil {
					mu.Lock()
					if n := len(seen); n == 0 || seen[n-1] != c[0] {
						seen = append(seen, c[0])
					}
					mu.Unlock()
				}
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
		close(gate1)
		// The reset's position reaches Kafka either way; only then may a
		// handler held at 150 go on.
		testsupport.WaitFor(t, time.Minute, "the reset position committed", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] >= 450
		})
		close(gate2)
		testsupport.WaitFor(t, time.Minute, "every message after the reset", func() bool {
			return len(testsupport.Check(rec, testsupport.Offsets(1, 450), testsupport.Offsets(1, 500)).Lost) == 0
		})
		testsupport.WaitFor(t, time.Minute, "the commit at the log end", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] == 500
		})
		r.Stop(t)
		close(stop)
		<-watched
		testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 0), testsupport.Offsets(1, 100))
		testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 450), testsupport.Offsets(1, 500))
		mu.Lock()
		for i := 1; i < len(seen); i++ {
			if seen[i] < seen[i-1] {
				t.Errorf("Kafka's committed offset went back from %d to %d (sequence %v)", seen[i-1], seen[i], seen)
				break
			}
		}
		t.Logf("committed offsets seen: %v", seen)
		mu.Unlock()
		checkReset(t, logs, file, group, topic, 100, 450)
	})
	// The topic is recreated under a running consumer that started at
	// Kafka's committed offset 100: the fetch at 100 is beyond the new log's
	// end, and the reset to 0 moves the position back. What is handled from
	// there must reach Kafka: a committer that never commits below the
	// offset it resumed from (so that a stale checkpoint cannot move Kafka
	// back) must still commit below it after a reset.
	t.Run("recreated topic during consumption", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		rec2 := &testsupport.Recorder{}
		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec2)
		cfg.Logger = log
		r := frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, time.Minute, "the restart running at 100", func() bool {
			ps := r.C.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateRunning && ps[0].Committed == 100
		})
		cl.DeleteTopic(t, topic)
		cl.WaitDeleted(t, topic)
		cl.CreateTopic(t, topic, 1)
		cl.Produce(t, topic, 1, 0, 10)
		testsupport.WaitFor(t, time.Minute, "the recreated topic consumed and committed", func() bool {
			c, err := cl.TryCommitted(group, topic, 1)
			return rec2.Count() == 10 && err == nil && c[0] == 10
		})
		r.Stop(t)
		testsupport.ExactlyOnce(t, rec2, testsupport.Offsets(1, 0), testsupport.Offsets(1, 10))
		checkReset(t, logs, file, group, topic, 100, 0)
	})
	t.Run("recreated topic", func(t *testing.T) {
		cl, topic := testsupport.NewTopic(t, 1, 100)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		rec := &testsupport.Recorder{}
		r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, rec))
		testsupport.WaitFor(t, time.Minute, "first topic consumed", func() bool { return rec.Count() == 100 })
		r.Stop(t)

		cl.DeleteTopic(t, topic)
		cl.WaitDeleted(t, topic)
		cl.CreateTopic(t, topic, 1)
		cl.Produce(t, topic, 1, 0, 10)

		rec2 := &testsupport.Recorder{}
		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec2)
		cfg.Logger = log
		r = frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, time.Minute, "the recreated topic consumed", func() bool { return rec2.Count() == 10 })
		r.Stop(t)
		testsupport.ExactlyOnce(t, rec2, testsupport.Offsets(1, 0), testsupport.Offsets(1, 10))
		checkReset(t, logs, file, group, topic, 100, 0)
	})
}

// A committed offset that is missing, or below the last commit Kafka
// confirmed (the offset file's ledger), is not a late commit: the topic was
// recreated or an operator reset the group's offsets. Reconciliation must
// not resume at the file's watermark and skip what lies below it.
func TestPositionDiscontinuity(t *testing.T) {
	t.Run("recreated topic grown past the watermark", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		cl.DeleteTopic(t, topic)
		cl.WaitDeleted(t, topic)
		cl.CreateTopic(t, topic, 1)
		cl.Produce(t, topic, 1, 0, 150) // past the file's watermark, 100

		rec := &testsupport.Recorder{}
		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.Logger = log
		r := frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, 20*time.Second, "the recreated topic consumed", func() bool { return rec.Count() == 150 })
		r.Stop(t)
		testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 0), testsupport.Offsets(1, 150))
		checkReset(t, logs, file, group, topic, 100, 0)
	})
	// Issue 26: the file holds watermark 0 with [1, 100) completed above it
	// (offset 0 held at the stop); the topic is recreated. The reset's
	// target is the old watermark, 0, and the old ranges describe another
	// log: all 100 new messages must be handled, not 1.
	t.Run("recreated topic under completed ranges", func(t *testing.T) {
		cl, topic := testsupport.NewTopic(t, 1, 100)
		group, file := testsupport.Name(t, "g"), filepath.Join(t.TempDir(), "o.db")
		rec := &testsupport.Recorder{}
		rec.Before = func(ctx context.Context, m kafka.Message) error {
			if m.Offset == 0 {
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.Ordering, cfg.MaxInFlight, cfg.DrainTimeout = framework.OrderKey, 4, 200*time.Millisecond
		r := frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, time.Minute, "1-99 completed above the held offset 0", func() bool {
			ps := r.C.Stats().Partitions
			return rec.Count() == 99 && len(ps) == 1 && ps[0].Durable == 0
		})
		r.Stop(t)
		st, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		held, _ := st.Get(offsetfile.Key{Group: group, Topic: topic, Partition: 0})
		st.Close()
		if held.Watermark != 0 || !slices.Equal(held.Completed, []offsetfile.Range{{From: 1, To: 100}}) {
			t.Fatalf("the first run left watermark %d, completed %v; want 0 and [1, 100)", held.Watermark, held.Completed)
		}
		cl.DeleteTopic(t, topic)
		cl.WaitDeleted(t, topic)
		cl.CreateTopic(t, topic, 1)
		cl.Produce(t, topic, 1, 0, 100)

		rec2 := &testsupport.Recorder{}
		cfg = frameworktest.Config(t, cl.Brokers, group, topic, file, rec2)
		cfg.Ordering, cfg.MaxInFlight = framework.OrderKey, 4
		r = frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, 20*time.Second, "the recreated topic consumed", func() bool { return rec2.Count() == 100 })
		r.Stop(t)
		testsupport.ExactlyOnce(t, rec2, testsupport.Offsets(1, 0), testsupport.Offsets(1, 100))
	})
	// resetTo40 does what kafka-consumer-groups --reset-offsets
	// --to-offset 40 does on the empty group.
	resetTo40 := func(t *testing.T, cl *testsupport.Cluster, group, topic string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := cl.Client().OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 40}}}})
		if err == nil {
			for _, p := range res.Topics[topic] {
				if p.Error != nil {
					err = p.Error
				}
			}
		}
		if err != nil {
			t.Fatalf("resetting the group's offset: %v", err)
		}
		if c := cl.Committed(t, group, topic, 1); c[0] != 40 {
			t.Fatalf("Kafka committed %d after the reset, want 40", c[0])
		}
	}
	t.Run("operator reset below the watermark", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		resetTo40(t, cl, group, topic)

		rec := &testsupport.Recorder{}
		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.Logger = log
		r := frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, 20*time.Second, "the reset range handled again", func() bool { return rec.Count() == 60 })
		time.Sleep(200 * time.Millisecond)
		r.Stop(t)
		testsupport.ExactlyOnce(t, rec, testsupport.Offsets(1, 40), testsupport.Offsets(1, 100))
		checkReset(t, logs, file, group, topic, 100, 40)
		if c := cl.Committed(t, group, topic, 1); c[0] != 100 {
			t.Errorf("Kafka committed %d at the end, want 100", c[0])
		}
	})
	t.Run("operator reset, Stall", func(t *testing.T) {
		cl, topic, group, file := consumeFirst(t)
		resetTo40(t, cl, group, topic)
		rec := &testsupport.Recorder{}
		log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
		cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
		cfg.Logger = log
		cfg.OutOfRange = framework.Stall
		r := frameworktest.Start(t, cfg)
		testsupport.WaitFor(t, 20*time.Second, "the partition stalled", func() bool {
			ps := r.C.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateStalled
		})
		time.Sleep(200 * time.Millisecond)
		r.Stop(t)
		if n := rec.Count(); n != 0 {
			t.Errorf("a stalled partition handled %d messages", n)
		}
		if n := logs.FilterMessage("partition stalled: committed offset moved back").Len(); n != 1 {
			t.Errorf("%d stall logs, want 1", n)
		}
		if c := cl.Committed(t, group, topic, 1); c[0] != 40 {
			t.Errorf("Kafka committed %d for a stalled partition, want the operator's 40", c[0])
		}
	})
}

// A full disk: the offset file sits on a small tmpfs left with little room,
// so its writes fail as soon as it needs a page it never wrote. Stats says
// so, and each partition stops handling once MaxUndurable messages are not
// durable, instead of handling on with a frozen durable watermark. Space
// freed, the writes succeed, handling resumes, and nothing is lost or
// handled twice.
func TestOffsetFileFull(t *testing.T) {
	const parts, bound = 2, 100
	dir := testfs.SmallFS(t, 1<<20)
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "t", parts)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(6000, 10)...)
	ends := spread(t, msgs, parts)
	rec := &tidemarktest.Recorder{}
	cfg := frameworktest.Config(t, b.Brokers(), b.Name(t, "g"), topic, filepath.Join(dir, "offsets.db"), rec)
	cfg.MaxUndurable = bound
	cfg.InspectSocket = "-"
	// Room for the file's creation and its first transaction (bbolt's four
	// initial pages and its buckets), not for the pages the watermarks need.
	filler := testfs.Fill(t, dir, int64(7*os.Getpagesize()))
	var (
		st      framework.Stats
		handled int
		failed  error
		atEnd   = b.CommittedAtEnd(t, topic)
	)
	tidemarktest.Run(t, cfg, steps(&failed, step{
		what: "handling stopped at MaxUndurable with the write error in Stats", within: time.Minute,
		done: func(c *framework.Consumer) (bool, error) {
			st = c.Stats()
			if st.OffsetFileError == "" || len(st.Partitions) != parts {
				return false, nil
			}
			for _, p := range st.Partitions {
				if !p.DurableWait {
					return false, nil
				}
			}
			if !strings.Contains(st.OffsetFileError, "no space left on device") {
				t.Errorf("OffsetFileError %q does not say the disk is full", st.OffsetFileError)
			}
			for _, p := range st.Partitions {
				if p.Processed-max(p.Durable, -1) > bound || p.Processed >= ends[p.Partition] {
					return false, fmt.Errorf("%s/%d handled on past MaxUndurable: processed %d, durable %d", p.Topic, p.Partition, p.Processed, p.Durable)
				}
			}
			handled = rec.Count()
			time.Sleep(300 * time.Millisecond) // nothing more while the disk is full
			if n := rec.Count(); n != handled {
				return false, fmt.Errorf("%d more messages handled while waiting for the offset file", n-handled)
			}
			return true, os.Remove(filler)
		},
	}, step{
		what: "everything committed once the disk has room", within: time.Minute,
		done: func(c *framework.Consumer) (bool, error) {
			if !atEnd(c) {
				return false, nil
			}
			if e := c.Stats().OffsetFileError; e != "" {
				t.Errorf("OffsetFileError still %q after a successful write", e)
			}
			return true, nil
		},
	}))
	if failed != nil {
		t.Fatal(failed)
	}
	rec.Verify(t, msgs)
	t.Logf("disk full: %d messages handled, then the partitions waited (error %q); resumed and finished once it had room", handled, st.OffsetFileError)
}

// snapshotTree describes every entry under root, root included: its type,
// mode, size, modification time and, for files, a digest of the content.
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%s size %d mtime %s", info.Mode(), info.Size(), info.ModTime().Format(time.RFC3339Nano))
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" sha256 %x", sha256.Sum256(b))
		}
		rel, _ := filepath.Rel(root, path)
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("listing %s: %v", root, err)
	}
	return out
}

// diffTrees lists what differs between two snapshotTree results.
func diffTrees(before, after map[string]string) []string {
	var diff []string
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			diff = append(diff, fmt.Sprintf("%s removed", p))
		case a != b:
			diff = append(diff, fmt.Sprintf("%s was %s, is %s", p, b, a))
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			diff = append(diff, fmt.Sprintf("%s created (%s)", p, a))
		}
	}
	sort.Strings(diff)
	return diff
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// consumeFirst consumes 100 messages of a new one-partition topic and
// stops, Kafka having confirmed the commit of 100.
func consumeFirst(t *testing.T) (*testsupport.Cluster, string, string, string) {
	t.Helper()
	cl, topic := testsupport.NewTopic(t, 1, 100)
	group := testsupport.Name(t, "g")
	file := filepath.Join(t.TempDir(), "o.db")
	rec := &testsupport.Recorder{}
	r := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, rec))
	testsupport.WaitFor(t, time.Minute, "first batch", func() bool { return rec.Count() == 100 })
	r.Stop(t)
	if c := cl.Committed(t, group, topic, 1); c[0] != 100 {
		t.Fatalf("Kafka committed %d after the first run, want 100", c[0])
	}
	return cl, topic, group, file
}

// checkReset asserts the reset from -> to was logged at error level with
// both offsets and recorded in the offset file.
func checkReset(t *testing.T, logs *observer.ObservedLogs, file, group, topic string, from, to int64) {
	t.Helper()
	found := false
	for _, e := range logs.FilterMessage("position out of range; resetting").All() {
		m := e.ContextMap()
		if e.Level == zapcore.ErrorLevel && m["from"] == from && m["to"] == to && m["topic"] == topic {
			found = true
		}
	}
	if !found {
		t.Errorf("no error-level log of the reset from %d to %d", from, to)
	}
	s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec, ok := s.Durable(offsetfile.Key{Group: group, Topic: topic, Partition: 0})
	if !ok || rec.LastReset == nil || rec.LastReset.From != from || rec.LastReset.To != to || rec.LastReset.Reason == "" {
		t.Fatalf("offset file record %+v (reset %+v), want a reset from %d to %d", rec, rec.LastReset, from, to)
	}
	t.Logf("reset recorded: %+v", *rec.LastReset)
}
