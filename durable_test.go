package tidemark_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testfs"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// Bounded replay: with MaxUndurable 1 each message is durable in the
// offset file before the next one of its partition is handled, so a
// SIGKILL makes the restart handle again at most one message per
// partition.
func TestBoundedReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("several session timeouts: skipped in -short mode")
	}
	const parts, perPart, kills = 4, 600, 3
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file, ledgerPath := filepath.Join(dir, "offsets.db"), filepath.Join(dir, "ledger")
	cl.CreateTopic(t, topic, parts)
	cl.Produce(t, topic, parts, 0, perPart)
	start := func() *exec.Cmd {
		return startConsumeChild(t,
			"CHILD_BROKERS="+strings.Join(cl.Brokers, ","), "CHILD_GROUP="+group, "CHILD_TOPIC="+topic,
			"CHILD_FILE="+file, "CHILD_LEDGER="+ledgerPath, "CHILD_MAX_UNDURABLE=1")
	}
	for k := 0; k < kills; k++ {
		cmd := start()
		before := len(readLedger(t, ledgerPath))
		waitFor(t, 2*time.Minute, fmt.Sprintf("run %d handling", k+1), func() bool {
			return len(readLedger(t, ledgerPath)) > before+200
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	cmd := start()
	waitFor(t, 2*time.Minute, "everything handled after the last restart", func() bool {
		return distinct(readLedger(t, ledgerPath)) == parts*perPart
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	entries := readLedger(t, ledgerPath)
	again := len(entries) - distinct(entries)
	t.Logf("MaxUndurable 1, %d SIGKILLs of a consumer of %d partitions: %d messages handled again (at most %d)", kills, parts, again, kills*parts)
	if again > kills*parts {
		t.Fatalf("%d messages handled again after %d SIGKILLs, want at most one per partition per kill (%d)", again, kills, kills*parts)
	}
}

// A full disk: the offset file sits on a small tmpfs left with little room,
// so its writes fail as soon as it needs a page it never wrote. Stats says
// so, and each partition stops handling once MaxUndurable messages are not
// durable, instead of handling on with a frozen durable watermark. Space
// freed, the writes succeed, handling resumes, and nothing is lost or
// handled twice.
func TestOffsetFileFull(t *testing.T) {
	const parts, perPart, bound = 2, 3000, 100
	dir := testfs.SmallFS(t, 1<<20)
	cl, topic := newTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	rec := newRecorder()
	cfg := baseConfig(t, cl, group, topic, filepath.Join(dir, "offsets.db"), rec)
	cfg.MaxUndurable = bound
	cfg.InspectSocket = "-"
	// Room for the file's creation and its first transaction (bbolt's four
	// initial pages and its buckets), not for the pages the watermarks need.
	filler := testfs.Fill(t, dir, int64(7*os.Getpagesize()))
	r := startConsumer(t, cfg)
	var st framework.Stats
	waitFor(t, time.Minute, "handling stopped at MaxUndurable with the write error in Stats", func() bool {
		st = r.c.Stats()
		if st.OffsetFileError == "" || len(st.Partitions) != parts {
			return false
		}
		for _, p := range st.Partitions {
			if !p.DurableWait {
				return false
			}
		}
		return true
	})
	if !strings.Contains(st.OffsetFileError, "no space left on device") {
		t.Errorf("OffsetFileError %q does not say the disk is full", st.OffsetFileError)
	}
	for _, p := range st.Partitions {
		if p.Processed-max(p.Durable, -1) > bound || p.Processed >= perPart {
			t.Fatalf("%s/%d handled on past MaxUndurable: processed %d, durable %d", p.Topic, p.Partition, p.Processed, p.Durable)
		}
	}
	handled := rec.count()
	time.Sleep(300 * time.Millisecond) // nothing more while the disk is full
	if n := rec.count(); n != handled {
		t.Fatalf("%d more messages handled while waiting for the offset file", n-handled)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "everything committed once the disk has room", func() bool {
		return equalOffsets(cl.Committed(t, group, topic, parts), offsets(parts, perPart))
	})
	if e := r.c.Stats().OffsetFileError; e != "" {
		t.Errorf("OffsetFileError still %q after a successful write", e)
	}
	r.stop(t)
	lost, dups := rec.check(parts, offsets(parts, 0), offsets(parts, perPart))
	if len(lost) > 0 || dups > 0 {
		t.Fatalf("lost %d (%v), %d handled twice", len(lost), lost[:min(len(lost), 5)], dups)
	}
	t.Logf("disk full: %d messages handled, then the partitions waited (error %q); resumed and finished once it had room", handled, st.OffsetFileError)
}
