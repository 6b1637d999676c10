package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

const importHelp = `
Reads records in the format export writes ("tidemark-offsets", version 1)
from stdin, or from --from PATH, and writes them into FILE, which is created
if missing (its folder must exist). Each imported partition's record is
replaced whole; partitions the input does not list are left as they are;
failure entries are added to those the file has.

The completed ranges (offsets completed above the watermark, which a
restart does not handle again) are part of the record: a partition gets the
completed_ranges its input lists, with its watermark, and none if it lists
none; the file's own ranges for it are replaced either way (and an input
that would lose any of them is refused without --force). When you edit a
watermark in the input by hand, delete that partition's completed_ranges
too: ranges at or below the watermark are refused as invalid, and ranges
above it make the consumer skip those offsets.

A partition's state (a TxHandler's: state_entries, changelog_position,
changelog_outbox) is part of it too: the input's replaces the file's
whole (entries, changelog position and outbox; nothing of the file's is
kept or merged), written in the same transaction as the record, so that
the state and the watermark stay together. A partition the input lists
without a state gets none: if the file holds one for it, that is refused
without --force, as a loss. Partitions the input does not list keep
theirs. Keys and values are base64; one that is not, or is over the
limits of a consumer's state (keys of 1 to 4096 bytes, values up to
1 MiB), is refused with its partition and key.

import refuses, writing nothing:
  - a file in use (a consumer running on it): stop it first;
  - input that is not valid (every value is checked before anything is
    written);
  - a partition that would lose completed offsets, unless --force: an
    offset the file records as done (below its watermark, or in its
    completed ranges) that the input does not (a watermark moved back, or
    completed ranges dropped). The consumer would handle those messages
    again. The line names the partition and how many offsets it would lose;
  - a partition whose state the file holds and the input does not list
    (an export of a build before states, or of a running consumer that
    could not say whether it keeps state), unless --force: the state would
    be dropped.

It prints, per partition, the old and the new watermark and committed
offset. --dry-run prints the same and writes nothing.
`

// maxImport bounds the input import reads.
const maxImport = 1 << 30

// stdin is import's default input; tests replace it.
var stdin io.Reader = os.Stdin

func runImport(args []string, stdout, stderr io.Writer) error {
	f := newFlags("import", "import FILE [--force] [--dry-run] [--from PATH] < offsets.json", importHelp, stderr)
	force := f.Bool("force", false, "import records that lose completed offsets (a watermark moved back, completed ranges dropped) or drop a partition's state")
	dryRun := f.Bool("dry-run", false, "print what would change, write nothing")
	from := f.String("from", "-", "read the JSON from this file instead of stdin")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	path := pos[0]
	fi, err := os.Stat(path)
	exists := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return inputErr(err)
	case fi.IsDir():
		return inputErr(fmt.Errorf("%s: is a directory, not an offset file", path))
	case !fi.Mode().IsRegular():
		return inputErr(fmt.Errorf("%s: not a regular file (%s), not an offset file", path, fileType(fi.Mode())))
	}

	in, err := openInput(*from)
	if err != nil {
		return f.usageErr("%v", err)
	}
	defer in.Close()
	doc, err := readOffsetsDoc(in)
	if err != nil {
		return inputErr(fmt.Errorf("reading %s: %w", inputName(*from), err))
	}
	ims, err := fromOffsetsDoc(doc)
	if err == nil {
		err = validateImport(ims)
	}
	if err != nil {
		return inputErr(fmt.Errorf("%s: %w", inputName(*from), err))
	}

	var st *offsetfile.Store
	switch {
	case *dryRun && !exists:
		// Nothing recorded yet; opening would create it. A 0-byte file is
		// opened, and refused as the import itself would refuse it.
	case *dryRun:
		st, err = offsetfile.Open(path, &offsetfile.Options{ReadOnly: true, Timeout: lockTimeout})
	default:
		st, err = offsetfile.Open(path, &offsetfile.Options{Timeout: lockTimeout})
	}
	if err != nil {
		return inUse(path, err)
	}
	closeStore := func() error {
		if st == nil {
			return nil
		}
		s := st
		st = nil
		return s.Close()
	}
	defer closeStore()

	type step struct {
		im      imported
		cur     offsetfile.Record
		had     bool
		added   []offsetfile.Failure
		skipped int64
		dead    int64
		// state: the input's state replaces the file's (either has one).
		state bool
	}
	var (
		steps        []step
		refused      int
		refusedState int // of refused, those for a state
		counts       = map[string]int{}
		added        int
		states       int
		curStates    map[offsetfile.Key]*offsetfile.StateDump
	)
	if st != nil {
		if curStates, err = st.DumpStates(); err != nil {
			return inputErr(err)
		}
	}
	for _, im := range ims {
		s := step{im: im, cur: offsetfile.Record{Watermark: -1, Committed: -1}}
		curState := curStates[im.key]
		s.state = !curState.Empty() || !im.state.Empty()
		dropped := !curState.Empty() && im.state.Empty()
		sameState := equalStates(curState, im.state)
		stateNote := stateChange(curState, im.state)
		var have []offsetfile.Failure
		if st != nil {
			s.cur, s.had = st.Get(im.key)
			if have, err = st.Failures(im.key); err != nil {
				return inputErr(err)
			}
		}
		known := map[int64]bool{}
		var n [2]int64
		for _, f := range have {
			known[f.Offset] = true
			n[failureSlot(f.Action)]++
		}
		for _, f := range im.failures {
			if !known[f.Offset] {
				s.added = append(s.added, f)
				n[failureSlot(f.Action)]++
			}
		}
		s.skipped, s.dead = max(im.rec.Skipped, n[0]), max(im.rec.DeadLettered, n[1])
		steps = append(steps, s)

		name := fmt.Sprintf("%s/%s/%d", im.key.Group, im.key.Topic, im.key.Partition)
		newDoc := toPartitionDoc(offsetfile.Entry{Key: im.key, Record: withCounts(im.rec, s.skipped, s.dead)}, nil)
		oldDoc := toPartitionDoc(offsetfile.Entry{Key: im.key, Record: s.cur}, nil)
		back := s.had && s.cur.Watermark > im.rec.Watermark
		var lost int64
		if s.had {
			lost = lostOffsets(s.cur, im.rec)
		}
		switch {
		case !s.had && !dropped:
			counts["new"]++
			fmt.Fprintf(stdout, "%s: new: watermark %s, committed %s%s%s\n", name, fmtOffset(im.rec.Watermark), fmtOffset(im.rec.Committed),
				completedChange(nil, im.rec.Completed), stateNote)
		case reflect.DeepEqual(oldDoc, newDoc) && sameState:
			counts["unchanged"]++
			s.state = false // nothing to write
			fmt.Fprintf(stdout, "%s: unchanged: watermark %s, committed %s%s%s\n", name, fmtOffset(im.rec.Watermark), fmtOffset(im.rec.Committed),
				completedChange(nil, im.rec.Completed), stateChange(nil, im.state))
		case back && !*force:
			refused++
			fmt.Fprintf(stdout, "%s: REFUSED: watermark %s -> %s would move back: %s done in the file would be lost (handled again)\n",
				name, fmtOffset(s.cur.Watermark), fmtOffset(im.rec.Watermark), plural(lost, "offset"))
		case lost > 0 && !*force:
			refused++
			fmt.Fprintf(stdout, "%s: REFUSED: %s completed in the file would be lost (handled again): watermark %s -> %s%s\n",
				name, plural(lost, "offset"), fmtOffset(s.cur.Watermark), fmtOffset(im.rec.Watermark),
				completedChange(s.cur.Completed, im.rec.Completed))
		case dropped && !*force:
			refused++
			refusedState++
			fmt.Fprintf(stdout, "%s: REFUSED: the file's state (%s) would be dropped: the input lists none for the partition\n",
				name, stateCounts(curState))
		default:
			counts["changed"]++
			note := ""
			switch {
			case back:
				note = " (moves back: --force)"
			case lost > 0:
				note = fmt.Sprintf(" (loses %s: --force)", plural(lost, "completed offset"))
			case dropped:
				note = " (drops the state: --force)"
			}
			fmt.Fprintf(stdout, "%s: watermark %s -> %s, committed %s -> %s%s%s%s\n", name, fmtOffset(s.cur.Watermark),
				fmtOffset(im.rec.Watermark), fmtOffset(s.cur.Committed), fmtOffset(im.rec.Committed),
				completedChange(s.cur.Completed, im.rec.Completed), stateNote, note)
		}
		if s.state {
			states++
		}
		if len(s.added) > 0 {
			fmt.Fprintf(stdout, "%s: %d failure entries added\n", name, len(s.added))
		}
		added += len(s.added)
	}
	if refused > 0 {
		what := "completed offsets"
		switch refusedState {
		case 0:
		case refused:
			what = "a state"
		default:
			what = "completed offsets or a state"
		}
		return inputErr(fmt.Errorf("import refused, nothing written: %s in %s would lose %s (listed above); --force overwrites them",
			plural(int64(refused), "partition"), path, what))
	}
	summary := fmt.Sprintf("%d partitions: %d new, %d changed, %d unchanged; %d failure entries added",
		len(ims), counts["new"], counts["changed"], counts["unchanged"], added)
	if states > 0 {
		summary += fmt.Sprintf("; the state of %s written whole", plural(int64(states), "partition"))
	}
	if *dryRun {
		fmt.Fprintf(stdout, "dry run, nothing written to %s: %s\n", path, summary)
		return nil
	}
	for _, s := range steps {
		for _, f := range s.added {
			if err := st.RecordFailure(s.im.key, f); err != nil {
				return inputErr(err)
			}
		}
		rec := withCounts(s.im.rec, s.skipped, s.dead)
		if s.state {
			// The record and the state in one transaction.
			err = st.PutState(s.im.key, rec, s.im.state)
		} else {
			err = st.Put(s.im.key, rec)
		}
		if err != nil {
			return inputErr(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Flush(ctx); err != nil {
		return inputErr(err)
	}
	if err := closeStore(); err != nil {
		return inputErr(err)
	}
	fmt.Fprintf(stdout, "imported into %s: %s\n", path, summary)
	return nil
}

// completedChange describes the completed ranges of an imported record,
// and of the file's record it replaces: "" when neither has any.
func completedChange(before, after []offsetfile.Range) string {
	count := func(c []offsetfile.Range) int64 { return completedOffsets(offsetfile.Record{Completed: c}) }
	switch {
	case len(before) == 0 && len(after) == 0:
		return ""
	case len(before) == 0:
		return fmt.Sprintf(", %s completed above the watermark", plural(count(after), "offset"))
	}
	return fmt.Sprintf(", offsets completed above the watermark %s -> %s", inspect.FormatCount(count(before)), inspect.FormatCount(count(after)))
}

// lostOffsets counts the offsets done in cur (below its watermark or in its
// completed ranges) that are not done in next: what replacing cur with next
// would make the consumer handle again.
func lostOffsets(cur, next offsetfile.Record) int64 {
	done := func(r offsetfile.Record) []offsetfile.Range {
		var out []offsetfile.Range
		if r.Watermark > 0 {
			out = append(out, offsetfile.Range{From: 0, To: r.Watermark})
		}
		return append(out, r.Completed...) // sorted, disjoint, above the watermark
	}
	have, keep := done(cur), done(next)
	var lost int64
	j := 0
	for _, h := range have {
		n := h.To - h.From
		for j < len(keep) && keep[j].To <= h.From {
			j++
		}
		for k := j; k < len(keep) && keep[k].From < h.To; k++ {
			n -= min(h.To, keep[k].To) - max(h.From, keep[k].From)
		}
		lost += n
	}
	return lost
}

func withCounts(r offsetfile.Record, skipped, dead int64) offsetfile.Record {
	r.Skipped, r.DeadLettered = skipped, dead
	return r
}

func inputName(from string) string {
	if from == "-" {
		return "stdin"
	}
	return from
}

func openInput(from string) (io.ReadCloser, error) {
	if from == "-" {
		if f, ok := stdin.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&fs.ModeCharDevice != 0 {
				return nil, errors.New("reads the records on stdin, which is a terminal: tidemark import FILE < offsets.json")
			}
		}
		return io.NopCloser(stdin), nil
	}
	fi, err := os.Stat(from)
	switch {
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("--from %s: not a regular file", from)
	}
	return os.Open(from)
}

// readOffsetsDoc decodes one JSON document strictly: no unknown fields,
// nothing after it, at most maxImport bytes.
func readOffsetsDoc(r io.Reader) (*offsetsDoc, error) {
	lr := &io.LimitedReader{R: r, N: maxImport + 1}
	dec := json.NewDecoder(lr)
	dec.DisallowUnknownFields()
	var doc offsetsDoc
	err := dec.Decode(&doc)
	switch {
	case lr.N <= 0:
		return nil, fmt.Errorf("more than %d bytes", maxImport)
	case errors.Is(err, io.EOF):
		return nil, errors.New("no input (want the JSON that tidemark export writes)")
	case err != nil:
		return nil, fmt.Errorf("not a tidemark-offsets document: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the document")
	}
	return &doc, nil
}

// validateImport puts every record into a scratch store, so that the
// store's own rules check them all before anything touches the target.
func validateImport(ims []imported) error {
	dir, err := os.MkdirTemp("", "tidemark-import-check")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := offsetfile.Open(filepath.Join(dir, "check.db"), &offsetfile.Options{NoSync: true})
	if err != nil {
		return err
	}
	defer st.Close()
	for _, im := range ims {
		for _, f := range im.failures {
			if err := st.RecordFailure(im.key, f); err != nil {
				return unwrapFileErr(err)
			}
		}
		if err := st.PutState(im.key, im.rec, im.state); err != nil {
			return unwrapFileErr(err)
		}
	}
	return nil
}

// equalStates reports whether a and b hold the same entries, changelog
// position and outbox; nil is empty.
func equalStates(a, b *offsetfile.StateDump) bool {
	if a.Empty() || b.Empty() {
		return a.Empty() && b.Empty()
	}
	if !slices.EqualFunc(a.Entries, b.Entries, func(x, y offsetfile.StateEntry) bool {
		return bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value)
	}) {
		return false
	}
	if !reflect.DeepEqual(toPositionDoc(a.Changelog), toPositionDoc(b.Changelog)) { // nil markers or none: the same
		return false
	}
	return slices.EqualFunc(a.Outbox, b.Outbox, func(x, y offsetfile.OutboxEntry) bool {
		return x.Seq == y.Seq && x.Offset == y.Offset && x.Delete == y.Delete && bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value)
	})
}

// stateCounts is "3 keys, 40 bytes, 2 unsent changelog changes".
func stateCounts(d *offsetfile.StateDump) string {
	var size int64
	for _, e := range d.Entries {
		size += int64(len(e.Key) + len(e.Value))
	}
	s := plural(int64(len(d.Entries)), "key") + ", " + plural(size, "byte")
	if len(d.Outbox) > 0 {
		s += ", " + plural(int64(len(d.Outbox)), "unsent changelog change")
	}
	return s
}

// stateChange describes the state an import writes: "" when neither the
// file nor the input has one.
func stateChange(before, after *offsetfile.StateDump) string {
	switch {
	case before.Empty() && after.Empty():
		return ""
	case before.Empty():
		return ", state " + stateCounts(after)
	case after.Empty():
		return ", state " + stateCounts(before) + " -> none"
	}
	return fmt.Sprintf(", state %s -> %s", stateCounts(before), stateCounts(after))
}

// unwrapFileErr drops the scratch store's path from a validation error.
func unwrapFileErr(err error) error {
	var fe *offsetfile.FileError
	if errors.As(err, &fe) {
		return fe.Err
	}
	return err
}

// failureSlot is where a failure counts: 0 skipped, 1 dead-lettered.
func failureSlot(a offsetfile.FailureAction) int {
	if a == offsetfile.FailureDeadLetter {
		return 1
	}
	return 0
}
