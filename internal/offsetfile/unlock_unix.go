//go:build unix

package offsetfile

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// unlockFile drops bbolt's flock on f. Closing f alone does not when bbolt
// has mapped it: the mapping keeps the open file, and its lock, alive.
func unlockFile(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

// lockShared takes the shared flock on f that a read-only bbolt.Open
// takes, retrying for at most timeout; closing f drops it. For Salvage,
// which reads files bbolt cannot open.
func lockShared(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return err
		case time.Now().After(deadline):
			holder := ""
			if pid := lockHolder(f.Name()); pid > 0 {
				holder = fmt.Sprintf("pid %d holds its lock; ", pid)
			}
			return &detailError{sentinel: ErrInUse, msg: fmt.Sprintf("%v (%slock not acquired within %v)", ErrInUse, holder, timeout)}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
