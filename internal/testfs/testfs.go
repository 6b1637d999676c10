// Package testfs gives tidemark's tests the file-system conditions they
// cannot get from a temporary folder alone: a small file system that fills
// up, and a user that permission bits apply to when the tests run as root.
// It is test support, imported only from _test.go files.
package testfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Fill writes a file in dir until the file system is full, then gives back
// room bytes of it. It returns the file's path, so that the test can remove
// it to make room again.
func Fill(t testing.TB, dir string, room int64) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(max(n-room, 0)); err != nil {
		t.Fatal(err)
	}
	return path
}
