package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tidemark/tidemark/framework"
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
	src, err := load(pos[0], false)
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

// inspectRow is one partition: its record, its live state, or both.
type inspectRow struct {
	key  offsetfile.Key
	rec  *offsetfile.Record
	live *framework.PartitionStats
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
	GroupProtocol string            `json:"group_protocol,omitempty"`
	MemberEpoch   int32             `json:"member_epoch,omitempty"`
	Partitions    []inspectPartJSON `json:"partitions"`
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
}

func inspectDoc(src *source, rows []inspectRow) inspectJSON {
	doc := inspectJSON{File: src.path, Source: "file", How: src.how, Partitions: []inspectPartJSON{}}
	if l := src.live; l != nil {
		doc.Source, doc.Pid, doc.Started, doc.TakenAt = "live", l.Pid, utc(l.Started), utc(l.TakenAt)
		doc.Group, doc.Topics, doc.Generation, doc.Member = l.Stats.Group, l.Topics, l.Stats.Generation, l.Stats.Member
		doc.GroupProtocol, doc.MemberEpoch = l.Stats.GroupProtocol, l.Stats.MemberEpoch
	}
	for _, r := range rows {
		p := inspectPartJSON{Group: r.key.Group, Topic: r.key.Topic, Partition: r.key.Partition, State: states(r.rec, r.live), Live: r.live}
		if r.rec != nil {
			d := toPartitionDoc(offsetfile.Entry{Key: r.key, Record: *r.rec}, nil)
			p.partitionDoc = &d
			p.CompletedOffsets = completedOffsets(*r.rec)
		}
		doc.Partitions = append(doc.Partitions, p)
	}
	return doc
}
