package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

const exportHelp = `
Writes every record of the offset file, with its failure entries and its
partition's state, as JSON to stdout: the format "tidemark-offsets",
version 1, that import reads. Use it to move a service to a new host:

  tidemark export /var/lib/billing/offsets.db > offsets.json    (old host)
  tidemark import /var/lib/billing/offsets.db < offsets.json    (new host)

A record's completed ranges (offsets completed above its watermark) are
exported with it, as completed_ranges, when it has any; a tidemark built
before they existed refuses to import such a document (unknown field).

A partition's state (a TxHandler's key-value state), when it has one, is
exported with its record, since it is consistent only with the watermark
written with it: state_entries (keys and values in base64), and with a
StateChangelog the changelog_position and the changelog_outbox (changes
in the state the changelog has not acknowledged yet, which the new host
still sends). A tidemark built before states refuses to import such a
document (unknown field). A state the file holds for a partition without
a record is not exported; stderr names it.

Like inspect, it works on a running consumer (from its live snapshot of the
durable records) and never writes the file; stop the consumer before the
export that moves it, or the consumer goes on past what was exported. A
running consumer serves the sizes of its states, not their entries: export
refuses a consumer that keeps state in the partitions it exports, or that
does not answer whether it does (stop it, and export the file). A consumer
built before the state sizes cannot say: stderr notes that the export
carries no state.

A damaged file (check reports an error; a consumer refuses to open it) is
refused; --salvage exports what can still be read of it, reading the pages
itself rather than through bbolt, and lists on stderr what it could not
read (exit 1 when there is any). It exports a partition's state only when
it read it whole: a part of a state is not consistent with the watermark.
A partition whose state it leaves out is named; its record is exported, and
its state must be restored from the changelog or rebuilt (docs/state.md):

  tidemark export --salvage offsets.db > offsets.json
  mv offsets.db offsets.db.damaged
  tidemark import offsets.db < offsets.json
`

// now is the clock of export; tests fix it.
var now = time.Now

func runExport(args []string, stdout, stderr io.Writer) error {
	f := newFlags("export", "export FILE > offsets.json", exportHelp, stderr)
	group := f.String("group", "", "export only this consumer group")
	salvage := f.Bool("salvage", false, "export what can be read of a damaged file, and list what cannot")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	var (
		src      *source
		problems []string
	)
	if *salvage {
		src, problems, err = loadSalvage(pos[0])
	} else {
		src, err = load(pos[0], want{failures: true, states: true})
	}
	if err != nil {
		return err
	}
	entries := src.records
	if *group != "" {
		entries = entries[:0:0]
		for _, e := range src.records {
			if e.Group == *group {
				entries = append(entries, e)
			}
		}
		if len(entries) == 0 {
			return inputErr(fmt.Errorf("%s: no record of group %q (groups in the file: %q)", src.path, *group, groupsOf(src)))
		}
	}
	if src.live != nil {
		if err := liveState(src, *group, stderr); err != nil {
			return err
		}
	} else {
		unexportedState(src, entries, *group, stderr)
	}
	doc := toOffsetsDoc(entries, src.failures, src.states)
	doc.Source, doc.ExportedAt = src.path, now().UTC()
	if src.live != nil {
		fmt.Fprintf(stderr, "tidemark export: %s is in use: exported the durable records of the running consumer (pid %d); it goes on past them\n",
			src.path, src.live.Pid)
	}
	if err := writeJSON(stdout, doc); err != nil {
		return err
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "tidemark export: %s: exported %d records; could not read:\n", src.path, len(entries))
		for _, p := range problems {
			fmt.Fprintf(stderr, "  %s\n", p)
		}
		return findingErr("%s: %s; the records, failure entries and states they held are not in the export", src.path, plural(int64(len(problems)), "problem"))
	}
	return nil
}

// liveState checks that a running consumer keeps no state in the
// partitions a live export carries, which cannot carry their states (the
// consumer serves their sizes, not their entries): it refuses a consumer
// that keeps some, or that could not say, rather than lose the state
// unseen. A consumer built before the state sizes cannot say at all:
// stderr notes that the export carries no state.
func liveState(src *source, group string, stderr io.Writer) error {
	pid := src.live.Pid
	switch err := src.sizesErr; {
	case errors.Is(err, inspect.ErrStateNotServed):
		fmt.Fprintf(stderr, "tidemark export: %s: the export carries no state (a TxHandler's): the consumer running as pid %d does not say whether it keeps any (a build from before state sizes); if it does, stop it and export the file\n",
			src.path, pid)
		return nil
	case err != nil:
		return inputErr(fmt.Errorf("%s is in use by the consumer running as pid %d, which did not say whether it keeps state (a TxHandler's), which a live export cannot carry: %v; stop it and export the file",
			src.path, pid, err))
	}
	var with []string
	for _, sz := range src.sizes {
		if (group == "" || sz.Group == group) && (sz.Keys > 0 || sz.Outbox > 0 || sz.Changelog != nil) {
			with = append(with, fmt.Sprintf("%s/%s/%d", sz.Group, sz.Topic, sz.Partition))
		}
	}
	if len(with) == 0 {
		return nil
	}
	n := len(with)
	if n > 5 {
		with = append(with[:5], fmt.Sprintf("and %d more", n-5))
	}
	return inputErr(fmt.Errorf("%s is in use by the consumer running as pid %d, which keeps state (a TxHandler's) in %s (%s); a live export cannot carry it: stop the consumer and export the file",
		src.path, pid, plural(int64(n), "partition"), strings.Join(with, ", ")))
}

// unexportedState names on stderr the states the file holds for
// partitions without a record: the document has no place for them.
func unexportedState(src *source, entries []offsetfile.Entry, group string, stderr io.Writer) {
	have := map[offsetfile.Key]bool{}
	for _, e := range entries {
		have[e.Key] = true
	}
	var orphans []offsetfile.Key
	for k := range src.states {
		if (group == "" || k.Group == group) && !have[k] {
			orphans = append(orphans, k)
		}
	}
	slices.SortFunc(orphans, compareKeys)
	for _, k := range orphans {
		fmt.Fprintf(stderr, "tidemark export: %s: group %q topic %q partition %d has a state (%s) but no record: not exported\n",
			src.path, k.Group, k.Topic, k.Partition, plural(int64(len(src.states[k].Entries)), "key"))
	}
}
