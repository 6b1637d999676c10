package offsetfile_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/testsupport"
)

func TestMain(m *testing.M) {
	if testsupport.ChildKind() == "journal" {
		os.Exit(journalChild()) // the child of TestJournalModel
	}
	if code, ok := testsupport.ChildMain(); ok {
		os.Exit(code) // the child process of TestLockedByAnotherProcess
	}
	goleak.VerifyTestMain(m)
}
