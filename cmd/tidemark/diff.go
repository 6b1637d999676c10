package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/reconcile"
	"github.com/tidemark/tidemark/internal/wire"
)

const diffHelp = `
Compares, per partition, the offset file's watermark (LOCAL, the next offset
the consumer handles) with the group's committed offset in Kafka (KAFKA) and
the log's bounds (LOG-START, LOG-END), asked of the brokers with Metadata,
ListOffsets, FindCoordinator and OffsetFetch. LAG is LOG-END - LOCAL: messages still to handle.
LOCAL-AHEAD is LOCAL - KAFKA when positive: commits still to reconcile
(normal for up to a commit interval while the consumer runs, and after a
commit outage; the consumer commits LOCAL at its next start).

NEXT says where the consumer resumes at its next start, decided by the
code the consumer runs (its reconciliation) from LOCAL, KAFKA, the log's
bounds and the last commit the file saw Kafka confirm (CONFIRMED, in
--json); give the consumer's Config.OutOfRange, Config.StartOffset and
Config.IsolationLevel with --out-of-range, --start-offset and
--read-committed when they are not the defaults.

Findings (exit status 1):
  reset at next start       KAFKA is missing or below CONFIRMED: the topic
                            was recreated, or the group's offsets were
                            reset, deleted or expired. The next start resets
                            (to KAFKA, or by the OutOfRange policy) and
                            handles the offsets from there to LOCAL again;
                            the finding says how many.
  stall at next start       the same, with OutOfRange stall: the partition
                            stalls until an operator decides (tidemark set,
                            or Kafka's committed offset).
  local beyond log end      LOCAL > LOG-END: the topic was recreated, or the
                            file comes from another cluster. The next start
                            resets by the OutOfRange policy (or stalls).
  local below log start     LOCAL < LOG-START: retention deleted messages
                            before they were handled.
  committed beyond log end  KAFKA > LOG-END.
  committed below log start KAFKA < LOG-START (retention): a consumer
                            without this file would reset.
  not in the cluster        the topic or the partition does not exist.
  commit pending too long   with --max-pending D: LOCAL > KAFKA, and either
                            LOCAL was recorded more than D ago (nobody is
                            committing it: the consumer is stopped or
                            stuck), or commits are failing (the last attempt
                            failed, or the running consumer reports a
                            commit error) and the last confirmed commit is
                            more than D old.
Not findings: KAFKA ahead of LOCAL (another member went further; the
consumer resumes at KAFKA), no committed offset in Kafka, LOCAL-AHEAD within
--max-pending.

It works on a running consumer too (the file's durable records come from the
consumer's live snapshot) and never writes the file. Exit status 2 when the
brokers cannot be reached.
`

func runDiff(args []string, stdout, stderr io.Writer) error {
	f := newFlags("diff", "diff FILE --brokers HOST:PORT[,...] [--group G] [--topic T] [--max-pending D] [--out-of-range P] [--start-offset S] [--read-committed] [--json]", diffHelp, stderr)
	brokers := f.String("brokers", "", "bootstrap brokers, host:port[,host:port...] (required)")
	group := f.String("group", "", "compare only this consumer group")
	topic := f.String("topic", "", "compare only this topic")
	timeout := f.Duration("timeout", 10*time.Second, "bound on the whole exchange with the brokers")
	maxPending := f.Duration("max-pending", 0, "a commit pending for longer than this is a finding (0: never)")
	asJSON := f.Bool("json", false, "print JSON")
	outOfRange := f.String("out-of-range", "earliest", "the consumer's Config.OutOfRange: earliest, latest or stall")
	startOffset := f.String("start-offset", "first", "the consumer's Config.StartOffset: first or last")
	readCommitted := f.Bool("read-committed", false, "the consumer's Config.IsolationLevel is kafka.ReadCommitted: its latest position is the last stable offset")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	if *brokers == "" {
		return f.usageErr("--brokers is required")
	}
	if *timeout <= 0 || *maxPending < 0 {
		return f.usageErr("--timeout must be positive and --max-pending not negative")
	}
	pol := policy{maxPending: *maxPending, readCommitted: *readCommitted}
	switch *outOfRange {
	case "earliest", "reset-to-earliest":
		pol.outOfRange = reconcile.ResetToEarliest
	case "latest", "reset-to-latest":
		pol.outOfRange = reconcile.ResetToLatest
	case "stall":
		pol.outOfRange = reconcile.Stall
	default:
		return f.usageErr("--out-of-range must be earliest, latest or stall, not %q", *outOfRange)
	}
	switch *startOffset {
	case "first":
	case "last":
		pol.startLatest = true
	default:
		return f.usageErr("--start-offset must be first or last, not %q", *startOffset)
	}
	addrs := strings.Split(*brokers, ",")
	src, err := load(pos[0], want{})
	if err != nil {
		return err
	}
	var entries []offsetfile.Entry
	for _, e := range src.records {
		if (*group == "" || e.Group == *group) && (*topic == "" || e.Topic == *topic) {
			entries = append(entries, e)
		}
	}
	if len(entries) == 0 {
		if *group != "" || *topic != "" {
			return inputErr(fmt.Errorf("%s: no partition of group %q topic %q (groups in the file: %q)", src.path, *group, *topic, groupsOf(src)))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cl := wire.NewClient(addrs, wire.Options{ClientID: "tidemark-cli", Timeout: *timeout})
	defer cl.Close()
	failing := map[offsetfile.Key]bool{}
	for _, e := range entries {
		failing[e.Key] = e.LastCommit != nil && e.LastCommit.Outcome != offsetfile.CommitOK
	}
	if src.live != nil {
		for _, p := range src.live.Stats.Partitions {
			if p.CommitError != "" {
				failing[offsetfile.Key{Group: src.live.Stats.Group, Topic: p.Topic, Partition: int32(p.Partition)}] = true
			}
		}
	}
	rows, err := diffRows(ctx, &asker{cl: cl, timeout: *timeout}, entries, failing, pol)
	if err != nil {
		return inputErr(fmt.Errorf("asking Kafka at %s: %w", *brokers, err))
	}
	findings := 0
	for _, r := range rows {
		findings += len(r.Findings)
	}
	doc := diffJSON{File: src.path, Source: "file", How: src.how, Brokers: addrs, Partitions: rows, Findings: findings}
	if src.live != nil {
		doc.Source = "live"
	}
	if *asJSON {
		if err := writeJSON(stdout, doc); err != nil {
			return err
		}
	} else {
		printDiff(stdout, &doc)
	}
	if findings > 0 {
		return findingErr("%s: %d findings", src.path, findings)
	}
	return nil
}

type diffJSON struct {
	File       string    `json:"file"`
	Source     string    `json:"source"` // "live" or "file"
	How        string    `json:"how"`
	Brokers    []string  `json:"brokers"`
	Partitions []diffRow `json:"partitions"`
	Findings   int       `json:"findings"`
}

// diffRow is one partition. Offsets are -1 when unknown.
type diffRow struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Local     int64  `json:"local"`
	Kafka     int64  `json:"kafka_committed"`
	LogStart  int64  `json:"log_start"`
	LogEnd    int64  `json:"log_end"`
	// LogStable is the last stable offset: the log end at read_committed.
	LogStable  int64 `json:"log_stable"`
	Lag        int64 `json:"lag"`         // LOG-END - LOCAL; -1 when unknown
	LocalAhead int64 `json:"local_ahead"` // LOCAL - KAFKA when positive, else 0
	// Confirmed is the last commit the file saw Kafka confirm.
	Confirmed int64 `json:"confirmed"`
	// Next is what the next start does: "resume", "reset" or "stall";
	// "" when the log's bounds are unknown. NextStart is where it resumes
	// (-1 on a stall or unknown), HandledAgain how many offsets below
	// LOCAL it handles again, Skipped how many above it it skips;
	// CompletedAgain how many offsets the file records as completed above
	// LOCAL it handles again (its completed ranges are not restored after a
	// reset, nor when it resumes elsewhere than LOCAL).
	Next           string   `json:"next"`
	NextStart      int64    `json:"next_start"`
	HandledAgain   int64    `json:"handled_again"`
	Skipped        int64    `json:"skipped"`
	CompletedAgain int64    `json:"completed_again"`
	Status         string   `json:"status"`
	Findings       []string `json:"findings"`
	Notes          []string `json:"notes"`

	recordedAt    time.Time
	committedAt   time.Time // the last confirmed commit, as the file knows it
	commitFailing bool
	completed     []offsetfile.Range // the file's completed ranges above LOCAL
}

// policy is what judge needs of the consumer's configuration and the
// command's flags.
type policy struct {
	maxPending    time.Duration
	outOfRange    reconcile.Policy
	startLatest   bool
	readCommitted bool
}

func diffRows(ctx context.Context, ask *asker, entries []offsetfile.Entry, failing map[offsetfile.Key]bool, pol policy) ([]diffRow, error) {
	topics := map[string][]int32{}
	groups := map[string]map[string][]int32{}
	for _, e := range entries {
		if !slices.Contains(topics[e.Topic], e.Partition) {
			topics[e.Topic] = append(topics[e.Topic], e.Partition)
		}
		if groups[e.Group] == nil {
			groups[e.Group] = map[string][]int32{}
		}
		groups[e.Group][e.Topic] = append(groups[e.Group][e.Topic], e.Partition)
	}
	v, err := ask.view(ctx, topics, groups)
	if err != nil {
		return nil, err
	}
	bounds, missing, committed := v.bounds, v.missing, v.committed

	var rows []diffRow
	for _, e := range entries {
		k := tp{e.Topic, e.Partition}
		r := diffRow{Group: e.Group, Topic: e.Topic, Partition: e.Partition, Local: e.Watermark, Kafka: -1,
			LogStart: -1, LogEnd: -1, LogStable: -1, Lag: -1, Confirmed: max(e.Committed, -1), NextStart: -1, Findings: []string{}, Notes: []string{},
			recordedAt: e.RecordedAt, committedAt: e.CommittedAt, commitFailing: failing[e.Key], completed: e.Completed}
		if c, ok := committed[gtp{e.Group, k}]; ok && c >= 0 {
			r.Kafka = c
		}
		if why, ok := missing[k]; ok {
			r.Findings = append(r.Findings, "not in the cluster: "+why)
		} else if b, ok := bounds[k]; ok {
			r.LogStart, r.LogEnd, r.LogStable = b.first, b.last, b.stable
		}
		judge(&r, pol)
		rows = append(rows, r)
	}
	return rows, nil
}

// judge fills the row's lag, prediction, findings, notes and status; see
// diffHelp.
func judge(r *diffRow, pol policy) {
	maxPending := pol.maxPending
	known := r.LogEnd >= 0
	status := []string{}
	// What the next start does, from the consumer's own decision. Its
	// latest position is the last stable offset at read_committed, the log
	// end otherwise.
	var d reconcile.Decision
	if known {
		stable := r.LogEnd
		if pol.readCommitted {
			stable = r.LogStable
		}
		d = reconcile.Decide(reconcile.Input{Local: r.Local, Confirmed: r.Confirmed, Kafka: r.Kafka,
			First: r.LogStart, Last: r.LogEnd, Stable: stable, StartLatest: pol.startLatest, OutOfRange: pol.outOfRange})
		switch {
		case d.Stall != nil:
			r.Next = "stall"
		case d.Reset():
			r.Next, r.NextStart = "reset", d.Start
		default:
			r.Next, r.NextStart = "resume", d.Start
		}
		if d.Reset() && d.Stall == nil && r.Local >= 0 {
			// Only offsets the log holds are handled again.
			r.HandledAgain = max(min(r.Local, r.LogEnd)-r.NextStart, 0)
			r.Skipped = max(r.NextStart-r.Local, 0)
		}
		if d.Stall == nil && !d.Restore {
			for _, rg := range r.completed {
				r.CompletedAgain += max(min(rg.To, r.LogEnd)-max(rg.From, r.NextStart), 0)
			}
		}
	}
	movedBack := known && d.Case == reconcile.MovedBack
	if movedBack {
		// Not a commit to make: Kafka lost or moved back below what it
		// confirmed, and the next start resets or stalls.
		if d.Stall != nil {
			r.Findings = append(r.Findings, fmt.Sprintf("stall at next start: %s; with OutOfRange %s the partition stalls: "+
				"set its watermark (tidemark set) or Kafka's committed offset", d.Stall.Reason, pol.outOfRange))
		} else {
			r.Findings = append(r.Findings, fmt.Sprintf("reset at next start: %s; the consumer resumes at %d%s",
				d.Resets[len(d.Resets)-1].Reason, d.Start, again(r)))
		}
	}
	if known && r.Local >= 0 {
		r.Lag = max(r.LogEnd-r.Local, 0)
		next := ""
		if !movedBack {
			next = "; " + nextStart(r, d, pol)
		}
		switch {
		case r.Local > r.LogEnd:
			r.Findings = append(r.Findings, fmt.Sprintf("local beyond log end: watermark %d > log end %d (topic recreated, or a file from another cluster)%s", r.Local, r.LogEnd, next))
		case r.Local < r.LogStart:
			r.Findings = append(r.Findings, fmt.Sprintf("local below log start: retention deleted offsets %d to %d before they were handled%s", r.Local, r.LogStart-1, next))
		}
	}
	if known && r.Kafka >= 0 {
		switch {
		case r.Kafka > r.LogEnd:
			r.Findings = append(r.Findings, fmt.Sprintf("committed beyond log end: Kafka's committed offset %d > log end %d", r.Kafka, r.LogEnd))
		case r.Kafka < r.LogStart:
			r.Findings = append(r.Findings, fmt.Sprintf("committed below log start: Kafka's committed offset %d < log start %d (retention)", r.Kafka, r.LogStart))
		}
	}
	// Commits to reconcile matter only where the local watermark is in the
	// log: elsewhere the findings above say what the next start does.
	inLog := known && r.Local >= r.LogStart && r.Local <= r.LogEnd
	switch {
	case r.Local < 0:
		r.Notes = append(r.Notes, "no local watermark recorded")
	case movedBack:
	case r.Kafka < 0:
		r.LocalAhead = r.Local
		r.Notes = append(r.Notes, "no committed offset in Kafka: the consumer commits its watermark at its next commit")
	case r.Local > r.Kafka:
		r.LocalAhead = r.Local - r.Kafka
		since := ""
		if !r.recordedAt.IsZero() {
			since = ", watermark recorded " + fmtTime(r.recordedAt)
		}
		r.Notes = append(r.Notes, fmt.Sprintf("commit pending: local is %d ahead of Kafka%s; the consumer commits it at its next commit or start", r.LocalAhead, since))
	case r.Kafka > r.Local:
		r.Notes = append(r.Notes, fmt.Sprintf("Kafka ahead by %d: another member went further; the consumer resumes at Kafka's offset", r.Kafka-r.Local))
		if inLog {
			status = append(status, "kafka ahead")
		}
	}
	if known {
		r.Notes = append(r.Notes, nextStart(r, d, pol))
	}
	if r.LocalAhead > 0 && inLog {
		status = append(status, "commit pending")
		switch {
		case maxPending <= 0:
		case !r.recordedAt.IsZero() && now().Sub(r.recordedAt) > maxPending:
			r.Findings = append(r.Findings, fmt.Sprintf("commit pending too long: watermark recorded %s, more than %v ago, and not committed", fmtTime(r.recordedAt), maxPending))
		case r.commitFailing && (r.committedAt.IsZero() || now().Sub(r.committedAt) > maxPending):
			last := "never"
			if !r.committedAt.IsZero() {
				last = fmtTime(r.committedAt)
			}
			r.Findings = append(r.Findings, fmt.Sprintf("commit pending too long: commits are failing, last confirmed commit %s, more than %v ago", last, maxPending))
		}
	}
	for _, f := range r.Findings {
		label, _, _ := strings.Cut(f, ":")
		status = append(status, strings.ToUpper(label))
	}
	if len(status) == 0 {
		status = append(status, "in sync")
	}
	r.Status = join(status)
}

// nextStart says what the next start does with the row's partition.
func nextStart(r *diffRow, d reconcile.Decision, pol policy) string {
	switch {
	case d.Stall != nil:
		return fmt.Sprintf("the next start stalls the partition (OutOfRange %s)", pol.outOfRange)
	case d.Reset():
		return fmt.Sprintf("the next start resets to %d (OutOfRange %s)%s", d.Start, pol.outOfRange, again(r))
	}
	return fmt.Sprintf("the next start resumes at %d%s", d.Start, completedAgain(r))
}

// again says which offsets below its watermark the row's partition handles
// again at its next start, or above it skips, and which of those the file
// records as completed above it are handled again.
func again(r *diffRow) string {
	var s string
	switch {
	case r.HandledAgain > 0:
		unless := ""
		if r.Kafka < 0 || r.Local > r.LogEnd {
			unless = " (unless the topic was recreated: then they are new)"
		}
		s = fmt.Sprintf(" and handles offsets %d to %d again: %s%s", r.NextStart, r.NextStart+r.HandledAgain-1,
			plural(r.HandledAgain, "message"), unless)
	case r.Skipped > 0:
		s = fmt.Sprintf(" and skips offsets %d to %d: %s not handled", r.Local, r.NextStart-1, plural(r.Skipped, "message"))
	}
	if r.CompletedAgain > 0 {
		s += completedAgain(r)
	}
	return s
}

// completedAgain says how many offsets completed above the watermark the
// next start handles again, if any.
func completedAgain(r *diffRow) string {
	if r.CompletedAgain == 0 {
		return ""
	}
	return fmt.Sprintf("; the %s completed above the watermark are handled again too (the file's completed ranges are restored only when it resumes at its watermark)",
		plural(r.CompletedAgain, "offset"))
}

func printDiff(w io.Writer, d *diffJSON) {
	fmt.Fprintf(w, "%s: %s\n", d.File, d.How)
	fmt.Fprintf(w, "kafka: %s\n", strings.Join(d.Brokers, ","))
	if len(d.Partitions) == 0 {
		fmt.Fprintln(w, "\nno partitions recorded yet")
		return
	}
	rows := d.Partitions
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].Group == rows[i].Group && rows[j].Topic == rows[i].Topic {
			j++
		}
		fmt.Fprintf(w, "\ngroup %s  topic %s\n", rows[i].Group, rows[i].Topic)
		t := newTable(w, "PARTITION", "LOCAL", "KAFKA", "LOG-START", "LOG-END", "LAG", "LOCAL-AHEAD", "STATUS")
		var notes []string
		for _, r := range rows[i:j] {
			ahead := "-"
			if r.LocalAhead > 0 && r.LogEnd >= 0 {
				ahead = fmt.Sprintf("+%d", r.LocalAhead)
			}
			lag := "-"
			if r.Lag >= 0 {
				lag = fmt.Sprint(r.Lag)
			}
			t.row(fmt.Sprint(r.Partition), fmtOffset(r.Local), fmtOffset(r.Kafka), fmtOffset(r.LogStart), fmtOffset(r.LogEnd), lag, ahead, r.Status)
			for _, f := range r.Findings {
				notes = append(notes, fmt.Sprintf("  partition %d: FINDING %s", r.Partition, f))
			}
		}
		t.flush()
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
		i = j
	}
	if d.Findings > 0 {
		fmt.Fprintf(w, "\n%d findings\n", d.Findings)
	} else {
		fmt.Fprintln(w, "\nno findings")
	}
}
