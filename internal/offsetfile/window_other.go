//go:build !unix

package offsetfile

import "os"

// canMap: the journal writes every entry with a pwrite here (journal.go).
const canMap = false

func mapFile(*os.File, int) []byte { return nil }

func unmap([]byte) error { return nil }
