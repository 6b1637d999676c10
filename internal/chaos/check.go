package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Fault is a fault as it happened, with its real start and end.
type Fault struct {
	ID     int
	Kind   Kind
	Target string // the instance, or "" for the broker
	Start  int64  // unix ns
	End    int64  // unix ns; = Start for instantaneous faults (SIGKILL)
	Detail string
	// Applied counts what a Reset, CommitDelay or CommitError fault acted
	// on: the requests its proxy rule hit, plus, for a Reset, the
	// connections open when it began (all reset at once). 0 means the
	// fault never touched the consumer.
	Applied int
}

// EndKind says how an incarnation ended.
type EndKind string

// How incarnations end.
const (
	EndSIGKILL EndKind = "sigkill" // killed by the harness (a fault, or a graceful stop that hung)
	EndSIGTERM EndKind = "sigterm" // stopped gracefully, Run returned nil
	EndFailed  EndKind = "failed"  // stopped gracefully, but exited non-zero
	EndCrashed EndKind = "crashed" // exited by itself
)

// Incarnation is one consumer process.
type Incarnation struct {
	Inc
	Start, End int64 // unix ns
	Ended      EndKind
	ExitErr    string
	// StartWatermarks are the durable watermarks of the instance's offset
	// file when the process started, per partition.
	StartWatermarks map[int]int64
	// KillDurable are the file's durable watermarks read right after a
	// SIGKILL.
	KillDurable map[int]int64
	// StartChangelogNext is, with State, the changelog position the
	// instance's offset file recorded when the process started, per
	// partition of StartWatermarks: the changelog offset after its last
	// acknowledged write (ChangelogPosition.Next). Absent where the file
	// had none.
	StartChangelogNext map[int]int64
}

// ChangelogMarker is an owner's marker in a partition's changelog (State),
// as the harness's own client read it after the run: the record an owner
// writes when it starts the partition, before any change of its own.
type ChangelogMarker struct {
	Partition int
	Offset    int64 // its changelog offset (the owner's epoch)
	T         int64 // its record's timestamp, unix ns, to the millisecond
	Start     int64 // the source offset its owner resumed from
	// Producer is the producer id of its batch. Each consumer process
	// writes its changelog through producer ids of its own (a new one
	// after some errors): the markers of one id are one process's.
	Producer int64
}

// CommitSample is one reading of a partition's committed offset and log
// end by the harness's own client; T is when the answer arrived.
type CommitSample struct {
	T         int64
	Partition int
	Committed int64 // -1: none
	End       int64 // log end read after the committed offset
}

// FileWatermark is a watermark found in an instance's offset file after
// every consumer stopped.
type FileWatermark struct {
	Instance  string
	Partition int
	Watermark int64
}

// FileState is one partition's state counters in an instance's offset
// file after the run (Config.State): the count under each StateKey, with
// the file's watermark of the partition.
type FileState struct {
	Instance  string
	Partition int
	Watermark int64
	Counts    map[int64]int64
}

// Input is everything the checker compares.
type Input struct {
	Topic      string
	Partitions int
	// Keys is Config.Keys: with keys, order is checked per key.
	Keys int
	// Log holds the final log: the value at every offset of every
	// partition, read after the producer stopped.
	Log [][]string
	// Acked is, per partition, how many messages the producer had
	// acknowledged: sequence numbers 0..Acked-1.
	Acked []int64
	// Txn is what became of every value the transactional producer wrote
	// (TxnValue), nil without one. The consumers read at ReadCommitted:
	// a committed value is handled like the producer's, an aborted one
	// never, an unknown one either way (unless LogCommitted decides it).
	Txn map[string]TxnOutcome
	// LogCommitted holds the transactional values the broker commits: those
	// a read_committed fetch of the final log delivers (decoded by
	// franz-go). Where it disagrees with Txn the broker decides, as it does
	// for every read_committed consumer, and the report counts the
	// disagreement as the broker's. nil (facts of older runs): Txn decides.
	LogCommitted map[string]bool
	Ledgers      []Ledger
	Incarnations []Incarnation
	Faults       []Fault
	// Commits are the committed-offset readings, in the order taken.
	Commits []CommitSample
	Files   []FileWatermark
	// States are the state counters of every file (Config.State); nil
	// without state.
	States []FileState
	// State: the consumers kept state with a changelog (Config.State).
	// ChangelogMarkers are then the markers of every partition of the
	// changelog.
	State            bool
	ChangelogMarkers []ChangelogMarker
	// Margin is how long a fault's effects may outlast it (session
	// expiry, a commit retried at the next interval).
	Margin time.Duration
}

// Cause is what a duplicate is attributed to: a fault kind, or one of the
// causes below.
type Cause string

// Causes that are not fault kinds. Both break a promise.
const (
	CauseGraceful    Cause = "graceful"     // no fault near the hand-off
	CauseSameProcess Cause = "same-process" // one process handled the offset twice
	CauseCrash       Cause = "crash"        // the previous owner exited by itself
)

// Causes lists every cause, in report order.
var Causes = []Cause{Cause(SIGKILL), Cause(BrokerRestart), Cause(Blackhole), Cause(Reset), Cause(CommitDelay), Cause(CommitError), Cause(Latency), CauseCrash, CauseGraceful, CauseSameProcess}

// Violation kinds: each is a broken promise.
const (
	VLost             = "lost: in the log, handled by no one"
	VGraceful         = "duplicate at a clean hand-off (no fault near it)"
	VSameProcess      = "offset handled twice by one process"
	VBackwards        = "offsets went backwards within one process (of one key, with Keys)"
	VBelowCommitted   = "handled below Kafka's committed offset"
	VBelowOwnFile     = "handled below the instance's own file watermark at start"
	VSigkillBound     = "SIGKILL duplicates beyond what the killed process handled above Kafka's commit"
	VFaultBound       = "fault duplicates beyond what the previous owner handled above Kafka's commit"
	VFaultWindow      = "duplicate of an offset handled after the effects of the faults that explain it ended"
	VCommitDecreased  = "Kafka committed offset decreased"
	VCommitBeyondEnd  = "Kafka committed offset beyond the log end"
	VFileBeyondEnd    = "offset file watermark beyond the log end"
	VValue            = "handled value differs from the log"
	VBeyondEnd        = "handled an offset beyond the log end"
	VBrokerLost       = "acknowledged message missing from the log (broker)"
	VConsumerCrashed  = "consumer process exited by itself"
	VGracefulStopFail = "graceful stop failed or hung"
	VCrashDuplicate   = "duplicate after a consumer crash"
	VAborted          = "handled a record of an aborted transaction"
	VMarker           = "handled a transaction marker"
	VState            = "state of a file at the log end differs from the log (exactly once)"
)

// guard absorbs the time between a committed-offset reading and the
// handler calls it is compared with (one clock, several processes).
const guard = 50 * time.Millisecond

// Check compares the ledgers with the final log and the harness's
// observations, and returns the figures and every broken promise.
//
// Lost: an offset below the final log end that appears in no ledger.
// Ledger lines are written before the handler returns and survive a
// process kill, so nothing handled can be missing.
//
// Duplicates: every handling of an offset after its first. Each is
// attributed to the hand-off between the previous handler and this one:
// the previous handler's process was SIGKILLed while it still owned the
// partition (sigkill); a fault on the previous owner's path (its proxy) or
// the broker overlapped its ownership or the hand-off, allowing Margin for
// after-effects (the fault's kind); the same process handled it before
// (same-process, broken promise); otherwise the hand-off was clean
// (graceful, broken promise).
//
// A fault excuses a number of duplicates, not any: a SIGKILL, per kill and
// partition, no more than the killed process had handled at or above
// Kafka's committed offset at the kill (checkSigkillBound); every other
// kind, per hand-off and partition, no more than the previous owner had
// handled at or above Kafka's committed offset when the next owner began
// (checkFaultBound): what it handled since its last successful commit.
func Check(in *Input) *Report {
	c := &checker{in: in, rep: newReport()}
	c.index()
	c.checkLog()
	for p := 0; p < in.Partitions; p++ {
		c.partition(p)
	}
	c.checkSigkillBound()
	c.checkFaultBound()
	c.checkCommits()
	c.checkFiles()
	c.checkState()
	c.checkProcesses()
	return c.rep
}

// checkState holds the state counters of every file at a partition's log
// end to the log: for each StateKey, the number of the partition's
// messages to handle under it, exactly, whatever was handled twice. Every
// partition must have such a file (the last owner's).
func (c *checker) checkState() {
	in := c.in
	if in.States == nil {
		return
	}
	for p := 0; p < in.Partitions; p++ {
		var log []string
		if p < len(in.Log) {
			log = in.Log[p]
		}
		want := map[int64]int64{}
		for o, v := range log {
			if c.expected(v) {
				want[int64(o)%StateKeys]++
			}
		}
		end := int64(len(log))
		at := 0
		for _, fs := range in.States {
			if fs.Partition != p || fs.Watermark != end {
				continue
			}
			at++
			c.rep.StatesChecked++
			for k := int64(0); k < StateKeys; k++ {
				if got := fs.Counts[k]; got != want[k] {
					c.rep.violate(VState, "%s/%d in %s's file (watermark %d): key %d counts %d, the log %d", in.Topic, p, fs.Instance, fs.Watermark, k, got, want[k])
				}
			}
		}
		if at == 0 && end > 0 {
			c.rep.violate(VState, "%s/%d: no file's watermark is at the log end %d (the last owner's should be)", in.Topic, p, end)
		}
	}
}

type segment struct {
	inc           Inc
	gen           int32
	firstT, lastT int64
	ownStart      int64
}

type checker struct {
	in  *Input
	rep *Report

	incs    map[Inc]*Incarnation
	gens    map[Inc][]GenEvent
	lost    map[Inc][]int64    // Ledger.Lost, in time order
	faults  map[string][]Fault // by target ("" = broker)
	commits [][]CommitSample   // by partition, in time order
	byP     [][]Handling
	// killDups counts SIGKILL duplicates per killed incarnation and
	// partition; the bound is checked against it.
	killDups map[Inc]map[int]int64
	// faultDups counts the duplicates a fault of another kind excused, per
	// hand-off (checkFaultBound).
	faultDups map[handoff]*handoffDups
	txnInLog  map[string]bool           // every value of the log, for Txn's check
	markers   map[int][]ChangelogMarker // ChangelogMarkers by partition
}

func (c *checker) index() {
	in := c.in
	c.incs = map[Inc]*Incarnation{}
	for i := range in.Incarnations {
		c.incs[in.Incarnations[i].Inc] = &in.Incarnations[i]
	}
	c.gens = map[Inc][]GenEvent{}
	c.lost = map[Inc][]int64{}
	c.byP = make([][]Handling, in.Partitions)
	for _, l := range in.Ledgers {
		c.rep.Torn += l.Torn
		for _, h := range l.Handlings {
			if h.Topic != in.Topic || h.Partition < 0 || h.Partition >= in.Partitions {
				c.rep.violate(VBeyondEnd, "%s/%d@%d by %s: not a partition of topic %s", h.Topic, h.Partition, h.Offset, h.Inc, in.Topic)
				continue
			}
			c.byP[h.Partition] = append(c.byP[h.Partition], h)
		}
		if len(l.Handlings) > 0 {
			inc := l.Handlings[0].Inc
			c.gens[inc] = append(c.gens[inc], l.Gens...)
			c.lost[inc] = append(c.lost[inc], l.Lost...)
		}
	}
	for inc := range c.gens {
		g := c.gens[inc]
		sort.SliceStable(g, func(i, j int) bool { return g[i].T < g[j].T })
	}
	for _, l := range c.lost {
		slices.Sort(l)
	}
	c.faults = map[string][]Fault{}
	for _, f := range in.Faults {
		c.faults[f.Target] = append(c.faults[f.Target], f)
		c.rep.Faults[f.Kind]++
		c.rep.Applied[f.Kind] += f.Applied
	}
	c.commits = make([][]CommitSample, in.Partitions)
	for _, s := range in.Commits {
		if s.Partition >= 0 && s.Partition < in.Partitions {
			c.commits[s.Partition] = append(c.commits[s.Partition], s)
		}
	}
	for p := range c.commits {
		s := c.commits[p]
		sort.SliceStable(s, func(i, j int) bool { return s[i].T < s[j].T })
	}
	c.killDups = map[Inc]map[int]int64{}
	c.faultDups = map[handoff]*handoffDups{}
	c.markers = map[int][]ChangelogMarker{}
	for _, m := range in.ChangelogMarkers {
		c.markers[m.Partition] = append(c.markers[m.Partition], m)
	}
	for _, ms := range c.markers {
		sort.Slice(ms, func(i, j int) bool { return ms[i].Offset < ms[j].Offset })
	}
}

// handoff is one partition's move from the previous handler of an offset
// (prev) to the segment that handled it again, starting at next.
type handoff struct {
	prev      Inc
	partition int
	next      int64 // the later segment's first handling, unix ns
}

type handoffDups struct {
	cause Cause
	to    Inc
	n     int64
}

// checkLog compares the final log with what the producer had
// acknowledged.
func (c *checker) checkLog() {
	in := c.in
	for p := 0; p < in.Partitions; p++ {
		var log []string
		if p < len(in.Log) {
			log = in.Log[p]
		}
		c.rep.InLog += int64(len(log))
		var acked int64
		if p < len(in.Acked) {
			acked = in.Acked[p]
		}
		c.rep.Produced += acked
		seen := make(map[int64]bool, len(log))
		txnSeen := map[string]bool{}
		for o, v := range log {
			if v == markerValue && in.Txn != nil {
				c.rep.Markers++
				continue
			}
			if _, ok := parseTxnValue(p, v); ok && in.Txn != nil {
				if txnSeen[v] {
					c.rep.LogDuplicates++
				}
				txnSeen[v] = true
				continue
			}
			seq, ok := parseValue(p, v)
			if !ok {
				c.rep.violate(VValue, "%s/%d@%d holds %q, not a value the producer writes", in.Topic, p, o, v)
				continue
			}
			if seen[seq] {
				c.rep.LogDuplicates++
			}
			seen[seq] = true
		}
		for seq := int64(0); seq < acked; seq++ {
			if !seen[seq] {
				c.rep.violate(VBrokerLost, "%s/%d: sequence %d was acknowledged but is not in the log", in.Topic, p, seq)
			}
		}
	}
	values := make([]string, 0, len(in.Txn))
	for v := range in.Txn {
		values = append(values, v)
	}
	sort.Strings(values)
	for _, v := range values {
		switch o := in.Txn[v]; o {
		case TxnCommitted:
			c.rep.TxnCommitted++
			if !c.inLog(v) {
				c.rep.violate(VBrokerLost, "%s: %s was committed in a transaction but is not in the log", in.Topic, v)
			} else if in.LogCommitted != nil && !in.LogCommitted[v] {
				c.rep.brokerAborted(c.where(v))
			}
		case TxnAborted:
			c.rep.TxnAborted++
			if in.LogCommitted[v] {
				c.rep.brokerCommitted(c.where(v))
			}
		default:
			c.rep.TxnUnknown++
		}
	}
}

// where names the offsets holding the transactional value v.
func (c *checker) where(v string) string {
	for p, log := range c.in.Log {
		for o, lv := range log {
			if lv == v {
				return fmt.Sprintf("%s/%d@%d (%s)", c.in.Topic, p, o, v)
			}
		}
	}
	return v
}

// txnOutcome is what became of the transactional value v: the broker's
// outcome where the run read it, else the producer's.
func (c *checker) txnOutcome(v string) (TxnOutcome, bool) {
	o, ok := c.in.Txn[v]
	if !ok {
		return 0, false
	}
	if c.in.LogCommitted != nil && c.inLog(v) {
		if c.in.LogCommitted[v] {
			return TxnCommitted, true
		}
		return TxnAborted, true
	}
	return o, true
}

// markerValue is what the log holds at an offset without a record: with
// a transactional producer, a transaction marker.
const markerValue = ""

// inLog says whether the transactional value v is in its partition's log.
func (c *checker) inLog(v string) bool {
	if c.txnInLog == nil {
		c.txnInLog = map[string]bool{}
		for _, log := range c.in.Log {
			for _, lv := range log {
				c.txnInLog[lv] = true
			}
		}
	}
	return c.txnInLog[v]
}

// expected says whether the record holding v at an offset must be
// handled: a record of the producer or of a committed transaction (as the
// broker decides, where the run read its outcome); not a marker, an
// aborted record, or one of a transaction whose outcome is unknown.
func (c *checker) expected(v string) bool {
	if v == markerValue && c.in.Txn != nil {
		return false
	}
	if o, ok := c.txnOutcome(v); ok {
		return o == TxnCommitted
	}
	return true
}

// aborted says whether v is a record of an aborted transaction.
func (c *checker) aborted(v string) bool {
	o, ok := c.txnOutcome(v)
	return ok && o == TxnAborted
}

// partition checks every handling of one partition.
func (c *checker) partition(p int) {
	in := c.in
	hs := c.byP[p]
	sort.SliceStable(hs, func(i, j int) bool {
		a, b := hs[i], hs[j]
		if a.T != b.T {
			return a.T < b.T
		}
		if a.Inc != b.Inc {
			return a.Inc.String() < b.Inc.String()
		}
		return a.Offset < b.Offset
	})
	var log []string
	if p < len(in.Log) {
		log = in.Log[p]
	}
	end := int64(len(log))
	count := make([]int32, end)
	last := make([]int, end) // index in hs of the latest handling of each offset
	segOf := make([]int, len(hs))
	var segs []segment
	// Order: each incarnation's last offset here, and its index in hs; per
	// key with Keys (the key is the sequence number's, from the value).
	type orderKey struct {
		inc Inc
		key int64
	}
	lastBy := map[orderKey]int64{}
	lastIdx := map[orderKey]int{}
	ci := 0 // commit samples with T < current handling's T - guard
	cs := c.commits[p]
	for i, h := range hs {
		c.rep.Handled++
		if len(segs) == 0 || segs[len(segs)-1].inc != h.Inc || segs[len(segs)-1].gen != h.Gen {
			s := segment{inc: h.Inc, gen: h.Gen, firstT: h.T, lastT: h.T, ownStart: c.ownStart(h.Inc, h.Gen, h.T)}
			if n := len(segs); n > 0 && segs[n-1].inc != h.Inc {
				c.rep.Handoffs++
				cause := c.classify(segs[n-1], s)
				c.rep.HandoffCauses[cause]++
				if cause == CauseGraceful {
					c.rep.CleanHandoffs++
				}
			}
			segs = append(segs, s)
		}
		seg := &segs[len(segs)-1]
		seg.lastT = h.T
		segOf[i] = len(segs) - 1
		where := fmt.Sprintf("%s/%d@%d", h.Topic, p, h.Offset)
		at := time.Unix(0, h.T).Format("15:04:05.000")

		// Offsets only move forward within a process (within a key with
		// Keys: handling is concurrent across keys).
		ok := orderKey{inc: h.Inc, key: -1}
		if in.Keys > 0 {
			if seq, valid := parseValue(p, h.Value); valid {
				ok.key = seq % int64(in.Keys)
			} else if seq, valid := parseTxnValue(p, h.Value); valid {
				ok.key = seq % int64(in.Keys) // KeyOf, as the plain producer's
			}
		}
		if prev, seen := lastBy[ok]; seen && h.Offset < prev && !c.relapsed(hs[lastIdx[ok]], h) {
			between := "without a reassignment"
			for j := lastIdx[ok] + 1; j < i; j++ {
				if hs[j].Inc != h.Inc {
					between = "after other processes handled the partition"
					break
				}
			}
			c.rep.violate(VBackwards, "%s by %s at %s after offset %d, %s", where, h.Inc, at, prev, between)
		}
		lastBy[ok], lastIdx[ok] = h.Offset, i

		// Never below what Kafka had committed before the call began.
		for ci < len(cs) && cs[ci].T < h.T-int64(guard) {
			ci++
		}
		if ci > 0 && cs[ci-1].Committed > h.Offset {
			c.rep.violate(VBelowCommitted, "%s by %s at %s: Kafka's committed offset was already %d at %s",
				where, h.Inc, at, cs[ci-1].Committed, time.Unix(0, cs[ci-1].T).Format("15:04:05.000"))
		}
		// Never below the instance's own file at process start, unless
		// another owner had started the partition since the file's last
		// changelog write (State).
		if inc := c.incs[h.Inc]; inc != nil {
			if wm, ok := inc.StartWatermarks[p]; ok && h.Offset < wm {
				if c.overtaken(inc, p, seg.firstT) {
					c.rep.RestoredBelowFile++
				} else {
					c.rep.violate(VBelowOwnFile, "%s by %s at %s: its offset file held watermark %d when it started", where, h.Inc, at, wm)
				}
			}
		}

		if h.Offset >= end || h.Offset < 0 {
			c.rep.violate(VBeyondEnd, "%s by %s at %s: the log ends at %d", where, h.Inc, at, end)
			continue
		}
		switch {
		case log[h.Offset] == markerValue && in.Txn != nil:
			c.rep.violate(VMarker, "%s by %s: handled %q where the log holds a transaction marker", where, h.Inc, h.Value)
		case log[h.Offset] != h.Value:
			c.rep.violate(VValue, "%s by %s: handled %q, the log holds %q", where, h.Inc, h.Value, log[h.Offset])
		case c.aborted(h.Value):
			c.rep.violate(VAborted, "%s by %s at %s: %s", where, h.Inc, at, h.Value)
		}
		if count[h.Offset] > 0 {
			prev := hs[last[h.Offset]]
			var cause Cause
			if prev.Inc == h.Inc && c.relapsed(prev, h) {
				// The process gave the partition up without a commit and
				// was given it again: a hand-off to itself, bounded like
				// one (a state rebuilt from its changelog resumes at
				// Kafka's commit when the file's last changes never
				// reached the changelog).
				t, _ := c.lostBetween(h.Inc, prev.T, h.T)
				cause, _ = c.explain(lostPriority, nil, t-int64(SessionTimeout), t)
				c.faultDup(handoff{prev: prev.Inc, partition: p, next: seg.firstT}, cause, h.Inc)
				if prev.T > t+int64(guard) {
					c.rep.violate(VFaultWindow, "%s handled by %s at %s, again at %s: the lapse at %s excuses only what was handled before it",
						where, prev.Inc, time.Unix(0, prev.T).Format("15:04:05.000"), at, time.Unix(0, t).Format("15:04:05.000"))
				}
			} else if prev.Inc == h.Inc {
				cause = CauseSameProcess
				c.rep.violate(VSameProcess, "%s by %s at %s, and at %s in generation %d", where, h.Inc, at,
					time.Unix(0, prev.T).Format("15:04:05.000"), prev.Gen)
			} else {
				var until int64
				var zombie bool
				cause, until, zombie = c.classifyAt(segs[segOf[last[h.Offset]]], *seg)
				switch cause {
				case CauseGraceful:
					c.rep.violate(VGraceful, "%s handled by %s (generation %d) at %s, again by %s (generation %d) at %s",
						where, prev.Inc, prev.Gen, time.Unix(0, prev.T).Format("15:04:05.000"), h.Inc, h.Gen, at)
				case CauseCrash:
					c.rep.violate(VCrashDuplicate, "%s handled by %s, which crashed, again by %s", where, prev.Inc, h.Inc)
				case Cause(BrokerRestart), Cause(Blackhole), Cause(Reset), Cause(CommitDelay), Cause(CommitError), Cause(Latency):
					c.faultDup(handoff{prev: prev.Inc, partition: p, next: seg.firstT}, cause, h.Inc)
					// Excused only for an offset handled while the fault's
					// effects lasted: the previous owner's handling (the
					// zombie's, for a zombie).
					ht := prev.T
					if zombie {
						ht = h.T
					}
					if ht > until+int64(guard) {
						c.rep.violate(VFaultWindow, "%s handled by %s at %s, again by %s at %s: %s excuses what was handled until %s",
							where, prev.Inc, time.Unix(0, prev.T).Format("15:04:05.000"), h.Inc, at, cause, time.Unix(0, until).Format("15:04:05.000"))
					}
				case Cause(SIGKILL):
					m := c.killDups[prev.Inc]
					if m == nil {
						m = map[int]int64{}
						c.killDups[prev.Inc] = m
					}
					m[p]++
					if inc := c.incs[prev.Inc]; inc != nil {
						if wm, ok := inc.KillDurable[p]; ok && h.Offset < wm {
							c.rep.SigkillDurable++
						}
					}
				}
			}
			c.rep.Duplicates[cause]++
		}
		count[h.Offset]++
		last[h.Offset] = i
	}
	for o := int64(0); o < end; o++ {
		want := c.expected(log[o])
		if want {
			c.rep.Expected++
		}
		switch {
		case count[o] > 0:
			c.rep.Consumed++
		case want:
			c.rep.violate(VLost, "%s/%d@%d (%s)", in.Topic, p, o, log[o])
		}
	}
}

// overtaken reports whether, with State, another owner had started p
// between the last changelog write inc's file recorded when inc started
// (StartChangelogNext) and inc's handling of p from first on: a marker at
// or after that position, written before inc started, or after it by
// another producer than inc's own marker for the ownership (the last one
// written before first). The file's state was then no longer the
// changelog's, and the partition restored as of Kafka's committed offset,
// below the file's watermark. A record's timestamp is its writer's clock
// when it made the batch, to the millisecond: the whole millisecond must
// precede.
func (c *checker) overtaken(inc *Incarnation, p int, first int64) bool {
	if !c.in.State {
		return false
	}
	next, ok := inc.StartChangelogNext[p]
	if !ok {
		return false
	}
	var since []ChangelogMarker
	for _, m := range c.markers[p] {
		if m.Offset >= next && m.T+int64(time.Millisecond) <= first {
			since = append(since, m)
		}
	}
	if len(since) == 0 {
		return false
	}
	own := since[len(since)-1]
	for _, m := range since {
		if m.T+int64(time.Millisecond) <= inc.Start || m.Producer != own.Producer {
			return true
		}
	}
	return false
}

// ownStart is when inc entered generation gen (its first G line for it),
// or first if the ledger has none before first.
func (c *checker) ownStart(inc Inc, gen int32, first int64) int64 {
	for _, g := range c.gens[inc] {
		if g.Gen == gen && g.T <= first {
			return g.T
		}
	}
	return first
}

// genAt is the generation inc was in at t, by its G lines.
func (c *checker) genAt(inc Inc, t int64) (int32, bool) {
	var gen int32
	found := false
	for _, g := range c.gens[inc] {
		if g.T > t {
			break
		}
		gen, found = g.Gen, true
	}
	return gen, found
}

// faultPriority orders the kinds a hand-off is attributed to when several
// apply: the most disruptive first.
var faultPriority = []Kind{BrokerRestart, Blackhole, Reset, CommitDelay, CommitError, Latency}

// classify says why the partition moved from segment a to segment b with
// a's progress not fully committed, or CauseGraceful if nothing explains
// it.
func (c *checker) classify(a, b segment) Cause {
	cause, _, _ := c.classifyAt(a, b)
	return cause
}

// classifyAt is classify, and for a cause other than a SIGKILL, a crash or
// a clean hand-off, until: when the effects of the faults that explain the
// hand-off ended (the latest end of those faults, plus Margin; for a
// lapsed membership, when it was recorded). A duplicate is excused only
// for an offset handled by then: by the previous owner, or with zombie, by
// the zombie handling it again.
func (c *checker) classifyAt(a, b segment) (cause Cause, until int64, zombie bool) {
	if inc := c.incs[a.inc]; inc != nil {
		switch inc.Ended {
		case EndSIGKILL, EndCrashed:
			// Killed while it still owned the partition: at or after its
			// last handling, before the next owner's first, and not after
			// it had given the partition up.
			//
			// With eager rebalancing a member revokes (drains, commits)
			// every partition before it joins the next generation, so the
			// rule was "still in the generation it handled in". With
			// cooperative-sticky rebalancing a partition that stays with
			// its owner keeps running through new generations: a process
			// killed just after a rebalance that left it the partition,
			// before it handled the partition again, was in a later
			// generation but still owned it. A partition moves in two
			// steps (taken from its owner in one generation, given to the
			// next owner in a later one, once the owner revoked it and
			// rejoined), so a kill in a generation before the one the next
			// owner handles in may have found it owned; a kill in that
			// generation or a later one came after a clean revoke. The
			// SIGKILL bound (checkSigkillBound) still caps what a kill may
			// explain. With static membership (Config.Static) the next
			// owner may be the killed instance's own restarted process,
			// which the broker hands the killed member's assignment in the
			// current generation, without a rebalance: the same
			// generation is then no clean revoke either.
			if inc.End >= a.lastT && inc.End <= b.firstT {
				g, ok := c.genAt(a.inc, inc.End)
				if !ok || g == a.gen || g < b.gen || (g == b.gen && b.inc.Instance == a.inc.Instance) {
					if inc.Ended == EndCrashed {
						return CauseCrash, 0, false
					}
					return Cause(SIGKILL), 0, false
				}
			}
		}
	}
	// b handling in an older generation than a is a zombie: a member the
	// group had already left behind, still handling because it had not
	// learned so (its connection was cut or stalled; before heartbeats had
	// a connection of their own, they also waited behind a held commit). Faults on b's own connection explain that; with
	// none, the duplicate counts against the promise like any other.
	if b.gen < a.gen {
		targets := []string{"", b.inc.Instance}
		if k, ok := c.explain(faultPriority, targets, b.ownStart, b.lastT); ok {
			return k, c.effectsEnd(targets, b.ownStart, b.lastT), true
		}
		return CauseGraceful, 0, false
	}
	// Faults in force during the ownership or the hand-off.
	targets := []string{"", a.inc.Instance}
	if k, ok := c.explain(faultPriority, targets, a.ownStart, b.firstT); ok {
		return k, c.effectsEnd(targets, a.ownStart, b.firstT), false
	}
	// a gave its partitions up without a commit between its last handling
	// and b's first: its membership lapsed. That happens when a rebalance
	// it waits in is held up past its lease (SessionTimeout less a
	// heartbeat) by a member that does not rejoin: one cut off, killed or
	// slowed, whichever process it is, or by the broker. Faults anywhere in
	// force during the session before the loss explain it; with none, the
	// duplicate counts against the promise.
	if t, ok := c.lostBetween(a.inc, a.lastT, b.firstT); ok {
		if k, ok := c.explain(lostPriority, nil, t-int64(SessionTimeout), t); ok {
			return k, t, false
		}
	}
	return CauseGraceful, 0, false
}

// effectsEnd is the latest end, plus Margin, of the faults of the kinds in
// faultPriority on targets that explain's rule finds in [from, to].
func (c *checker) effectsEnd(targets []string, from, to int64) int64 {
	margin := int64(c.in.Margin)
	var end int64
	for _, target := range targets {
		for _, f := range c.faults[target] {
			if slices.Contains(faultPriority, f.Kind) && f.Start <= to && f.End+margin >= from {
				end = max(end, f.End+margin)
			}
		}
	}
	return end
}

// explain returns the first of kinds, in their order, of a fault on one of
// targets (nil: any process, and the broker) in force at some time in
// [from, to]: faults in force then first, then those whose after-effects
// (Margin) reach it.
func (c *checker) explain(kinds []Kind, targets []string, from, to int64) (Cause, bool) {
	for _, margin := range []int64{0, int64(c.in.Margin)} {
		for _, k := range kinds {
			for target, fs := range c.faults {
				if targets != nil && !slices.Contains(targets, target) {
					continue
				}
				for _, f := range fs {
					if f.Kind == k && f.Start <= to && f.End+margin >= from {
						return Cause(k), true
					}
				}
			}
		}
	}
	return "", false
}

// faultDup counts one duplicate that cause excused at hand-off k (to
// inc), for checkFaultBound.
func (c *checker) faultDup(k handoff, cause Cause, to Inc) {
	d := c.faultDups[k]
	if d == nil {
		d = &handoffDups{cause: cause, to: to}
		c.faultDups[k] = d
	}
	d.n++
}

// relapsed reports whether one process's handling b of an offset it had
// handled in a came after it gave its partitions up without a commit (an L
// line between the two), in a later generation, with a fault in force
// during the session before the loss to explain the lapse: the group gave
// the partition back to the same process, as to a new owner.
func (c *checker) relapsed(a, b Handling) bool {
	if a.Inc != b.Inc || b.Gen <= a.Gen {
		return false
	}
	t, ok := c.lostBetween(a.Inc, a.T, b.T)
	if !ok {
		return false
	}
	_, ok = c.explain(lostPriority, nil, t-int64(SessionTimeout), t)
	return ok
}

// lostPriority orders the kinds a lapsed membership is attributed to.
var lostPriority = append([]Kind{SIGKILL}, faultPriority...)

// lostBetween returns when inc gave partitions up without a commit, the
// first time in [from, to+genSample] (L lines are written when the
// consumer's Stats sampling sees it, up to genSample late).
func (c *checker) lostBetween(inc Inc, from, to int64) (int64, bool) {
	for _, t := range c.lost[inc] {
		if t >= from && t <= to+int64(genSample) {
			return t, true
		}
	}
	return 0, false
}

// checkSigkillBound: the duplicates a SIGKILL caused, per partition, are at
// most what the killed process had handled at or above Kafka's committed
// offset at the kill (its work since the last commit).
func (c *checker) checkSigkillBound() {
	handled := map[Inc][]map[int64]bool{} // killed incarnation -> partition -> offsets it handled
	for p, hs := range c.byP {
		for _, h := range hs {
			inc := c.incs[h.Inc]
			if inc == nil || inc.Ended != EndSIGKILL {
				continue
			}
			if handled[h.Inc] == nil {
				handled[h.Inc] = make([]map[int64]bool, c.in.Partitions)
			}
			if handled[h.Inc][p] == nil {
				handled[h.Inc][p] = map[int64]bool{}
			}
			handled[h.Inc][p][h.Offset] = true
		}
	}
	for i := range c.in.Incarnations {
		inc := &c.in.Incarnations[i]
		if inc.Ended != EndSIGKILL {
			continue
		}
		for p := 0; p < c.in.Partitions; p++ {
			committed := c.committedAt(p, inc.End)
			durable, hasDurable := inc.KillDurable[p]
			var bound, unflushed int64
			if handled[inc.Inc] != nil {
				for o := range handled[inc.Inc][p] {
					if o >= committed {
						bound++
					}
					if hasDurable && o >= durable {
						unflushed++
					}
				}
			}
			c.rep.SigkillBound += bound
			c.rep.Unflushed += unflushed
			if d := c.killDups[inc.Inc][p]; d > bound {
				c.rep.violate(VSigkillBound, "%s/%d: %d duplicates after %s was killed, but it had handled only %d offsets at or above Kafka's committed offset %d",
					c.in.Topic, p, d, inc.Inc, bound, committed)
			}
		}
	}
}

// checkFaultBound: the duplicates a fault other than a SIGKILL excused at a
// hand-off, per partition, are at most what the previous owner had handled
// at or above Kafka's committed offset as last read before the next owner
// began (less guard): the next owner resumes at the committed offset, so it
// repeats only what the previous owner handled since its last successful
// commit. The bound is summed per fault kind in Report.FaultBound.
func (c *checker) checkFaultBound() {
	keys := make([]handoff, 0, len(c.faultDups))
	for k := range c.faultDups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].partition != keys[j].partition {
			return keys[i].partition < keys[j].partition
		}
		return keys[i].next < keys[j].next
	})
	for _, k := range keys {
		d := c.faultDups[k]
		committed := c.committedAt(k.partition, k.next-int64(guard))
		seen := map[int64]bool{}
		for _, h := range c.byP[k.partition] {
			if h.Inc == k.prev && h.T < k.next && h.Offset >= committed {
				seen[h.Offset] = true
			}
		}
		bound := int64(len(seen))
		c.rep.FaultBound[d.cause] += bound
		if d.n > bound {
			c.rep.violate(VFaultBound, "%s/%d: %d duplicates (%s) when %s took over from %s at %s, but %s had handled only %d offsets at or above Kafka's committed offset %d",
				c.in.Topic, k.partition, d.n, d.cause, d.to, k.prev, time.Unix(0, k.next).Format("15:04:05.000"), k.prev, bound, committed)
		}
	}
}

// committedAt is the committed offset last read before t (-1 if none).
func (c *checker) committedAt(p int, t int64) int64 {
	cs := c.commits[p]
	i := sort.Search(len(cs), func(i int) bool { return cs[i].T >= t })
	if i == 0 {
		return -1
	}
	return cs[i-1].Committed
}

// checkCommits: Kafka's committed offset never decreases and never passes
// the log end.
func (c *checker) checkCommits() {
	for p, cs := range c.commits {
		prev := int64(-1)
		var prevT int64
		for _, s := range cs {
			if s.Committed < prev {
				c.rep.violate(VCommitDecreased, "%s/%d: %d at %s, then %d at %s", c.in.Topic, p, prev,
					time.Unix(0, prevT).Format("15:04:05.000"), s.Committed, time.Unix(0, s.T).Format("15:04:05.000"))
			}
			if s.Committed > s.End && s.End >= 0 {
				c.rep.violate(VCommitBeyondEnd, "%s/%d: committed %d, log end %d at %s", c.in.Topic, p, s.Committed, s.End,
					time.Unix(0, s.T).Format("15:04:05.000"))
			}
			prev, prevT = s.Committed, s.T
		}
	}
}

// checkFiles: no instance's offset file holds a watermark beyond the log
// end.
func (c *checker) checkFiles() {
	for _, f := range c.in.Files {
		end := int64(0)
		if f.Partition >= 0 && f.Partition < len(c.in.Log) {
			end = int64(len(c.in.Log[f.Partition]))
		}
		if f.Watermark > end {
			c.rep.violate(VFileBeyondEnd, "%s: %s/%d watermark %d, log end %d", f.Instance, c.in.Topic, f.Partition, f.Watermark, end)
		}
	}
}

// checkProcesses: every process ended the way the harness ended it.
func (c *checker) checkProcesses() {
	for _, inc := range c.in.Incarnations {
		switch inc.Ended {
		case EndCrashed:
			c.rep.violate(VConsumerCrashed, "%s: %s", inc.Inc, inc.ExitErr)
		case EndFailed:
			c.rep.violate(VGracefulStopFail, "%s: %s", inc.Inc, inc.ExitErr)
		case EndSIGKILL:
			c.rep.Kills++
			if inc.ExitErr != "" {
				c.rep.violate(VGracefulStopFail, "%s: %s", inc.Inc, inc.ExitErr)
			}
		}
	}
}

// Value is the payload the producer writes: partition and sequence
// number.
func Value(partition int, seq int64) []byte { return fmt.Appendf(nil, "p%d-s%09d", partition, seq) }

// KeyOf is the key of sequence number seq with keys keys per partition
// (Config.Keys): round robin.
func KeyOf(seq int64, keys int) []byte { return fmt.Appendf(nil, "k%d", seq%int64(keys)) }

func parseValue(partition int, v string) (int64, bool) {
	rest, ok := strings.CutPrefix(v, fmt.Sprintf("p%d-s", partition))
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseInt(rest, 10, 64)
	return seq, err == nil && seq >= 0
}
