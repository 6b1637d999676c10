package main

import (
	"fmt"
	"io"
	"time"
)

const exportHelp = `
Writes every record of the offset file, with its failure entries, as JSON to
stdout: the format "tidemark-offsets", version 1, that import reads. Use it
to move a service to a new host:

  tidemark export /var/lib/billing/offsets.db > offsets.json    (old host)
  tidemark import /var/lib/billing/offsets.db < offsets.json    (new host)

A record's completed ranges (offsets completed above its watermark) are
exported with it, as completed_ranges, when it has any; a tidemark built
before they existed refuses to import such a document (unknown field).

Like inspect, it works on a running consumer (from its live snapshot of the
durable records) and never writes the file; stop the consumer before the
export that moves it, or the consumer goes on past what was exported.

A damaged file (check reports an error; a consumer refuses to open it) is
refused; --salvage exports what can still be read of it, reading the pages
itself rather than through bbolt, and lists on stderr what it could not
read (exit 1 when there is any):

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
		src, err = load(pos[0], true)
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
	doc := toOffsetsDoc(entries, src.failures)
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
		return findingErr("%s: %s; the records and failure entries they held are not in the export", src.path, plural(int64(len(problems)), "problem"))
	}
	return nil
}
