package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/tidemarktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openStore opens a Store in t's temporary folder, closed when t ends.
func openStore(t *testing.T, busyTimeout time.Duration) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "orders.sqlite")
	s, err := OpenStore(t.Context(), path, busyTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// config is the test's Config: the batch handler h (the Store behind a
// Recorder) on b's topic, retries kept short.
func config(b *tidemarktest.Broker, topic string, h handler.BatchHandler) framework.Config {
	return framework.Config{
		Brokers:        b.Brokers(),
		Topics:         []string{topic},
		BatchHandler:   h,
		BatchSize:      25,
		RetryBackoff:   5 * time.Millisecond,
		CommitInterval: 50 * time.Millisecond,
	}
}

// dump returns every row of the three tables, in order, to compare the
// database before and after a repeat.
func dump(t *testing.T, s *Store) []string {
	t.Helper()
	var rows []string
	for _, q := range []string{
		`SELECT topic, partition, offset, key, value FROM events ORDER BY topic, partition, offset`,
		`SELECT key, status, updates, '', '' FROM orders ORDER BY key`,
		`SELECT topic, partition, last_offset, '', '' FROM applied ORDER BY topic, partition`,
	} {
		rs, err := s.db.QueryContext(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var a, b, c, d, e string
			if err := rs.Scan(&a, &b, &c, &d, &e); err != nil {
				t.Fatal(err)
			}
			rows = append(rows, strings.Join([]string{a, b, c, d, e}, "|"))
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		rs.Close()
	}
	return rows
}

// checkTables fails t unless the tables hold each message of msgs exactly
// once: its events row, one update of its order, its order's last status,
// and its partition's last offset in applied.
func checkTables(t *testing.T, s *Store, msgs []kafka.Message) {
	t.Helper()
	ctx := t.Context()
	type tp struct {
		topic     string
		partition int
	}
	updates, status := map[string]int{}, map[string]string{}
	last := map[tp]int64{}
	for _, m := range msgs {
		var key, value string
		err := s.db.QueryRowContext(ctx, `SELECT key, value FROM events WHERE topic = ? AND partition = ? AND offset = ?`,
			m.Topic, m.Partition, m.Offset).Scan(&key, &value)
		if err != nil {
			t.Fatalf("%s/%d offset %d: events row: %v", m.Topic, m.Partition, m.Offset, err)
		}
		if key != string(m.Key) || value != string(m.Value) {
			t.Errorf("%s/%d offset %d: events row %q=%q, want %q=%q", m.Topic, m.Partition, m.Offset, key, value, m.Key, m.Value)
		}
		updates[string(m.Key)]++
		status[string(m.Key)] = string(m.Value) // a key's messages are in one partition, in order
		last[tp{m.Topic, m.Partition}] = max(last[tp{m.Topic, m.Partition}], m.Offset)
	}
	got, err := s.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tables{Events: int64(len(msgs)), Orders: int64(len(updates)), Updates: int64(len(msgs))}); got != want {
		t.Errorf("tables hold %+v, want %+v", got, want)
	}
	for key, n := range updates {
		var st string
		var u int
		if err := s.db.QueryRowContext(ctx, `SELECT status, updates FROM orders WHERE key = ?`, key).Scan(&st, &u); err != nil {
			t.Fatalf("order %q: %v", key, err)
		}
		if st != status[key] || u != n {
			t.Errorf("order %q: status %q after %d updates, want %q after %d", key, st, u, status[key], n)
		}
	}
	for p, off := range last {
		var got int64
		if err := s.db.QueryRowContext(ctx, `SELECT last_offset FROM applied WHERE topic = ? AND partition = ?`, p.topic, p.partition).Scan(&got); err != nil {
			t.Fatalf("%s/%d: applied: %v", p.topic, p.partition, err)
		}
		if got != off {
			t.Errorf("%s/%d: applied offset %d, want %d", p.topic, p.partition, got, off)
		}
	}
}

// Every message's rows, once, written by batches of one transaction each.
func TestEachMessageOnce(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "orders", 3)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(600, 20)...)
	s, _ := openStore(t, time.Second)

	rec := tidemarktest.NewBatchRecorder(s)
	tidemarktest.Run(t, config(b, topic, rec), tidemarktest.Processed(msgs))
	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
	checkTables(t, s, msgs)
	st := s.Stats()
	if st.Applied != int64(len(msgs)) || st.Skipped != 0 || st.Failed != 0 {
		t.Errorf("store stats %+v, want %d applied, none skipped or failed", st, len(msgs))
	}
	if st.Batches >= int64(len(msgs)) {
		t.Errorf("%d transactions for %d messages: no batching", st.Batches, len(msgs))
	}
}

// What tidemark hands over again (a crash between the SQLite commit and
// the offset file's flush, a restart without the offset file) changes
// nothing: the same batches replayed, then a second consumer over every
// message.
func TestRepeatChangesNothing(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "orders", 3)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(400, 16)...)
	s, _ := openStore(t, time.Second)

	// Keep each batch the Store committed, to hand it over again.
	var mu sync.Mutex
	var batches [][]kafka.Message
	keep := handler.BatchHandlerFunc(func(ctx context.Context, ms []kafka.Message) error {
		if err := s.HandleBatch(ctx, ms); err != nil {
			return err
		}
		mu.Lock()
		batches = append(batches, slices.Clone(ms))
		mu.Unlock()
		return nil
	})
	rec := tidemarktest.NewBatchRecorder(keep)
	tidemarktest.Run(t, config(b, topic, rec), tidemarktest.Processed(msgs))
	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
	checkTables(t, s, msgs)
	want := dump(t, s)

	// The same batches again, as after a crash right after their commits.
	for _, ms := range batches {
		if err := s.HandleBatch(t.Context(), ms); err != nil {
			t.Fatal(err)
		}
	}
	if got := dump(t, s); !slices.Equal(got, want) {
		t.Fatalf("replaying %d batches changed the tables:\n%s\nwant:\n%s", len(batches), strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st := s.Stats(); st.Skipped != int64(len(msgs)) || st.Applied != int64(len(msgs)) {
		t.Errorf("after the replay: %+v, want %d applied and %d skipped", st, len(msgs), len(msgs))
	}

	// A restart with a fresh offset file (Run makes one) and a group
	// without a committed offset: every message is handed over again.
	again := tidemarktest.NewBatchRecorder(s)
	cfg := config(b, topic, again)
	cfg.GroupID = b.Name(t, "orders-again")
	tidemarktest.Run(t, cfg, tidemarktest.Processed(msgs))
	if err := again.Check(msgs); err != nil {
		t.Fatal(err) // the second consumer must have been given every message
	}
	if got := dump(t, s); !slices.Equal(got, want) {
		t.Fatalf("a second run changed the tables:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st := s.Stats(); st.Skipped != 2*int64(len(msgs)) || st.Applied != int64(len(msgs)) {
		t.Errorf("after the second run: %+v, want %d applied and %d skipped", st, len(msgs), 2*len(msgs))
	}
}

// A write SQLite refuses (another process holds the database's write lock:
// SQLITE_BUSY) fails the batch; tidemark retries it until the lock is
// gone, and nothing is lost or applied twice.
func TestFailedWriteRetried(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "orders", 2)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(300, 10)...)
	s, path := openStore(t, 10*time.Millisecond)

	// The other process: a connection of its own holding the write lock.
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	locked := true

	var mu sync.Mutex
	var firstErr error
	rec := tidemarktest.NewBatchRecorder(handler.BatchHandlerFunc(func(ctx context.Context, ms []kafka.Message) error {
		err := s.HandleBatch(ctx, ms)
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		return err
	}))
	c := tidemarktest.Run(t, config(b, topic, rec), func(c *framework.Consumer) bool {
		if locked && s.Stats().Failed >= 5 {
			if _, err := conn.ExecContext(t.Context(), "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			locked = false
		}
		return !locked && tidemarktest.Processed(msgs)(c)
	})
	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
	checkTables(t, s, msgs)
	if st := s.Stats(); st.Failed < 5 || st.Applied != int64(len(msgs)) {
		t.Errorf("store stats %+v, want at least 5 failed tries and %d applied", st, len(msgs))
	}
	var sqliteErr *sqlite.Error
	if !errors.As(firstErr, &sqliteErr) || sqliteErr.Code() != sqlite3.SQLITE_BUSY {
		t.Errorf("the first try failed with %v, want SQLITE_BUSY", firstErr)
	}
	var handlerErrors uint64
	for _, p := range c.Stats().Partitions {
		handlerErrors += p.HandlerErrors
	}
	if handlerErrors != uint64(s.Stats().Failed) {
		t.Errorf("tidemark counted %d handler errors, the Store returned %d", handlerErrors, s.Stats().Failed)
	}
}

// A message the database refuses for good (a CHECK constraint) fails its
// batch; tidemark splits the batch to find it, the rest of the batch is
// applied, and the failure policy skips that one message.
func TestConstraintSkipsOneMessage(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "orders", 1)
	in := tidemarktest.Keyed(100, 5)
	in[42].Value = nil // an empty status: orders' CHECK refuses it
	msgs := b.Produce(t, topic, in...)
	bad := msgs[42]
	good := slices.Delete(slices.Clone(msgs), 42, 43)
	s, _ := openStore(t, time.Second)

	rec := tidemarktest.NewBatchRecorder(s)
	cfg := config(b, topic, rec)
	cfg.Failure = framework.FailurePolicy{Action: framework.Skip, MaxAttempts: 2}
	c := tidemarktest.Run(t, cfg, tidemarktest.Processed(msgs))
	if err := rec.Check(good); err != nil {
		t.Fatal(err)
	}
	checkTables(t, s, good)
	var skipped uint64
	var lastErr string
	for _, p := range c.Stats().Partitions {
		skipped += p.Skipped
		lastErr += p.LastError
	}
	if skipped != 1 {
		t.Errorf("%d messages skipped, want 1 (offset %d)", skipped, bad.Offset)
	}
	if want := fmt.Sprintf("offset %d: offset %d: constraint failed", bad.Offset, bad.Offset); !strings.Contains(lastErr, want) {
		t.Errorf("LastError %q does not contain %q", lastErr, want)
	}
}

// The program, on the in-process broker (or on KAFKA_BROKERS's cluster
// when set, in a topic and groups of its own).
func TestRun(t *testing.T) {
	args := []string{"-messages", "300", "-orders", "12", "-dir", t.TempDir()}
	if v := os.Getenv(tidemarktest.EnvBrokers); v != "" {
		args = append(args, "-brokers", v)
	}
	var out, errs bytes.Buffer
	if err := run(t.Context(), args, &out, &errs); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, &out, &errs)
	}
	for _, want := range []string{
		"300 messages applied, 0 skipped",
		"tables: 300 events, 12 orders, 300 updates",
		"300 messages handled again, 0 applied, 300 skipped",
		"OK: each message's effect is in the database once",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output has no %q:\n%s", want, &out)
		}
	}
}

// The environment of TestCrashAfterCommit's child processes: the test
// runs its own binary, which crashes or resumes as a service would.
const (
	envChild   = "SQLITE_BATCHES_CHILD" // "crash" or "resume"
	envBrokers = "SQLITE_BATCHES_BROKERS"
	envTopic   = "SQLITE_BATCHES_TOPIC"
	envGroup   = "SQLITE_BATCHES_GROUP"
	envDB      = "SQLITE_BATCHES_DB"
	envOffsets = "SQLITE_BATCHES_OFFSETS"
	envEnds    = "SQLITE_BATCHES_ENDS" // partition:end,...
	crashAfter = 3                     // commits before the crash
	crashCode  = 3                     // the crashing child's exit status
)

// A process that dies right after an SQLite commit, before HandleBatch
// returned and so before tidemark recorded the batch: the restart, on the
// same offset file and group, hands the batch over again, and the guard
// skips it. The tables end exact.
func TestCrashAfterCommit(t *testing.T) {
	if os.Getenv(envChild) != "" {
		child(t)
		return
	}
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "orders", 3)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(600, 12)...)
	ends := map[int]int64{}
	for _, m := range msgs {
		ends[m.Partition] = max(ends[m.Partition], m.Offset+1)
	}
	var endList []string
	for p, e := range ends {
		endList = append(endList, fmt.Sprintf("%d:%d", p, e))
	}
	dir := t.TempDir()
	env := append(os.Environ(),
		envBrokers+"="+strings.Join(b.Brokers(), ","),
		envTopic+"="+topic,
		envGroup+"="+b.Name(t, "orders-crash"),
		envDB+"="+filepath.Join(dir, "orders.sqlite"),
		envOffsets+"="+filepath.Join(dir, "orders.offsets"),
		envEnds+"="+strings.Join(endList, ","),
	)
	start := func(role string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashAfterCommit$", "-test.count=1", "-test.v")
		cmd.Env = append(env, envChild+"="+role)
		return cmd.CombinedOutput()
	}

	out, err := start("crash")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != crashCode {
		t.Fatalf("the crashing child ended with %v, want exit status %d:\n%s", err, crashCode, out)
	}
	out, err = start("resume")
	if err != nil {
		t.Fatalf("the resumed child: %v\n%s", err, out)
	}
	var st StoreStats
	_, line, ok := strings.Cut(string(out), "STATS ")
	if !ok {
		t.Fatalf("the resumed child printed no stats:\n%s", out)
	}
	line, _, _ = strings.Cut(line, "\n")
	if err := json.Unmarshal([]byte(line), &st); err != nil {
		t.Fatalf("the resumed child's stats %q: %v", line, err)
	}
	if st.Skipped < 1 {
		t.Errorf("the resumed child skipped nothing (%+v): the crashed batch was not handed over again", st)
	}
	if st.Applied >= int64(len(msgs)) {
		t.Errorf("the resumed child applied %d of %d messages: the crashed one applied none", st.Applied, len(msgs))
	}
	t.Logf("resumed: %+v", st)

	s, err := OpenStore(t.Context(), filepath.Join(dir, "orders.sqlite"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkTables(t, s, msgs)
}

// child is TestCrashAfterCommit's child process: a consumer on the
// parent's broker, offset file and database, with a static member id so
// that the restart takes the crashed one's place at once.
func child(t *testing.T) {
	s, err := OpenStore(t.Context(), os.Getenv(envDB), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ends := map[int]int64{}
	for _, pe := range strings.Split(os.Getenv(envEnds), ",") {
		var p int
		var e int64
		if _, err := fmt.Sscanf(pe, "%d:%d", &p, &e); err != nil {
			t.Fatalf("%s %q: %v", envEnds, pe, err)
		}
		ends[p] = e
	}
	topic := os.Getenv(envTopic)
	var h handler.BatchHandler = s
	if os.Getenv(envChild) == "crash" {
		var commits atomic.Int64
		h = handler.BatchHandlerFunc(func(ctx context.Context, ms []kafka.Message) error {
			if err := s.HandleBatch(ctx, ms); err != nil {
				return err
			}
			if commits.Add(1) == crashAfter {
				os.Exit(crashCode) // committed in SQLite, not recorded by tidemark
			}
			return nil
		})
	}
	tidemarktest.Run(t, framework.Config{
		Brokers:      strings.Split(os.Getenv(envBrokers), ","),
		GroupID:      os.Getenv(envGroup),
		InstanceID:   "sqlite-batches-0",
		Topics:       []string{topic},
		OffsetFile:   os.Getenv(envOffsets),
		BatchHandler: h,
		BatchSize:    25,
		RetryBackoff: 5 * time.Millisecond,
	}, func(c *framework.Consumer) bool { return caughtUp(c.Stats(), topic, ends) })
	js, err := json.Marshal(s.Stats())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("STATS %s\n", js)
}
