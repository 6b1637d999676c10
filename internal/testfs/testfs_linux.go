package testfs

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
)

// nobody is the user id permission tests run as: an ordinary user that owns
// none of the files the tests make.
const nobody = 65534

// SmallFS mounts a tmpfs of size bytes at a new folder, unmounted when the
// test ends. Where mounting is not allowed (it takes root with
// CAP_SYS_ADMIN) it skips the test, saying why.
func SmallFS(t testing.TB, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("a full disk needs a small file system: mounting a tmpfs at %s failed (%v); it takes root with CAP_SYS_ADMIN", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// AsUnprivileged runs fn with the file-system permissions of user nobody,
// so that permission tests mean something when the tests run as root (root
// passes every permission check on an ordinary file system); as any other
// user it runs fn as is. setfsuid is per thread: fn runs on a locked thread
// that exits with its goroutine, and must do its file operations on that
// goroutine. A root without the capability to change its file-system ids (a
// restricted container) cannot drop them: the test is skipped, saying so.
// fn must not call t.Fatal: on the locked thread it would end fn's goroutine
// before that reports back, and the test would hang.
func AsUnprivileged(t testing.TB, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		fn()
		return
	}
	ok := make(chan bool, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		_ = syscall.Setfsgid(nobody)
		_ = syscall.Setfsuid(nobody)
		// setfsuid reports only the previous id; an invalid id (-1)
		// changes nothing and returns the current one.
		cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0)
		if cur != nobody {
			ok <- false
			return
		}
		fn()
		ok <- true
	}()
	if !<-ok {
		t.Skip("running as root without the capability to change the file-system user id (CAP_SETUID): permission bits cannot be tested")
	}
}
