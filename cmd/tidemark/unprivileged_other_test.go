//go:build !linux

package main

import (
	"os"
	"testing"
)

// asUnprivileged runs fn as is when the tests do not run as root; as root,
// it skips the test: dropping file-system permissions needs Linux's
// setfsuid.
func asUnprivileged(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Skip("running as root: permission checks need Linux's setfsuid")
	}
	fn()
}
