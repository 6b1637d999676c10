package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

const inspectHelp = `
Shows the offset file: a table per group and topic with, per partition, the
local watermark (next offset to process), the last offset committed to Kafka
as the file knows it, when the watermark was recorded, by which generation
and member, and the state.

While a consumer runs on FILE, the durable records and the consumer's live
state (processed offset, lag, running/retrying/paused/...) come from the
consumer itself, over the socket named in FILE.inspect. Otherwise the file is
opened read-only. It is never written, and inspect gives up after about
2.5 seconds.

A partition whose consumer completes messages out of order has a line
under the table with the offsets completed above its watermark (recorded
with it, and not handled again after a restart): how many, in how many
ranges, and the highest; --json lists them as completed_ranges
[[from, to], ...] (to excluded) with their count, completed_offsets.

A table whose partitions keep a state (a TxHandler's key-value state, in
the file) has its size in two more columns: STATE-KEYS, and STATE-BYTES,
the bytes of its keys and values; with a StateChangelog, two more:
CHANGELOG-NEXT, the changelog offset after the last change the changelog
acknowledged, and UNSENT, the changes in the state it has not acknowledged
yet (the outbox, which the consumer sends). A partition whose changelog
had another writer in between (a gap) has a line under the table: its
next owner restores the state from the changelog. --json has them as
state_size, with the whole changelog position. The sizes come from the
state's pages, not its values: they cost a walk of its pages and keys. A
running consumer serves them if its build does; inspect says when it does
not, and shows no state columns.

States: clean (nothing pending), unclean shutdown (the run holding the
partition did not release it: crash, SIGKILL), crash loop, pending commit
(the watermark is ahead of the last commit), last commit fenced/error/unknown,
skipped N and dead-lettered N (messages the failure policy gave up on), and
the live states of a running consumer (running, retrying, paused, stalled,
reconciling, draining, revoked).
`

func runInspect(args []string, stdout, stderr io.Writer) error {
	f := newFlags("inspect", "inspect FILE [--group G] [--topic T] [--json]", inspectHelp, stderr)
	group := f.String("group", "", "show only this consumer group")
	topic := f.String("topic", "", "show only this topic")
	asJSON := f.Bool("json", false, "print JSON instead of tables")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	src, err := load(pos[0], want{sizes: true})
	if err != nil {
		return err
	}
	rows := inspectRows(src, *group, *topic)
	if len(rows) == 0 && (*group != "" || *topic != "") {
		return inputErr(fmt.Errorf("%s: no partition of group %q topic %q (groups in the file: %q)", src.path, *group, *topic, groupsOf(src)))
	}
	if *asJSON {
		return writeJSON(stdout, inspectDoc(src, rows))
	}
	printInspect(stdout, src, rows)
	return nil
}

// inspectRow is one partition: its record, its live state, or both, and
// the size of its state if it has one.
type inspectRow struct {
	key  offsetfile.Key
	rec  *offsetfile.Record
	live *framework.PartitionStats
	size *offsetfile.StateSize
}

func inspectRows(src *source, group, topic string) []inspectRow {
	byKey := map[offsetfile.Key]*inspectRow{}
	var rows []*inspectRow
	add := func(k offsetfile.Key) *inspectRow {
		if r := byKey[k]; r != nil {
			return r
		}
		r := &inspectRow{key: k}
		byKey[k] = r
		rows = append(rows, r)
		return r
	}
	for i := range src.records {
		e := &src.records[i]
		add(e.Key).rec = &e.Record
	}
	if src.live != nil {
		for i := range src.live.Stats.Partitions {
			p := &src.live.Stats.Partitions[i]
			add(offsetfile.Key{Group: src.live.Stats.Group, Topic: p.Topic, Partition: int32(p.Partition)}).live = p
		}
	}
	for i := range src.sizes {
		sz := &src.sizes[i]
		add(sz.Key).size = sz
	}
	var out []inspectRow
	for _, r := range rows {
		if (group == "" || r.key.Group == group) && (topic == "" || r.key.Topic == topic) {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b inspectRow) int { return compareKeys(a.key, b.key) })
	return out
}

func groupsOf(src *source) []string {
	var gs []string
	for _, e := range src.records {
		if !slices.Contains(gs, e.Group) {
			gs = append(gs, e.Group)
		}
	}
	return gs
}

// states describes a partition; see inspectHelp.
func states(rec *offsetfile.Record, live *framework.PartitionStats) []string {
	var s []string
	owned := live != nil && live.State != framework.StateRevoked
	if live != nil {
		s = append(s, string(live.State))
		if live.Paused && live.State != framework.StatePaused {
			s = append(s, "paused")
		}
		if live.InFlight > 0 || live.Waiting > 0 {
			s = append(s, fmt.Sprintf("%d in flight, %d waiting", live.InFlight, live.Waiting))
		}
		if live.CompletedAhead > 0 {
			s = append(s, fmt.Sprintf("%d completed above the watermark", live.CompletedAhead))
		}
		if live.OldestIncomplete >= 0 && live.OldestAge >= time.Second {
			s = append(s, fmt.Sprintf("offset %d incomplete for %s", live.OldestIncomplete, live.OldestAge.Round(time.Second)))
		}
		if live.WindowFull {
			s = append(s, "window full (MaxWindow): taking no new message")
		}
		if live.DurableWait {
			s = append(s, "waiting for the offset file (MaxUndurable)")
		}
	}
	if rec != nil {
		if rec.Run != nil && rec.Run.Open && !owned {
			s = append(s, "unclean shutdown")
		}
		if rec.Run != nil && rec.Run.Crashes > 0 {
			s = append(s, fmt.Sprintf("crash loop (%d at offset %d)", rec.Run.Crashes, rec.Run.Inflight))
		}
		switch {
		case rec.Watermark < 0:
		case rec.Committed < 0:
			s = append(s, "pending commit (none yet)")
		case rec.Watermark > rec.Committed:
			s = append(s, fmt.Sprintf("pending commit (+%d)", rec.Watermark-rec.Committed))
		}
		if lc := rec.LastCommit; lc != nil && lc.Outcome != offsetfile.CommitOK {
			s = append(s, "last commit "+lc.Outcome.String())
		}
		if rec.Skipped > 0 {
			s = append(s, fmt.Sprintf("skipped %d", rec.Skipped))
		}
		if rec.DeadLettered > 0 {
			s = append(s, fmt.Sprintf("dead-lettered %d", rec.DeadLettered))
		}
	}
	if len(s) == 0 {
		s = append(s, "clean")
	}
	return s
}

// details are the lines under a table that do not fit in it.
func details(r inspectRow) []string {
	var d []string
	if rec := r.rec; rec != nil {
		if c := completedSummary(*rec); c != "" {
			d = append(d, c)
		}
		if rs := rec.LastReset; rs != nil {
			d = append(d, fmt.Sprintf("last reset %s: %s -> %d: %s", fmtTime(rs.At), fmtOffset(rs.From), rs.To, rs.Reason))
		}
		if lc := rec.LastCommit; lc != nil && lc.Outcome != offsetfile.CommitOK {
			line := fmt.Sprintf("last commit %s: offset %d, generation %d, %s after %v", fmtTime(lc.At), lc.Offset, lc.Generation, lc.Outcome, lc.Latency)
			if lc.Error != "" {
				line += ": " + lc.Error
			}
			d = append(d, line)
		}
		if run := rec.Run; run != nil && run.Crashes > 0 {
			d = append(d, fmt.Sprintf("crash loop: %d unclean ends in a row while handling offset %d", run.Crashes, run.Inflight))
		}
	}
	if sz := r.size; sz != nil && sz.Changelog != nil && sz.Changelog.Gap {
		d = append(d, "changelog gap: another writer wrote to the changelog since this file's last acknowledged change; the next owner restores the state from the changelog")
	}
	if l := r.live; l != nil {
		if l.Attempts > 0 {
			d = append(d, fmt.Sprintf("retrying offset %d, attempt %d", l.Processed, l.Attempts))
		}
		if l.LastError != "" {
			d = append(d, "last error: "+l.LastError)
		}
		if l.PanicStack != "" {
			d = append(d, "panic stack:\n    "+strings.ReplaceAll(strings.TrimRight(l.PanicStack, "\n"), "\n", "\n    "))
		}
		if l.CommitError != "" {
			d = append(d, "commit error: "+l.CommitError)
		}
		if l.TransactionWait > 0 {
			d = append(d, fmt.Sprintf("held at the last stable offset %d (log end %d) by an open transaction for %s",
				l.LastStable, l.HighWatermark, l.TransactionWait.Round(time.Millisecond)))
		} else if l.LastStable >= 0 && l.LastStable < l.HighWatermark {
			d = append(d, fmt.Sprintf("last stable offset %d (log end %d): read_committed hands out nothing at or above it", l.LastStable, l.HighWatermark))
		}
	}
	return d
}

// membership says which group protocol the consumer speaks and where it
// is in it: the generation (classic), or the member epoch (consumer).
func membership(s framework.Stats) string {
	switch s.GroupProtocol {
	case framework.GroupProtocolConsumer:
		return fmt.Sprintf("protocol consumer (KIP-848), member epoch %d", s.MemberEpoch)
	case "":
		return fmt.Sprintf("generation %d", s.Generation) // a consumer from before the field
	default:
		return fmt.Sprintf("protocol %s, generation %d", s.GroupProtocol, s.Generation)
	}
}

func printInspect(w io.Writer, src *source, rows []inspectRow) {
	fmt.Fprintf(w, "%s: %s\n", src.path, src.how)
	if l := src.live; l != nil {
		member := l.Stats.Member
		if member == "" {
			member = "none (not a member now)"
		}
		fmt.Fprintf(w, "consumer: group %s, topics %v, %s, member %s; snapshot taken %s\n",
			l.Stats.Group, l.Topics, membership(l.Stats), member, fmtTime(l.TakenAt))
		if e := l.Stats.OffsetFileError; e != "" {
			fmt.Fprintf(w, "offset file: its last write failed: %s\n", e)
		}
		if m := l.Stats.MissingTopics; len(m) > 0 {
			fmt.Fprintf(w, "missing topics: %v do not exist: nothing of them is consumed until they are created\n", m)
		}
		if s := l.Stats; s.LostUncommitted+s.RevokedUncommitted+s.HandoffOmitted > 0 {
			fmt.Fprintf(w, "handed on uncommitted: %d messages in partitions lost, %d in partitions revoked whose final commit failed, %d completed offsets the final commits could not carry: their next owners may handle them again\n",
				s.LostUncommitted, s.RevokedUncommitted, s.HandoffOmitted)
		}
	}
	if why := noSizes(src); why != "" {
		fmt.Fprintf(w, "state sizes: not shown: %s\n", why)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "\nno partitions recorded yet")
		return
	}
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].key.Group == rows[i].key.Group && rows[j].key.Topic == rows[i].key.Topic {
			j++
		}
		fmt.Fprintf(w, "\ngroup %s  topic %s\n", rows[i].key.Group, rows[i].key.Topic)
		header := []string{"PARTITION", "WATERMARK", "COMMITTED", "RECORDED", "GEN", "MEMBER"}
		if src.live != nil {
			header = append(header, "PROCESSED", "LAG")
		}
		// The state columns, only in a table with a state.
		var withState, withChangelog bool
		for _, r := range rows[i:j] {
			if sz := r.size; sz != nil {
				withState = true
				withChangelog = withChangelog || sz.Changelog != nil || sz.Outbox >= 0
			}
		}
		if withState {
			header = append(header, "STATE-KEYS", "STATE-BYTES")
		}
		if withChangelog {
			header = append(header, "CHANGELOG-NEXT", "UNSENT")
		}
		t := newTable(w, append(header, "STATE")...)
		var notes []string
		for _, r := range rows[i:j] {
			cells := []string{fmt.Sprint(r.key.Partition), "-", "-", "-", "-", "-"}
			if rec := r.rec; rec != nil {
				member := rec.Member
				if member == "" {
					member = "-"
				}
				cells = []string{fmt.Sprint(r.key.Partition), fmtOffset(rec.Watermark), fmtOffset(rec.Committed),
					fmtTime(rec.RecordedAt), fmt.Sprint(rec.Generation), member}
			}
			if src.live != nil {
				if r.live != nil {
					cells = append(cells, fmtOffset(r.live.Processed), fmt.Sprint(r.live.Lag))
				} else {
					cells = append(cells, "-", "-")
				}
			}
			if withState {
				cells = append(cells, stateCells(r.size, withChangelog)...)
			}
			t.row(append(cells, join(states(r.rec, r.live)))...)
			for _, d := range details(r) {
				notes = append(notes, fmt.Sprintf("  partition %d: %s", r.key.Partition, clip(d)))
			}
		}
		t.flush()
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
		i = j
	}
}

// clip shortens each line of a detail for the terminal; --json has it
// whole.
func clip(s string) string {
	const max = 160
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if r := []rune(l); len(r) > max {
			lines[i] = string(r[:max]) + "..."
		}
	}
	return strings.Join(lines, "\n")
}

func join(s []string) string { return strings.Join(s, ", ") }

// inspectJSON is inspect's --json document.
type inspectJSON struct {
	File       string    `json:"file"`
	Source     string    `json:"source"` // "live" or "file"
	How        string    `json:"how"`
	Pid        int       `json:"pid,omitempty"`
	Started    time.Time `json:"started,omitzero"`
	TakenAt    time.Time `json:"taken_at,omitzero"`
	Group      string    `json:"group,omitempty"` // the running consumer's
	Topics     []string  `json:"topics,omitempty"`
	Generation int32     `json:"generation,omitempty"`
	Member     string    `json:"member,omitempty"`
	// GroupProtocol is the running consumer's: "classic", or "consumer"
	// (KIP-848), whose member epoch MemberEpoch is.
	GroupProtocol string `json:"group_protocol,omitempty"`
	MemberEpoch   int32  `json:"member_epoch,omitempty"`
	// NoStateSizes says why the partitions have no state_size: the
	// running consumer did not send them (a build from before them, or an
	// error).
	NoStateSizes string            `json:"no_state_sizes,omitempty"`
	Partitions   []inspectPartJSON `json:"partitions"`
}

type inspectPartJSON struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Record is the file's record, flattened; absent for a partition the
	// consumer owns but has not recorded yet.
	*partitionDoc
	// CompletedOffsets counts the offsets in the record's completed_ranges.
	CompletedOffsets int64    `json:"completed_offsets,omitempty"`
	State            []string `json:"state"`
	// Live is the consumer's framework.PartitionStats, every field.
	Live *framework.PartitionStats `json:"live,omitempty"`
	// StateSize is the partition's state in the file; absent without one.
	StateSize *stateSizeDoc `json:"state_size,omitempty"`
}

// stateSizeDoc is an offsetfile.StateSize.
type stateSizeDoc struct {
	Keys              int64        `json:"keys"`
	Bytes             int64        `json:"bytes"`
	ChangelogPosition *positionDoc `json:"changelog_position,omitempty"`
	// OutboxEntries counts the changes the changelog has not acknowledged;
	// absent without a changelog.
	OutboxEntries *int64 `json:"outbox_entries,omitempty"`
}

func toStateSizeDoc(sz *offsetfile.StateSize) *stateSizeDoc {
	if sz == nil {
		return nil
	}
	d := &stateSizeDoc{Keys: sz.Keys, Bytes: sz.Bytes, ChangelogPosition: toPositionDoc(sz.Changelog)}
	if sz.Outbox >= 0 {
		n := sz.Outbox
		d.OutboxEntries = &n
	}
	return d
}

// stateCells are a partition's state columns: its keys and their bytes,
// then, in a table with a changelog, its next changelog offset and its
// unsent changes; "-" for what it has none of.
func stateCells(sz *offsetfile.StateSize, changelog bool) []string {
	c := []string{"-", "-", "-", "-"}
	if sz != nil {
		c[0], c[1] = inspect.FormatCount(sz.Keys), inspect.FormatCount(sz.Bytes)
		if p := sz.Changelog; p != nil {
			c[2] = fmt.Sprint(p.Next)
		}
		if sz.Outbox >= 0 {
			c[3] = inspect.FormatCount(sz.Outbox)
		}
	}
	if !changelog {
		return c[:2]
	}
	return c
}

// noSizes says why a running consumer sent no state sizes; "" when it
// did, or when they were read from the file.
func noSizes(src *source) string {
	switch err := src.sizesErr; {
	case err == nil:
		return ""
	case errors.Is(err, inspect.ErrStateNotServed):
		return fmt.Sprintf("the consumer running as pid %d does not serve them (a build from before them)", src.live.Pid)
	default:
		return fmt.Sprintf("the consumer running as pid %d did not send them: %v", src.live.Pid, err)
	}
}

func inspectDoc(src *source, rows []inspectRow) inspectJSON {
	doc := inspectJSON{File: src.path, Source: "file", How: src.how, NoStateSizes: noSizes(src), Partitions: []inspectPartJSON{}}
	if l := src.live; l != nil {
		doc.Source, doc.Pid, doc.Started, doc.TakenAt = "live", l.Pid, utc(l.Started), utc(l.TakenAt)
		doc.Group, doc.Topics, doc.Generation, doc.Member = l.Stats.Group, l.Topics, l.Stats.Generation, l.Stats.Member
		doc.GroupProtocol, doc.MemberEpoch = l.Stats.GroupProtocol, l.Stats.MemberEpoch
	}
	for _, r := range rows {
		p := inspectPartJSON{Group: r.key.Group, Topic: r.key.Topic, Partition: r.key.Partition, State: states(r.rec, r.live), Live: r.live,
			StateSize: toStateSizeDoc(r.size)}
		if r.rec != nil {
			d := toPartitionDoc(offsetfile.Entry{Key: r.key, Record: *r.rec}, nil)
			p.partitionDoc = &d
			p.CompletedOffsets = completedOffsets(*r.rec)
		}
		doc.Partitions = append(doc.Partitions, p)
	}
	return doc
}
