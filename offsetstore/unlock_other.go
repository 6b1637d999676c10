//go:build !unix

package offsetstore

import "os"

// unlockFile is a no-op here: bbolt's lock goes with the file handle.
func unlockFile(*os.File) {}
