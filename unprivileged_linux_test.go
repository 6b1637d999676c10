package tidemark_test

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

const nobody = 65534

// asUnprivileged runs fn with the file-system permissions of user nobody,
// so that permission tests mean something when the tests run as root
// (root passes every permission check on an ordinary file system). setfsuid
// is per thread: fn runs on a locked thread that exits with its goroutine,
// and must do its file operations on that goroutine. A root without the
// capability to change its file-system ids (a restricted container) cannot
// drop them: the test is skipped, saying so. fn must not call t.Fatal.
func asUnprivileged(t *testing.T, fn func()) {
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
