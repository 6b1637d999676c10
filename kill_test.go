package tidemark_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/offsetstore"
)

// Scenario 2: a consumer process is killed with SIGKILL mid-stream and
// restarted, several times. Nothing is lost, and no message whose offset
// was durable in the local file at the kill is handled again.
func TestSIGKILLAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("several session timeouts: skipped in -short mode")
	}
	const parts, perPart, kills = 4, 1500, 3
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "t")
	group := testsupport.Name(t, "g")
	dir := t.TempDir()
	file := filepath.Join(dir, "offsets.db")
	ledgerPath := filepath.Join(dir, "ledger")
	cl.CreateTopic(t, topic, parts)
	cl.Produce(t, topic, parts, 0, perPart)

	start := func() *exec.Cmd {
		return startConsumeChild(t,
			"CHILD_BROKERS="+strings.Join(cl.Brokers, ","), "CHILD_GROUP="+group, "CHILD_TOPIC="+topic,
			"CHILD_FILE="+file, "CHILD_LEDGER="+ledgerPath, "CHILD_WORK=1ms")
	}

	type killPoint struct {
		lines   int             // ledger lines written before the kill
		durable map[int32]int64 // durable watermarks in the file after the kill
	}
	var points []killPoint
	for k := 0; k < kills; k++ {
		cmd := start()
		before := len(readLedger(t, ledgerPath))
		// Kill once this run has handled a few hundred messages.
		waitFor(t, 2*time.Minute, fmt.Sprintf("run %d handling", k+1), func() bool {
			return len(readLedger(t, ledgerPath)) > before+300+k*150
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		kp := killPoint{lines: len(readLedger(t, ledgerPath)), durable: map[int32]int64{}}
		s, err := offsetstore.Open(file, &offsetstore.Options{ReadOnly: true})
		if err != nil {
			t.Fatalf("reading the offset file after the kill: %v", err)
		}
		for _, e := range s.Records() {
			kp.durable[e.Partition] = e.Watermark
		}
		_ = s.Close()
		points = append(points, kp)
		t.Logf("kill %d: %d messages handled so far, durable watermarks %v", k+1, kp.lines, kp.durable)
	}

	// The last run consumes everything and stops gracefully.
	cmd := start()
	waitFor(t, 2*time.Minute, "everything handled after the last restart", func() bool {
		return distinct(readLedger(t, ledgerPath)) == parts*perPart
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graceful stop of the last run: %v", err)
	}

	entries := readLedger(t, ledgerPath)
	count := map[[2]int64]int{}
	for _, e := range entries {
		count[e]++
	}
	lost := 0
	for p := 0; p < parts; p++ {
		for o := 0; o < perPart; o++ {
			if count[[2]int64{int64(p), int64(o)}] == 0 {
				lost++
			}
		}
	}
	// Offsets below the durable watermark at a kill that were handled
	// again after it.
	durableAgain := 0
	for i, kp := range points {
		end := len(entries)
		if i+1 < len(points) {
			end = points[i+1].lines
		}
		for _, e := range entries[kp.lines:end] {
			if e[1] < kp.durable[int32(e[0])] {
				durableAgain++
			}
		}
	}
	dups := len(entries) - len(count)
	t.Logf("%d messages, %d SIGKILLs: %d lost, %d durable offsets handled again, %d handled twice in all (handled after the last durable flush before a kill)",
		parts*perPart, kills, lost, durableAgain, dups)
	if lost > 0 || durableAgain > 0 {
		t.Fatalf("%d lost, %d durable offsets handled again", lost, durableAgain)
	}
	if c := cl.Committed(t, group, topic, parts); !equalOffsets(c, offsets(parts, perPart)) {
		t.Fatalf("committed %v after the graceful stop, want %d everywhere", c, perPart)
	}
}

// readLedger parses a child's ledger: one "partition offset" per line.
func readLedger(t testing.TB, path string) [][2]int64 {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var p, o int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &p, &o); err != nil {
			continue // a line cut by the kill
		}
		out = append(out, [2]int64{p, o})
	}
	return out
}

func distinct(entries [][2]int64) int {
	m := map[[2]int64]bool{}
	for _, e := range entries {
		m[e] = true
	}
	return len(m)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
