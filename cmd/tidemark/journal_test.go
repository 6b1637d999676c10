package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// A file a crash left with a journal (what the consumer wrote since its last
// checkpoint): check counts its entries, inspect and export show what it
// holds, and a command that writes folds it into the file. A journal entry
// that does not decode is an error check names, and the read commands
// refuse the file saying how to recover.
func TestJournalCommands(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "offsets.db")
	k := offsetfile.Key{Group: "billing", Topic: "orders", Partition: 0}
	st, err := offsetfile.Open(file, &offsetfile.Options{SyncInterval: time.Hour})
	must(t, err)
	must(t, st.SetWatermark(k, 10, 1, "m"))
	must(t, st.Sync(t.Context())) // checkpointed: 10
	must(t, st.SetWatermark(k, 42, 1, "m"))
	must(t, st.Flush(t.Context())) // journaled only: 42
	// What a SIGKILL leaves: the file as checkpointed and the journal.
	journal := testsupport.Crash(t, st, file)

	tidemark(t, "check", file).want(t, 0, "journal   1 entries newer than the last checkpoint", "Open applies them")
	tidemark(t, "inspect", file).want(t, 0, "42")
	if fi, err := os.Stat(file + offsetfile.JournalSuffix); err != nil || fi.Size() != int64(len(journal)) {
		t.Fatalf("a read command changed the journal: %v, %v", fi, err)
	}

	// A whole entry (its checksum right) that does not decode.
	bad := testsupport.BadJournalEntry(journal)
	must(t, os.WriteFile(file+offsetfile.JournalSuffix, bad, 0o600))
	tidemark(t, "check", file).want(t, 1, "error: damaged: journal", "move the journal aside")
	tidemark(t, "inspect", file).want(t, 2, "move the journal aside")

	// Back to the sound journal: set writes, so it folds the journal in.
	must(t, os.WriteFile(file+offsetfile.JournalSuffix, journal, 0o600))
	tidemark(t, "set", file, "--group", "billing", "--topic", "orders", "--partition", "0", "--offset", "43").want(t, 0)
	if _, err := os.Stat(file + offsetfile.JournalSuffix); !os.IsNotExist(err) {
		t.Fatalf("the journal after a command that writes: %v, want folded in and removed", err)
	}
	tidemark(t, "check", file).want(t, 0, "findings  none")
	tidemark(t, "inspect", file).want(t, 0, "43")
}
