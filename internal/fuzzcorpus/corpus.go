package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// targets are the fuzz tests this program writes entries for, by package.
var targets = map[string][]string{
	"framework":           {"FuzzNextBatch", "FuzzBatchRecords", "FuzzReadCommitted", "FuzzDecodeSubscription"},
	"internal/wire":       {"FuzzResponses"},
	"internal/offsetfile": {"FuzzDecodeRecord"},
}

// clear removes this source's entries of an earlier run, so that what a run
// no longer writes does not linger.
func (c *capture) clear() error {
	for pkg, fuzzes := range targets {
		for _, fuzz := range fuzzes {
			old, err := filepath.Glob(filepath.Join(c.root, pkg, "testdata", "fuzz", fuzz, c.source+"-*"))
			if err != nil {
				return err
			}
			for _, f := range old {
				if err := os.Remove(f); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// write stores one corpus entry of fuzz test fuzz in package pkg (a path
// from the root), in the "go test fuzz v1" format: one Go literal per
// argument, in the fuzz function's order.
func (c *capture) write(pkg, fuzz, name string, args ...any) error {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case int16:
			fmt.Fprintf(&b, "int16(%d)\n", v)
		case int32:
			fmt.Fprintf(&b, "int32(%d)\n", v)
		case int64:
			fmt.Fprintf(&b, "int64(%d)\n", v)
		default:
			return fmt.Errorf("corpus %s/%s: argument of type %T", fuzz, name, a)
		}
	}
	if !slices.Contains(targets[pkg], fuzz) {
		return fmt.Errorf("corpus %s/%s: not in targets", pkg, fuzz)
	}
	dir := filepath.Join(c.root, pkg, "testdata", "fuzz", fuzz)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c.written++
	return os.WriteFile(filepath.Join(dir, c.source+"-"+name), []byte(b.String()), 0o644)
}
