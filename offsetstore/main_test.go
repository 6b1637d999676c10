package offsetstore_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		os.Exit(holdLock(path)) // child process of TestLockedByAnotherProcess
	}
	goleak.VerifyTestMain(m)
}
