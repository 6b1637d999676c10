package testsupport

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"testing"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Crash leaves at path what a SIGKILL of the process holding s would: the
// offset file as its last checkpoint wrote it, and its journal, which it
// returns. s must be idle (no flush running): its files are copied, s
// closed (which checkpoints and removes the journal) and the copies put
// back.
func Crash(t testing.TB, s *offsetfile.Store, path string) []byte {
	t.Helper()
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	journal, err := os.ReadFile(path + offsetfile.JournalSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+offsetfile.JournalSuffix, journal, 0o600); err != nil {
		t.Fatal(err)
	}
	return journal
}

// BadJournalEntry returns a copy of journal whose first entry claims far
// more records than it holds, with its checksum made right: a whole entry
// that does not decode, not a torn write (internal/offsetfile/journal.go has the
// layout).
func BadJournalEntry(journal []byte) []byte {
	b := append([]byte(nil), journal...)
	b[20] = 0x7f // the record count, the payload's first byte
	n := binary.BigEndian.Uint32(b[4:])
	tab := crc32.MakeTable(crc32.Castagnoli)
	binary.BigEndian.PutUint32(b[16:], crc32.Update(crc32.Checksum(b[8:16], tab), tab, b[20:20+n]))
	return b
}
