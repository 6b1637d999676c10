//go:build !linux

package framework_test

import "testing"

// smallFS skips: a small file system is mounted on Linux only.
func smallFS(t *testing.T, _ int) string {
	t.Skip("a full disk needs a small file system: the test mounts a tmpfs, on Linux only")
	return ""
}

func fill(*testing.T, string, int64) string { return "" }
