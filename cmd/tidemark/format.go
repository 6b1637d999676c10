package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// timeLayout shows times in UTC, to the millisecond.
const timeLayout = "2006-01-02 15:04:05.000Z"

// fmtTime formats t for tables: UTC, or "-" when zero.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}

// fmtOffset formats a "next offset" position: "-" for none (-1).
func fmtOffset(o int64) string {
	if o < 0 {
		return "-"
	}
	return fmt.Sprint(o)
}

// table writes aligned columns.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() { _ = t.tw.Flush() }

// writeJSON writes v as indented JSON, with each array of two integers (a
// completed range) on one line.
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(joinPairs(b.Bytes()))
	return err
}

// joinPairs puts every array of two integers of indented JSON on one line:
// [1, 2]. Text inside strings is left alone.
func joinPairs(b []byte) []byte {
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[':
			if x, y, n := pairAt(b[i:]); n > 0 {
				out = append(out, '[')
				out = append(out, x...)
				out = append(out, ',', ' ')
				out = append(out, y...)
				out = append(out, ']')
				i += n - 1
				continue
			}
		}
		out = append(out, c)
	}
	return out
}

// pairAt matches an array of two integers at the start of b, and returns
// them and the length of the match; n is 0 if there is none.
func pairAt(b []byte) (x, y []byte, n int) {
	i := 1
	space := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\n') {
			i++
		}
	}
	number := func() []byte {
		start := i
		if i < len(b) && b[i] == '-' {
			i++
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start || b[i-1] == '-' {
			return nil
		}
		return b[start:i]
	}
	space()
	if x = number(); x == nil {
		return nil, nil, 0
	}
	space()
	if i >= len(b) || b[i] != ',' {
		return nil, nil, 0
	}
	i++
	space()
	if y = number(); y == nil {
		return nil, nil, 0
	}
	space()
	if i >= len(b) || b[i] != ']' {
		return nil, nil, 0
	}
	return x, y, i + 1
}
