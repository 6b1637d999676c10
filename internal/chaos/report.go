package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/tidemark/tidemark/framework"
)

// Report holds a run's figures and every broken promise.
type Report struct {
	// Filled by Run.
	Broker     string
	Seed       uint64
	Duration   time.Duration
	Consumers  int
	Partitions int
	Rate       int
	Mix        Mix
	Static     bool // static group membership (Config.Static)
	// GroupProtocol is the consumers' group protocol (Config.GroupProtocol).
	GroupProtocol string
	// State: the consumers kept state (Config.State); StatesChecked
	// counts the files' partitions whose counters were held to the log.
	State         bool
	StatesChecked int
	Keys          int // keys per partition with OrderKey (Config.Keys); 0: OrderPartition
	Dir           string
	// CaughtUp is how many partitions had Kafka's committed offset at the
	// log end after the consumers stopped.
	CaughtUp int
	// Elapsed is the whole run: faults, drain and check.
	Elapsed time.Duration

	// Produced is what the producer had acknowledged; InLog the final log
	// size (more if the producer retried a write that had landed:
	// LogDuplicates).
	Produced, InLog, LogDuplicates int64
	// Markers counts the transaction markers in the log; TxnCommitted,
	// TxnAborted and TxnUnknown the transactional producer's records by
	// what became of their transaction.
	Markers                              int64
	TxnCommitted, TxnAborted, TxnUnknown int64
	// BrokerAborted counts records of transactions the producer was told
	// were committed that the broker's log aborts (no read_committed
	// consumer may handle them); BrokerCommitted the reverse. Neither is
	// tidemark's broken promise: the consumers are checked against the
	// log. BrokerExamples names some of them.
	BrokerAborted, BrokerCommitted int64
	BrokerExamples                 []string
	// Txns counts the transactions the producer ended, TxnErrors those
	// that failed (aborted, or of unknown outcome).
	Txns, TxnErrors int
	// Consumed counts distinct offsets handled; Handled every handling.
	// Expected counts the offsets that must be handled: the log but its
	// markers, aborted records and records of unknown outcome.
	Consumed, Handled, Expected int64
	// Duplicates per cause; their sum is Handled - Consumed.
	Duplicates map[Cause]int64
	// SigkillBound sums, over every SIGKILL, the offsets the killed process
	// had handled at or above Kafka's committed offset: the most a SIGKILL
	// may cause to be handled again. Unflushed sums those above its offset
	// file's durable watermark (the un-flushed tail). SigkillDurable counts
	// SIGKILL duplicates that were durable in the killed instance's file
	// (handled again by another instance, resuming from Kafka's commit).
	SigkillBound, Unflushed, SigkillDurable int64
	// RestoredBelowFile counts, with State, the handlings below the
	// process's own file watermark at its start that the changelog
	// explains: another owner's marker had landed after the file's last
	// acknowledged write before the process handled the partition, so the
	// file's state was not the changelog's and the partition resumed from
	// Kafka's committed offset. Each is a duplicate too, judged as every
	// other.
	RestoredBelowFile int64
	// FaultBound sums, per fault kind other than SIGKILL, over every
	// hand-off a fault of that kind excused, the offsets the previous
	// owner had handled at or above Kafka's committed offset when the next
	// owner began: the most those hand-offs may repeat.
	FaultBound map[Cause]int64
	// Handoffs counts partition moves between processes; CleanHandoffs
	// those with no fault on the previous owner or the broker near them:
	// none of these may repeat anything.
	Handoffs, CleanHandoffs int
	// HandoffCauses classifies every hand-off like a duplicate there would
	// be (graceful = clean).
	HandoffCauses map[Cause]int
	// Faults counts the faults injected, per kind; Kills the processes
	// killed.
	Faults map[Kind]int
	Kills  int
	// Planned counts the faults the schedule drew, per kind (filled by
	// Run); Applied sums Fault.Applied per kind: the requests (and, for
	// resets, connections) Reset, CommitDelay and CommitError faults acted
	// on.
	Planned, Applied map[Kind]int
	// Torn counts ledger lines cut short.
	Torn int

	// Violations: count per kind, and up to maxExamples examples each.
	Violations map[string]int64
	Examples   map[string][]string
}

const maxExamples = 8

func newReport() *Report {
	return &Report{
		Duplicates:    map[Cause]int64{},
		FaultBound:    map[Cause]int64{},
		HandoffCauses: map[Cause]int{},
		Faults:        map[Kind]int{},
		Applied:       map[Kind]int{},
		Violations:    map[string]int64{},
		Examples:      map[string][]string{},
	}
}

func (r *Report) violate(kind, format string, args ...any) {
	r.Violations[kind]++
	if len(r.Examples[kind]) < maxExamples {
		r.Examples[kind] = append(r.Examples[kind], fmt.Sprintf(format, args...))
	}
}

func (r *Report) brokerAborted(where string) {
	r.BrokerAborted++
	r.brokerExample("committed by the producer, aborted in the log: " + where)
}

func (r *Report) brokerCommitted(where string) {
	r.BrokerCommitted++
	r.brokerExample("aborted by the producer, committed in the log: " + where)
}

func (r *Report) brokerExample(s string) {
	if len(r.BrokerExamples) < maxExamples {
		r.BrokerExamples = append(r.BrokerExamples, s)
	}
}

// Lost is the number of offsets in the log that no one handled.
func (r *Report) Lost() int64 { return r.Violations[VLost] }

// DuplicatesTotal is the number of handlings beyond the first of an
// offset.
func (r *Report) DuplicatesTotal() int64 {
	var n int64
	for _, d := range r.Duplicates {
		n += d
	}
	return n
}

// Failed reports whether a promise was broken.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// violationOrder lists the violation kinds in the order the table shows
// them.
var violationOrder = []string{
	VLost, VGraceful, VSameProcess, VBackwards, VBelowCommitted, VBelowOwnFile, VSigkillBound, VFaultBound, VFaultWindow,
	VCommitDecreased, VCommitBeyondEnd, VFileBeyondEnd, VValue, VBeyondEnd, VCrashDuplicate,
	VConsumerCrashed, VGracefulStopFail, VBrokerLost, VAborted, VMarker, VState,
}

// WriteTable prints the figures, the faults and the promises checked.
func (r *Report) WriteTable(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("tidemark chaos: broker %s, seed %d, faults for %s, %d consumers (%s), %d partitions, %d msg/s, %s", r.Broker, r.Seed, r.Duration, r.Consumers, membership(r.Static, r.GroupProtocol), r.Partitions, r.Rate, ordering(r.Keys)+stateful(r.State))
	p("  mix %s", r.Mix)
	p("")
	p("  %-34s %10d", "produced (acknowledged)", r.Produced)
	p("  %-34s %10d%s", "in the log", r.InLog, ifNonZero(r.LogDuplicates, "  (%d written twice by producer retries)"))
	if r.Txns > 0 || r.Markers > 0 {
		p("  %-34s %10d   committed %d, aborted %d, unknown %d (records); %d markers in the log; %d transactions failed",
			"transactions (read_committed)", r.Txns, r.TxnCommitted, r.TxnAborted, r.TxnUnknown, r.Markers, r.TxnErrors)
		if r.BrokerAborted+r.BrokerCommitted > 0 {
			p("  %-34s %10d   the broker's log decides, not the producer (not a tidemark promise)",
				"transaction outcomes changed", r.BrokerAborted+r.BrokerCommitted)
			for _, e := range r.BrokerExamples {
				p("  %34s   %s", "", e)
			}
		}
	}
	p("  %-34s %10d   of %d to handle", "consumed (distinct offsets)", r.Consumed, r.Expected)
	p("  %-34s %10d", "handled (all calls)", r.Handled)
	p("  %-34s %10d   must be 0", "lost", r.Lost())
	p("  %-34s %10d", "duplicates", r.DuplicatesTotal())
	for _, c := range Causes {
		d := r.Duplicates[c]
		note := ""
		switch c {
		case Cause(SIGKILL):
			note = fmt.Sprintf("   bound %d (handled by killed processes above Kafka's commit); %d above their file's durable watermark; %d re-handled from the file's durable range by others",
				r.SigkillBound, r.Unflushed, r.SigkillDurable)
		case Cause(BrokerRestart), Cause(Blackhole), Cause(Reset), Cause(CommitDelay), Cause(CommitError), Cause(Latency):
			if d > 0 || r.FaultBound[c] > 0 {
				note = fmt.Sprintf("   bound %d (handled by the previous owners above Kafka's commit at the hand-off)", r.FaultBound[c])
			}
		case CauseGraceful:
			note = fmt.Sprintf("   must be 0 (%d of %d hand-offs were clean)", r.CleanHandoffs, r.Handoffs)
		case CauseSameProcess, CauseCrash:
			note = "   must be 0"
		}
		p("    %-32s %10d%s", c, d, note)
	}
	if r.State {
		p("  %-34s %10d   from Kafka's commit, below the process's own file watermark at its start (another owner's marker followed the file's last changelog write)",
			"re-handled after a restore", r.RestoredBelowFile)
	}
	var hs []string
	for _, c := range Causes {
		if n := r.HandoffCauses[c]; n > 0 {
			hs = append(hs, fmt.Sprintf("%s %d", c, n))
		}
	}
	p("  %-34s %10d   %s", "hand-offs between processes", r.Handoffs, strings.Join(hs, ", "))
	var fs []string
	total := 0
	for _, k := range Kinds {
		fs = append(fs, fmt.Sprintf("%s %d", k, r.Faults[k]))
		total += r.Faults[k]
	}
	p("  %-34s %10d   %s", "faults injected", total, strings.Join(fs, ", "))
	var as []string
	for _, k := range []Kind{Reset, CommitDelay, CommitError} {
		as = append(as, fmt.Sprintf("%s %d", k, r.Applied[k]))
	}
	p("  %-34s %10s   %s", "requests/connections faults hit", "", strings.Join(as, ", "))
	if n := r.Faults[KfakeJanitor]; n > 0 {
		p("  %-34s %10d   (group stuck by members whose JoinGroup answer was lost: all removed)", "kfake janitor interventions", n)
	}
	p("  %-34s %10d/%d", "Kafka caught up after the drain", r.CaughtUp, r.Partitions)
	if r.State {
		p("  %-34s %10d   files at a partition's log end, each counter held to the log", "state checked", r.StatesChecked)
	}
	if r.Torn > 0 {
		p("  %-34s %10d", "torn ledger lines", r.Torn)
	}
	p("")
	p("  promises checked:")
	kinds := append([]string(nil), violationOrder...)
	for k := range r.Violations {
		if !contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	sort.SliceStable(kinds[len(violationOrder):], func(i, j int) bool {
		return kinds[len(violationOrder)+i] < kinds[len(violationOrder)+j]
	})
	for _, k := range kinds {
		n := r.Violations[k]
		mark := "ok  "
		if n > 0 {
			mark = "FAIL"
		}
		p("    %s %-84s %d", mark, k, n)
		for _, e := range r.Examples[k] {
			p("           %s", e)
		}
	}
	p("")
	if r.Failed() {
		p("  verdict: FAILED, %d kinds of broken promise (work dir %s)", len(r.Violations), r.Dir)
	} else {
		p("  verdict: ok (run took %s)", r.Elapsed.Round(time.Second))
	}
}

// membership names the kind of group membership of a run.
func ordering(keys int) string {
	if keys > 0 {
		return fmt.Sprintf("OrderKey on %d keys per partition (%d calls at once)", keys, KeyInFlight)
	}
	return "OrderPartition"
}

func stateful(state bool) string {
	if state {
		return ", TxHandler state with a changelog"
	}
	return ""
}

func membership(static bool, protocol string) string {
	m := "dynamic members"
	if static {
		m = "static members"
	}
	if protocol == framework.GroupProtocolConsumer {
		m += ", consumer group protocol"
	}
	return m
}

func ifNonZero(n int64, format string) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(format, n)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Uncovered lists what a run that should exercise every kind in kinds did
// not do: a kind planned or required but never injected, a proxy-rule
// fault (reset, commit delay, commit error) injected but never acting on a
// request, and, when cleanHandoff, no clean hand-off between processes.
// A kind is required when it is in kinds; a planned kind (Report.Planned)
// is always required.
func (r *Report) Uncovered(kinds []Kind, cleanHandoff bool) []string {
	var out []string
	want := map[Kind]bool{}
	for _, k := range kinds {
		want[k] = true
	}
	for k, n := range r.Planned {
		if n > 0 {
			want[k] = true
		}
	}
	for _, k := range Kinds {
		if !want[k] {
			continue
		}
		switch {
		case r.Faults[k] == 0:
			out = append(out, fmt.Sprintf("no %s fault (%d planned)", k, r.Planned[k]))
		case (k == Reset || k == CommitDelay || k == CommitError) && r.Applied[k] == 0:
			out = append(out, fmt.Sprintf("%d %s faults never acted on a request", r.Faults[k], k))
		}
	}
	if cleanHandoff && r.CleanHandoffs == 0 {
		out = append(out, fmt.Sprintf("no clean hand-off (of %d hand-offs: %v)", r.Handoffs, r.HandoffCauses))
	}
	return out
}
