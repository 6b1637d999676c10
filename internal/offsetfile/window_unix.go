//go:build unix

package offsetfile

import (
	"os"
	"syscall"
)

// canMap: the journal maps its window here (journal.go).
const canMap = true

// mapFile maps f's first n bytes, shared and writable; nil if it cannot,
// and the journal writes with pwrites instead.
func mapFile(f *os.File, n int) []byte {
	b, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil
	}
	return b
}

func unmap(b []byte) error {
	if b == nil {
		return nil
	}
	return syscall.Munmap(b)
}
