//go:build unix

package offsetstore

import (
	"os"
	"syscall"
)

// unlockFile drops bbolt's flock on f. Closing f alone does not when bbolt
// has mapped it: the mapping keeps the open file, and its lock, alive.
func unlockFile(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
