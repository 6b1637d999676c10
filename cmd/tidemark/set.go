package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

const setHelp = `
Offline repair: sets one partition's watermark (the next offset the consumer
handles) in the offset file, and prints the old and the new record. The
partition's other fields are kept; the record is marked as recorded now by
member "tidemark-set". A partition the file has no record of is refused
unless --create. It refuses a file in use (a consumer running on it)
and a file that is not a tidemark offset file. --dry-run prints the same and
writes nothing.

The record's completed ranges (offsets completed above the old watermark,
which a restart would not handle again) are cleared: a watermark set by hand
says nothing about the offsets above it, so the consumer handles every
offset from the new watermark on. The old ranges are printed.

The record's confirmed commit (the last offset the file saw Kafka confirm)
is cleared too: the watermark set by hand is the position from now on, and
a Kafka offset below the old confirmed one (an operator's rewind, which
stalls a consumer with OutOfRange Stall) no longer reads as moved back. On
its next start the consumer compares this watermark with Kafka's committed
offset and resumes at the greater one, committing it: so set undoes a rewind
(--offset the old watermark) or accepts it (--offset Kafka's offset). To
resume below Kafka's committed offset, reset the group's offset in Kafka as
well. The confirmed commit is recorded again at the consumer's next
confirmed commit.
`

// setMember is the member recorded by set.
const setMember = "tidemark-set"

func runSet(args []string, stdout, stderr io.Writer) error {
	f := newFlags("set", "set FILE --group G --topic T --partition P --offset N [--dry-run] [--create]", setHelp, stderr)
	group := f.String("group", "", "consumer group (required)")
	topic := f.String("topic", "", "topic (required)")
	partition := f.Int("partition", -1, "partition (required)")
	offset := f.Int64("offset", -1, "the new watermark: the next offset to handle (required)")
	dryRun := f.Bool("dry-run", false, "print the change, write nothing")
	create := f.Bool("create", false, "add a record for a partition the file does not have")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	switch {
	case *group == "":
		return f.usageErr("--group is required")
	case *topic == "":
		return f.usageErr("--topic is required")
	case *partition < 0 || *partition > 1<<31-1:
		return f.usageErr("--partition is required, 0 or more")
	case *offset < 0:
		return f.usageErr("--offset is required, 0 or more")
	}
	path := pos[0]
	if err := preflight(path); err != nil {
		return err
	}
	st, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: *dryRun, Timeout: lockTimeout})
	if err != nil {
		return inUse(path, err)
	}
	defer st.Close()

	k := offsetfile.Key{Group: *group, Topic: *topic, Partition: int32(*partition)}
	old, had := st.Get(k)
	if !had && !*create {
		var known []string
		for _, e := range st.Records() {
			if gt := e.Group + "/" + e.Topic; !slices.Contains(known, gt) {
				known = append(known, gt)
			}
		}
		return inputErr(fmt.Errorf("%s has no record of group %q topic %q partition %d (it has %q); --create adds one",
			path, k.Group, k.Topic, k.Partition, known))
	}
	rec := old
	rec.Watermark, rec.RecordedAt, rec.Member = *offset, now(), setMember
	rec.Completed = nil // they went with the old watermark
	// What Kafka confirmed describes the old position: kept, a Kafka offset
	// below it would read as moved back at the next start, and stall (or
	// reset) the partition set meant to repair.
	rec.Committed, rec.CommittedAt = -1, time.Time{}
	name := fmt.Sprintf("%s/%s/%d", k.Group, k.Topic, k.Partition)
	if had {
		fmt.Fprintf(stdout, "%s\n  old: %s\n", name, describe(old))
	} else {
		fmt.Fprintf(stdout, "%s\n  old: none (the file has no record of this partition)\n", name)
	}
	fmt.Fprintf(stdout, "  new: %s\n", describe(rec))
	if old.Committed > *offset {
		fmt.Fprintf(stdout, "note: Kafka's committed offset, as the file last knew it, is %d: unless it is reset in Kafka too, the consumer resumes there, not at %d\n",
			old.Committed, *offset)
	}
	if old.Committed >= 0 {
		fmt.Fprintf(stdout, "note: the confirmed commit %d is cleared: at its next start the consumer resumes at the greater of %d and Kafka's committed offset, and commits it\n",
			old.Committed, *offset)
	}
	if len(old.Completed) > 0 {
		fmt.Fprintf(stdout, "note: the offsets completed above the old watermark are cleared (%s): the consumer handles every offset from %d on\n",
			completedCounts(old), *offset)
	}
	if *dryRun {
		fmt.Fprintln(stdout, "dry run: nothing written")
		return nil
	}
	if err := st.Put(k, rec); err != nil {
		return inputErr(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Flush(ctx); err != nil {
		return inputErr(err)
	}
	if err := st.Close(); err != nil {
		return inputErr(err)
	}
	fmt.Fprintf(stdout, "written to %s\n", path)
	return nil
}

func describe(r offsetfile.Record) string {
	member := r.Member
	if member == "" {
		member = "-"
	}
	return fmt.Sprintf("watermark %s (recorded %s, generation %d, member %s), committed %s",
		fmtOffset(r.Watermark), fmtTime(r.RecordedAt), r.Generation, member, fmtOffset(r.Committed))
}
