//go:build !unix

package offsetfile

import (
	"os"
	"time"
)

// unlockFile is a no-op here: bbolt's lock goes with the file handle.
func unlockFile(*os.File) {}

// lockShared is a no-op here: Salvage reads without the lock.
func lockShared(*os.File, time.Duration) error { return nil }
