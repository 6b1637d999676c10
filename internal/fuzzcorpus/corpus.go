package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

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
	dir := filepath.Join(c.root, pkg, "testdata", "fuzz", fuzz)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c.written++
	return os.WriteFile(filepath.Join(dir, c.source+"-"+name), []byte(b.String()), 0o644)
}
