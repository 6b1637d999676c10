//go:build !linux

package tidemark_test

import (
	"os"
	"testing"
)

// asUnprivileged runs fn when the tests do not run as root; as root, where
// permission bits do not apply, it skips the test: dropping file-system
// permissions needs Linux's setfsuid.
func asUnprivileged(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Skip("running as root: permission checks need Linux's setfsuid")
	}
	fn()
}
