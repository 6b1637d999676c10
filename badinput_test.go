package tidemark_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testfs"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/offsetstore"
)

// Scenario 6a: a bad offset file is refused by New with an error naming the
// file and the cause; the file is left as it was and nothing is consumed.
func TestBadOffsetFile(t *testing.T) {
	nop := handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })
	cfgFor := func(path string) framework.Config {
		return framework.Config{Brokers: []string{"127.0.0.1:9"}, GroupID: "g", Topics: []string{"t"}, OffsetFile: path, Handler: nop}
	}
	goodFile := func(t *testing.T, dir string) string {
		path := filepath.Join(dir, "good.db")
		s, err := offsetstore.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for p := int32(0); p < 64; p++ {
			_ = s.SetWatermark(offsetstore.Key{Group: "g", Topic: "t", Partition: p}, 1000+int64(p), 3, "m")
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
		}, []string{"good.db", "schema version 99", "supports schema version 1"}, offsetstore.ErrSchema, false},
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
		{"locked by another process", func(t *testing.T, dir string) string {
			path := goodFile(t, dir)
			holdLock(t, path)
			return path
		}, []string{"good.db", "in use"}, offsetstore.ErrInUse, false},
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

// holdLock opens path in a child process and keeps it open until the test
// ends.
func holdLock(t *testing.T, path string) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=lock", "CHILD_FILE="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	buf := make([]byte, len("locked\n"))
	if _, err := io.ReadFull(stdout, buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("child did not lock %s: %q %v", path, buf, err)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Scenario 6b: every invalid Config field is reported, by name, with no
// panic.
// A wrong broker address: Run retries (nothing to give up on), and Stats,
// readiness and the status page say what fails (the address, the error)
// and since when, not only the log.
func TestUnreachableBrokerIsNamed(t *testing.T) {
	const addr = "127.0.0.1:1"
	cfg := fastConfig(framework.Config{Brokers: []string{addr}, GroupID: "g", Topics: []string{"t"},
		OffsetFile: filepath.Join(t.TempDir(), "o.db"), Handler: newRecorder(), Logger: testLogger(t), Timeout: time.Second})
	r := startConsumer(t, cfg)
	var s framework.Stats
	waitFor(t, 30*time.Second, "a failed join in Stats", func() bool {
		s = r.c.Stats()
		return s.JoinFailures >= 2
	})
	if !strings.Contains(s.JoinError, addr) || s.JoinFailingSince.IsZero() || time.Since(s.JoinFailingSince) > time.Minute {
		t.Fatalf("Stats: JoinError %q, JoinFailingSince %v, JoinFailures %d: want the address, the error and since when",
			s.JoinError, s.JoinFailingSince, s.JoinFailures)
	}
	err := r.c.Ready()
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "since") {
		t.Fatalf("Ready() = %v, want the address and since when", err)
	}
	if err := r.c.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v: an unreachable broker is not a reason to restart the process", err)
	}
	ready := getStatus(t, r.c, "/readyz")
	page := getStatus(t, r.c, "/status")
	if !strings.Contains(ready, addr) || !strings.Contains(page, `id="join-trouble"`) || !strings.Contains(page, addr) {
		t.Fatalf("/readyz %q; /status without the join trouble naming %s:\n%s", ready, addr, page)
	}
	t.Logf("Ready: %v", err)
}

func TestInvalidConfig(t *testing.T) {
	nop := handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })
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
		{"CommitInterval", func(c *framework.Config) { c.CommitInterval = -time.Second }},
		{"StartOffset", func(c *framework.Config) { c.StartOffset = 42 }},
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

// Scenario 6c: a handler that panics is recovered, the message retried, and
// the process lives on; nothing is skipped.
func TestHandlerPanicIsRetried(t *testing.T) {
	const parts, perPart = 2, 50
	cl, topic := newTopic(t, parts, perPart)
	var panics atomic.Int32
	rec := newRecorder()
	rec.before = func(_ context.Context, m kafka.Message) error {
		if m.Partition == 1 && m.Offset == 17 && panics.Add(1) <= 3 {
			panic("cannot parse message 17")
		}
		return nil
	}
	log, logs := observedLogger(t)
	cfg := baseConfig(t, cl, testsupport.Name(t, "g"), topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Logger = log
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "every message handled", func() bool { return rec.count() == parts*perPart })
	r.stop(t)
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("%d lost (%v), %d twice", len(lost), lost, dups)
	}
	if n := panics.Load(); n != 4 {
		t.Fatalf("handler called %d times on the panicking message, want 3 panics and 1 success", n)
	}
	warned := logs.FilterMessage("handler failed; retrying the same message").FilterField(zapcoreInt64("offset", 17)).Len()
	if warned != 3 {
		t.Fatalf("%d retry warnings for offset 17, want 3", warned)
	}
	for _, e := range logs.FilterMessage("handler failed; retrying the same message").All() {
		if s := e.ContextMap()["error"]; !strings.Contains(s.(string), "handler panicked on "+topic+"/1 at offset 17: cannot parse message 17") {
			t.Fatalf("retry log error %q does not name the message", s)
		}
	}
}

func zapcoreInt64(k string, v int64) zapcore.Field {
	return zapcore.Field{Key: k, Type: zapcore.Int64Type, Integer: v}
}

// Scenario 6d: positions outside the log. After retention deleted messages
// the watermark points to (below the log start) and after the topic was
// recreated (beyond the log end), the default policy resets to the log start,
// logs it at error level and records it in the offset file.
func TestOutOfRange(t *testing.T) {
	// retention consumes 100 messages, stops, lets 200 more arrive and
	// retention delete everything below 250, and restarts with policy.
	retention := func(t *testing.T, policy framework.OutOfRangePolicy) (*testsupport.Cluster, *recorder, *running, *observer.ObservedLogs, string, string, string) {
		const perPart = 100
		cl, topic := newTopic(t, 1, perPart)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		rec := newRecorder()
		r := startConsumer(t, baseConfig(t, cl, group, topic, file, rec))
		waitFor(t, time.Minute, "first batch", func() bool { return rec.count() == perPart })
		r.stop(t)

		cl.Produce(t, topic, 1, perPart, 2*perPart)
		deleteRecords(t, cl, topic, 0, 250)

		log, logs := observedLogger(t)
		cfg := baseConfig(t, cl, group, topic, file, rec)
		cfg.Logger = log
		cfg.OutOfRange = policy
		return cl, rec, startConsumer(t, cfg), logs, file, group, topic
	}
	t.Run("retention", func(t *testing.T) {
		_, rec, r, logs, file, group, topic := retention(t, framework.ResetToEarliest)
		waitFor(t, time.Minute, "messages after the reset", func() bool { return rec.count() == 100+50 })
		r.stop(t)
		lost, _ := rec.check(1, map[int]int64{0: 250}, map[int]int64{0: 300})
		if len(lost) > 0 {
			t.Fatalf("lost after the reset: %v", head(lost))
		}
		checkReset(t, logs, file, group, topic, 100, 250)
	})
	t.Run("retention, ResetToLatest", func(t *testing.T) {
		cl, rec, r, logs, file, group, topic := retention(t, framework.ResetToLatest)
		waitFor(t, time.Minute, "the reset to the log end", func() bool {
			ps := r.c.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateRunning && ps[0].Processed == 300
		})
		cl.Produce(t, topic, 1, 300, 5)
		waitFor(t, time.Minute, "messages produced after the reset", func() bool { return rec.count() == 100+5 })
		r.stop(t)
		if lost, _ := rec.check(1, map[int]int64{0: 300}, map[int]int64{0: 305}); len(lost) > 0 {
			t.Fatalf("lost after the reset: %v", lost)
		}
		checkReset(t, logs, file, group, topic, 100, 300)
	})
	t.Run("retention, Stall", func(t *testing.T) {
		cl, rec, r, logs, file, group, topic := retention(t, framework.Stall)
		waitFor(t, time.Minute, "the partition stalled", func() bool {
			ps := r.c.Stats().Partitions
			return len(ps) == 1 && ps[0].State == framework.StateStalled
		})
		p := r.c.Stats().Partitions[0]
		if !strings.Contains(p.LastError, "outside the log [250, 300]") {
			t.Errorf("stalled partition's LastError = %q", p.LastError)
		}
		if n := logs.FilterMessage("partition stalled: position out of range").Len(); n != 1 {
			t.Errorf("%d stall logs, want 1", n)
		}
		time.Sleep(300 * time.Millisecond)
		if n := rec.count(); n != 100 {
			t.Errorf("a stalled partition handled %d messages", n-100)
		}
		r.stop(t)
		if c := cl.Committed(t, group, topic, 1); c[0] != 100 {
			t.Errorf("Kafka committed %d for a stalled partition, want 100 (untouched)", c[0])
		}
		s, err := offsetstore.Open(file, &offsetstore.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if rec, _ := s.Durable(offsetstore.Key{Group: group, Topic: topic}); rec.Watermark != 100 || rec.LastReset != nil {
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
		cl, topic := newTopic(t, 1, 100)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		gate1, gate2 := make(chan struct{}), make(chan struct{})
		held := make(chan struct{})
		rec := newRecorder()
		var once sync.Once
		rec.before = func(_ context.Context, m kafka.Message) error {
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
		log, logs := observedLogger(t)
		cfg := baseConfig(t, cl, group, topic, file, rec)
		cfg.Logger = log
		cfg.FetchMaxBytes = 1
		r := startConsumer(t, cfg)
		<-held
		cl.Produce(t, topic, 1, 100, 200)
		time.Sleep(time.Second)
		cl.Produce(t, topic, 1, 300, 100)
		time.Sleep(time.Second)
		cl.Produce(t, topic, 1, 400, 100)
		deleteRecords(t, cl, topic, 0, 450)

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
		waitFor(t, time.Minute, "the reset position committed", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] >= 450
		})
		close(gate2)
		waitFor(t, time.Minute, "every message after the reset", func() bool {
			lost, _ := rec.check(1, offsets(1, 450), offsets(1, 500))
			return len(lost) == 0
		})
		waitFor(t, time.Minute, "the commit at the log end", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] == 500
		})
		r.stop(t)
		close(stop)
		<-watched
		if lost, dups := rec.check(1, offsets(1, 0), offsets(1, 100)); len(lost) > 0 || dups > 0 {
			t.Fatalf("before the reset: %d lost (%v), %d twice", len(lost), head(lost), dups)
		}
		if lost, dups := rec.check(1, offsets(1, 450), offsets(1, 500)); len(lost) > 0 || dups > 0 {
			t.Fatalf("after the reset: %d lost (%v), %d twice", len(lost), head(lost), dups)
		}
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
	t.Run("recreated topic", func(t *testing.T) {
		cl, topic := newTopic(t, 1, 100)
		group := testsupport.Name(t, "g")
		file := filepath.Join(t.TempDir(), "o.db")
		rec := newRecorder()
		r := startConsumer(t, baseConfig(t, cl, group, topic, file, rec))
		waitFor(t, time.Minute, "first topic consumed", func() bool { return rec.count() == 100 })
		r.stop(t)

		cl.DeleteTopic(t, topic)
		waitFor(t, 30*time.Second, "topic deleted", func() bool {
			md, err := cl.Client().Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
			return err == nil && (len(md.Topics) == 0 || md.Topics[0].Error != nil)
		})
		cl.CreateTopic(t, topic, 1)
		cl.Produce(t, topic, 1, 0, 10)

		rec2 := newRecorder()
		log, logs := observedLogger(t)
		cfg := baseConfig(t, cl, group, topic, file, rec2)
		cfg.Logger = log
		r = startConsumer(t, cfg)
		waitFor(t, time.Minute, "the recreated topic consumed", func() bool { return rec2.count() == 10 })
		r.stop(t)
		lost, dups := rec2.check(1, offsets(1, 0), offsets(1, 10))
		if len(lost) > 0 || dups > 0 {
			t.Fatalf("recreated topic: %d lost, %d twice", len(lost), dups)
		}
		checkReset(t, logs, file, group, topic, 100, 0)
	})
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
	s, err := offsetstore.Open(file, &offsetstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec, ok := s.Durable(offsetstore.Key{Group: group, Topic: topic, Partition: 0})
	if !ok || rec.LastReset == nil || rec.LastReset.From != from || rec.LastReset.To != to || rec.LastReset.Reason == "" {
		t.Fatalf("offset file record %+v (reset %+v), want a reset from %d to %d", rec, rec.LastReset, from, to)
	}
	t.Logf("reset recorded: %+v", *rec.LastReset)
}

// deleteRecords removes every record below offset, as retention does.
func deleteRecords(t *testing.T, cl *testsupport.Cluster, topic string, partition int32, offset int64) {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := req.RequestWith(ctx, kc)
	if err != nil {
		t.Fatalf("DeleteRecords: %v", err)
	}
	for _, rt := range res.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				t.Fatalf("DeleteRecords %s/%d: error code %d", rt.Topic, rp.Partition, rp.ErrorCode)
			}
		}
	}
}
