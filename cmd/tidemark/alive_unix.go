//go:build unix

package main

import (
	"errors"
	"syscall"
)

// processAlive reports whether a process with this pid exists; known is
// false when that cannot be told.
func processAlive(pid int) (alive, known bool) {
	if pid <= 0 {
		return false, true
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM), true
}
