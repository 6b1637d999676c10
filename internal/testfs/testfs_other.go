//go:build !linux

package testfs

import (
	"os"
	"testing"
)

// SmallFS skips the test: a small file system is mounted on Linux only.
func SmallFS(t testing.TB, _ int) string {
	t.Helper()
	t.Skip("a full disk needs a small file system: the test mounts a tmpfs, on Linux only")
	return ""
}

// AsUnprivileged runs fn when the tests do not run as root; as root, where
// permission bits do not apply, it skips the test: dropping file-system
// permissions needs Linux's setfsuid.
func AsUnprivileged(t testing.TB, fn func()) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Skip("running as root: permission checks need Linux's setfsuid")
	}
	fn()
}
