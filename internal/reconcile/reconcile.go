// Package reconcile is the decision of reconciliation: given what the offset
// file and Kafka say of one partition, and the log's bounds, where the
// partition resumes. It is pure (no I/O, no logging), so that the consumer
// (package framework, which acts on it) and the command's prediction
// (tidemark diff, which reports it) run the same code.
package reconcile

import "fmt"

// Policy is the OutOfRange policy (framework.OutOfRangePolicy, same order).
type Policy int

// The policies, in framework.OutOfRangePolicy's order.
const (
	ResetToEarliest Policy = iota
	ResetToLatest
	Stall
)

func (p Policy) String() string {
	switch p {
	case ResetToEarliest:
		return "reset-to-earliest"
	case ResetToLatest:
		return "reset-to-latest"
	case Stall:
		return "stall"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Input is one partition at assignment. Offsets are -1 when unknown.
type Input struct {
	// Local is the offset file's durable watermark L.
	Local int64
	// Confirmed is the last offset Kafka confirmed for the group, from the
	// file's commit ledger (Record.Committed) K.
	Confirmed int64
	// Kafka is the group's committed offset C in Kafka now.
	Kafka int64
	// First, Last and Stable are the log's bounds: its first offset, its
	// log end (high watermark) and its last stable offset (the log end at
	// read_uncommitted).
	First, Last, Stable int64
	// StartLatest: Config.StartOffset is kafka.LastOffset (else FirstOffset).
	StartLatest bool
	// OutOfRange is the policy for a position outside the log or moved back.
	OutOfRange Policy
}

// Case is which of reconciliation's situations the partition is in.
type Case int

// The cases, in the order reconciliation tests them.
const (
	// MovedBack: L and K known and C < K. Not a late commit: Kafka lost or
	// moved back below what it confirmed (topic recreated, group offsets
	// reset, deleted or expired).
	MovedBack Case = iota
	// NoPosition: neither L nor C: StartOffset.
	NoPosition
	// Agree: L == C.
	Agree
	// LocalAhead: L > C, a commit late, failed or not yet made: resume at L
	// and commit it.
	LocalAhead
	// FirstTime: no L, C known: resume at C.
	FirstTime
	// KafkaAhead: C > L, another member went further: resume at C.
	KafkaAhead
)

func (c Case) String() string {
	switch c {
	case MovedBack:
		return "moved back"
	case NoPosition:
		return "no position"
	case Agree:
		return "agree"
	case LocalAhead:
		return "local ahead"
	case FirstTime:
		return "first time"
	case KafkaAhead:
		return "kafka ahead"
	}
	return fmt.Sprintf("Case(%d)", int(c))
}

// Reset is a position moved by policy.
type Reset struct {
	From, To int64
	Reason   string
	// Baseline, when 0 or more, is Kafka's committed offset to record in the
	// file's ledger as confirmed once this reset is recorded (an operator's
	// reset: Kafka holds C, the ledger's baseline from now on); -1 none.
	Baseline int64
}

// Stalled is a partition the policy stalls.
type Stalled struct {
	// From is the position that could not be used: L when Kafka moved
	// back, the start when it is outside the log.
	From   int64
	Reason string
	// MovedBack: stalled because Kafka's committed offset moved back (else
	// because the position is outside the log).
	MovedBack bool
}

// Decision is what reconciliation does with one partition.
type Decision struct {
	Case Case
	// Resets are the resets recorded, in order (at most two: a move back,
	// then a target outside the log). Any reset means the file's completed
	// ranges are not restored.
	Resets []Reset
	// Stall, when not nil, stalls the partition: Start and what follows
	// are meaningless, and the Resets before it are still recorded.
	Stall *Stalled
	// Chosen is the position the case chose, before the check that it is
	// inside the log (which may reset it).
	Chosen int64
	// Start is where the partition resumes.
	Start int64
	// SetWatermark: the file's watermark is set to Start (it differs from
	// L, or a reset moved it).
	SetWatermark bool
	// Restore: the file is current; its completed ranges above L are not
	// handled again. Never after a reset.
	Restore bool
	// Commit: Start differs from Kafka's committed offset, and a member
	// without this file would not decide it: reconciliation commits Start
	// at once. A first start at the log's start is left to the committer's
	// next round: any member decides it too, and at 10,000 partitions the
	// commit at once held up the first fetch (0.12 s on kfake).
	Commit bool
}

// Reset reports whether the decision moved the position by policy.
func (d Decision) Reset() bool { return len(d.Resets) > 0 }

// Decide decides where the partition of in resumes.
func Decide(in Input) Decision {
	L, K, C := in.Local, in.Confirmed, in.Kafka
	var d Decision
	var start int64
	switch {
	case L >= 0 && K >= 0 && C < K:
		d.Case = MovedBack
		var reason string
		if C < 0 {
			reason = fmt.Sprintf("Kafka has no committed offset, but confirmed %d before (local %d): "+
				"the topic was recreated, or the group's offsets were deleted or expired", K, L)
		} else {
			reason = fmt.Sprintf("Kafka's committed offset %d is below the %d it confirmed before (local %d): "+
				"the group's offsets were reset, or the topic was recreated", C, K, L)
		}
		to, ok := C, true
		if C < 0 {
			to, ok = in.target()
		} else if in.OutOfRange == Stall {
			ok = false
		}
		if ok && (to < in.First || to > in.Last) {
			reason += fmt.Sprintf("; Kafka's offset is outside the log [%d, %d]", in.First, in.Last)
			to, ok = in.target()
		}
		if !ok {
			d.Stall = &Stalled{From: L, Reason: reason, MovedBack: true}
			return d
		}
		r := Reset{From: L, To: to, Reason: reason, Baseline: -1}
		if C >= 0 {
			r.Baseline = C
		}
		d.Resets = append(d.Resets, r)
		start = to
	case L < 0 && C < 0:
		d.Case = NoPosition
		start = in.First
		if in.StartLatest {
			start = in.Stable
		}
	case L >= C:
		d.Case = Agree
		if L > C {
			d.Case = LocalAhead
		}
		start = L
	case L < 0:
		d.Case = FirstTime
		start = C
	default:
		d.Case = KafkaAhead
		start = C
	}
	d.Chosen = start
	if start < in.First || start > in.Last {
		reason := fmt.Sprintf("position %d (local %d, kafka %d) outside the log [%d, %d] at assignment", start, L, C, in.First, in.Last)
		to, ok := in.target()
		if !ok {
			d.Stall = &Stalled{From: start, Reason: reason}
			return d
		}
		d.Resets = append(d.Resets, Reset{From: start, To: to, Reason: reason, Baseline: -1})
		start = to
	}
	d.Start = start
	d.SetWatermark = start != L || d.Reset()
	d.Restore = !d.SetWatermark
	d.Commit = start != C && !(d.Case == NoPosition && !in.StartLatest)
	return d
}

func (in Input) target() (int64, bool) { return Target(in.OutOfRange, in.First, in.Stable) }

// Target applies the OutOfRange policy p to a position outside the log
// whose first offset is first and last stable offset stable: where to
// resume, or false if the partition stalls.
func Target(p Policy, first, stable int64) (int64, bool) {
	switch p {
	case ResetToLatest:
		return stable, true
	case Stall:
		return 0, false
	}
	return first, true
}
