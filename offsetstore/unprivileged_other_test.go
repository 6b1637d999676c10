//go:build !linux

package offsetstore_test

import (
	"os"
	"testing"
)

// asUnprivileged runs fn; as root, where permission bits do not apply and
// no per-thread way to drop them exists here, it skips the test.
func asUnprivileged(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Skip("permission tests need a non-root user on this OS")
	}
	fn()
}
