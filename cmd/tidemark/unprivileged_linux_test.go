package main

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

const nobody = 65534

// asUnprivileged runs fn with the file-system permissions of user nobody,
// so that permission tests mean something when the tests run as root (see
// offsetstore/unprivileged_linux_test.go). fn must not call t.Fatal.
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
