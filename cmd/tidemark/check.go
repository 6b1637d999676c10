package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

const checkHelp = `
Checks the offset file without writing to it: a bounds-checked walk of every
page of bbolt's tree (page types, element bounds, key order, the freelist,
pages reached twice or neither reachable nor free) and then bbolt's own
structural check, the schema version, a strict decoding of every record and
failure entry (value encoding versions 1 and 2), the invariants between
them, and the journal beside the file (FILE.journal: what a consumer wrote
since its last fsync-ed checkpoint, left by a crash; the next open applies
it). A consumer runs the same checks when it opens the file.

Findings have a severity:
  error    the file is damaged: a page or a value is unreadable, or the
           file is truncated or has 0 bytes; a consumer refuses to open it
           (recover with export --salvage and import, see tidemark help
           export). Or a whole journal entry does not decode: the file is
           sound, and moving the journal aside opens it as of its last
           checkpoint
  warning  the file opens but holds what the framework never writes:
           failure counts that disagree with the failure entries, failure
           entries without a record, unknown buckets or keys
  info     worth knowing, not wrong: a run left open (unclean shutdown), a
           crash loop, a failed last commit, Kafka's last confirmed commit
           ahead of the watermark (a reset or a repair moved it back: the
           next start resumes at Kafka's committed offset if it is still
           ahead), times in the future, journal entries the next open
           applies, a journal ending in a partial entry (a crash of the
           machine mid-write; ignored)

Exit status 1 when there is an error or a warning, 0 otherwise. check needs
the file's (shared) lock, so it refuses a file a consumer holds (exit 2):
stop the consumer, or use inspect, which works while it runs. A consumer
that starts while check runs waits for the lock (1s by default) and then
fails to start: check a stopped service.
`

func runCheck(args []string, stdout, stderr io.Writer) error {
	f := newFlags("check", "check FILE [--json]", checkHelp, stderr)
	asJSON := f.Bool("json", false, "print JSON")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	path := pos[0]
	if err := preflight(path); err != nil {
		return err
	}
	rep, err := offsetfile.Check(path, &offsetfile.Options{Timeout: lockTimeout})
	if err != nil {
		return inUse(path, err)
	}
	if *asJSON {
		if err := writeJSON(stdout, checkDoc(rep)); err != nil {
			return err
		}
	} else {
		printCheck(stdout, rep)
	}
	if rep.Worst() >= offsetfile.SeverityWarning {
		n := 0
		for _, f := range rep.Findings {
			if f.Severity >= offsetfile.SeverityWarning {
				n++
			}
		}
		return findingErr("%s: %d findings", path, n)
	}
	return nil
}

func encodings(rep *offsetfile.CheckReport) string {
	var vs []byte
	total := 0
	for v, n := range rep.Records {
		vs = append(vs, v)
		total += n
	}
	slices.Sort(vs)
	var parts []string
	for _, v := range vs {
		parts = append(parts, fmt.Sprintf("%d in v%d", rep.Records[v], v))
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (value encoding: %s)", total, strings.Join(parts, ", "))
}

func printCheck(w io.Writer, rep *offsetfile.CheckReport) {
	fmt.Fprintf(w, "file      %s\n", rep.Path)
	fmt.Fprintf(w, "bbolt     %d bytes, page size %d, transaction %d\n", rep.Size, rep.PageSize, rep.TxID)
	if rep.SchemaVersion != 0 {
		fmt.Fprintf(w, "schema    version %d\n", rep.SchemaVersion)
	}
	fmt.Fprintf(w, "records   %s\n", encodings(rep))
	fmt.Fprintf(w, "failures  %d entries\n", rep.FailureEntries)
	if rep.JournalEntries > 0 {
		fmt.Fprintf(w, "journal   %d entries newer than the last checkpoint\n", rep.JournalEntries)
	}
	if rep.StateEntries > 0 {
		fmt.Fprintf(w, "state     %d entries (a TxHandler's)\n", rep.StateEntries)
	}
	if len(rep.Findings) == 0 {
		fmt.Fprintln(w, "findings  none: the file is sound")
		return
	}
	counts := map[offsetfile.Severity]int{}
	for _, f := range rep.Findings {
		counts[f.Severity]++
	}
	fmt.Fprintf(w, "findings  %d errors, %d warnings, %d info\n", counts[offsetfile.SeverityError],
		counts[offsetfile.SeverityWarning], counts[offsetfile.SeverityInfo])
	for _, f := range rep.Findings {
		fmt.Fprintf(w, "  %s\n", f)
	}
}

type checkJSON struct {
	File           string         `json:"file"`
	Size           int64          `json:"size"`
	PageSize       uint32         `json:"page_size"`
	TxID           uint64         `json:"txid"`
	SchemaVersion  uint32         `json:"schema_version"`
	Records        map[string]int `json:"records"` // by value encoding version: "v1", "v2"
	FailureEntries int            `json:"failure_entries"`
	JournalEntries int            `json:"journal_entries"`
	StateEntries   int            `json:"state_entries"`
	Findings       []findingJSON  `json:"findings"`
	Worst          string         `json:"worst,omitempty"`
}

type findingJSON struct {
	Severity  string `json:"severity"`
	Group     string `json:"group,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition *int32 `json:"partition,omitempty"`
	Message   string `json:"message"`
}

func checkDoc(rep *offsetfile.CheckReport) checkJSON {
	d := checkJSON{File: rep.Path, Size: rep.Size, PageSize: rep.PageSize, TxID: rep.TxID, SchemaVersion: rep.SchemaVersion,
		Records: map[string]int{}, FailureEntries: rep.FailureEntries, JournalEntries: rep.JournalEntries, StateEntries: rep.StateEntries,
		Findings: []findingJSON{}}
	for v, n := range rep.Records {
		d.Records[fmt.Sprintf("v%d", v)] = n
	}
	if w := rep.Worst(); w != 0 {
		d.Worst = w.String()
	}
	for _, f := range rep.Findings {
		fj := findingJSON{Severity: f.Severity.String(), Message: f.Message}
		if f.Key != nil {
			p := f.Key.Partition
			fj.Group, fj.Topic, fj.Partition = f.Key.Group, f.Key.Topic, &p
		}
		d.Findings = append(d.Findings, fj)
	}
	return d
}
