package testsupport

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"
)

// Ledger is what a child consumer (see StartChild) wrote to its ledger
// file: one "partition offset" line per message handled, written with one
// write(2) each, so that a SIGKILL cannot undo it.
type Ledger struct {
	// Entries are the messages in the order handled, repeats included.
	Entries []Offset
	times   map[Offset]int
}

// ReadLedger reads the ledger at path; a missing file is an empty ledger.
// A line cut short by a kill is left out.
func ReadLedger(t testing.TB, path string) *Ledger {
	t.Helper()
	l := &Ledger{times: map[Offset]int{}}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return l
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var o Offset
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &o.Partition, &o.Offset); err != nil {
			continue // a line cut by the kill
		}
		l.Entries = append(l.Entries, o)
		l.times[o]++
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the ledger %s: %v", path, err)
	}
	return l
}

// Len is the number of messages handled, repeats included.
func (l *Ledger) Len() int { return len(l.Entries) }

// Distinct is the number of distinct offsets handled.
func (l *Ledger) Distinct() int { return len(l.times) }

// Times is how many times the ledger lists offset of partition.
func (l *Ledger) Times(partition int, offset int64) int { return l.times[Offset{partition, offset}] }
