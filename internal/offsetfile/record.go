package offsetfile

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// SchemaVersion is the version of the file layout this build reads and
// writes. It is stored in the file's "meta" bucket under the key "schema".
const SchemaVersion = 1

// Key identifies one consumed partition.
type Key struct {
	Group     string
	Topic     string
	Partition int32
}

// Reset is a watermark reset decided by policy (retention deleted the
// records, the topic was recreated, ...).
type Reset struct {
	At     time.Time // when the reset was decided
	From   int64     // the watermark/committed offset that was out of range
	To     int64     // where consumption resumed
	Reason string
}

// Record is what the store keeps for one Key.
type Record struct {
	Watermark   int64     // next offset to process (everything below is done); -1 = none recorded
	RecordedAt  time.Time // when Watermark was recorded
	Generation  int32     // consumer-group generation that recorded it
	Member      string    // group member id that recorded it
	Committed   int64     // last offset confirmed committed to Kafka; -1 = none known
	CommittedAt time.Time // when Committed was confirmed
	LastReset   *Reset    // nil if never reset

	// Completed are the offsets completed above Watermark, recorded with it
	// (same update, same transaction), for a consumer that completes a
	// partition's messages out of order: after a crash it need not handle
	// them again. Sorted, disjoint and not touching (touching runs are
	// merged), each From above Watermark and below To; nil when none, and
	// always nil while Watermark is -1. Whatever sets Watermark sets
	// Completed too: SetWatermark and RecordReset clear it.
	Completed []Range

	// Run is the crash-loop breaker's record of the run that holds or last
	// held the partition; nil if none was recorded.
	Run *RunState
	// Skipped and DeadLettered count the messages the failure policy
	// skipped or wrote to a dead-letter topic, over the file's life. Each
	// one is listed by Failures.
	Skipped      int64
	DeadLettered int64
	// LastCommit is the last commit attempt to Kafka (the commit ledger);
	// nil if none was recorded.
	LastCommit *CommitAttempt
}

// Range is the run of offsets [From, To): From included, To excluded, as in
// Kafka's "next offset" positions. A Range in Record.Completed has From < To.
type Range struct {
	From, To int64
}

// RunState is what the crash-loop breaker records about the run (a
// consumer process) holding a partition. Open is set, durably, when a run
// starts handling the partition and cleared when it releases it cleanly
// (revoke, shutdown): a run that finds it set knows the previous one ended
// uncleanly (crash, SIGKILL, OOM, power loss).
type RunState struct {
	Open bool
	// Inflight is the offset whose Handler call was in flight when the
	// partition was last recorded in careful mode (after an unclean end,
	// each message's offset is made durable before its Handler call); -1 if
	// none.
	Inflight int64
	// Crashes counts the unclean ends in a row of runs that were handling
	// Inflight.
	Crashes int32
}

// CommitOutcome is the result of a commit attempt.
type CommitOutcome uint8

// Commit outcomes, as recorded in the commit ledger.
const (
	// CommitOK: the broker confirmed the commit.
	CommitOK CommitOutcome = iota + 1
	// CommitFenced: refused because the consumer-group generation ended.
	CommitFenced
	// CommitError: refused by the broker, or confirmed not applied after
	// an unknown outcome.
	CommitError
	// CommitUnknown: no answer (timeout, connection lost): the broker may
	// or may not have applied it. Confirmed against the broker's committed
	// offset at the next commit and at startup.
	CommitUnknown
)

func (o CommitOutcome) String() string {
	switch o {
	case CommitOK:
		return "ok"
	case CommitFenced:
		return "fenced"
	case CommitError:
		return "error"
	case CommitUnknown:
		return "unknown"
	}
	return fmt.Sprintf("CommitOutcome(%d)", uint8(o))
}

// CommitAttempt is one commit of a partition's watermark to Kafka.
type CommitAttempt struct {
	Offset     int64
	Generation int32
	At         time.Time // when the request was sent
	Outcome    CommitOutcome
	Latency    time.Duration // until the answer, or the error
	Error      string        // the error, or how an unknown outcome was confirmed
}

// Entry is a Key with its Record, as listed by Store.Records.
type Entry struct {
	Key
	Record
}

// Limits checked when an update is queued, so that a queued update can never
// make a flush transaction fail for reasons other than I/O.
const (
	maxNameLen   = 32 << 10 // group and topic: bbolt's bucket-name limit is 32768 bytes
	maxStringLen = 64 << 10 // Member and Reset.Reason
	// maxRanges bounds len(Record.Completed), as a sanity bound: at most
	// 20 bytes a range, a value stays under 40 MiB, far below bbolt's
	// value limit.
	maxRanges = 1 << 21
)

// Times are stored as Unix nanoseconds; these are the representable bounds.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

func emptyRecord() Record { return Record{Watermark: -1, Committed: -1} }

// clone returns r with its own copies of LastReset, LastCommit, Run and
// Completed, so callers cannot alter the store's state through them. An
// empty Completed becomes nil.
func (r Record) clone() Record {
	if len(r.Completed) > 0 {
		r.Completed = slices.Clone(r.Completed)
	} else {
		r.Completed = nil
	}
	if r.LastReset != nil {
		rs := *r.LastReset
		r.LastReset = &rs
	}
	if r.LastCommit != nil {
		ca := *r.LastCommit
		r.LastCommit = &ca
	}
	if r.Run != nil {
		rs := *r.Run
		r.Run = &rs
	}
	return r
}

// Fields of a Record that an update sets. Updates to the same key are merged
// field group by field group: a later SetCommitted does not undo an earlier
// SetWatermark that has not been flushed yet.
const (
	setWatermark = 1 << iota // Watermark, RecordedAt, Completed
	setOwner                 // Generation, Member
	setCommitted             // Committed, CommittedAt
	setReset                 // LastReset
	setRun                   // Run
	setCounts                // Skipped, DeadLettered
	setLedger                // LastCommit
	setAll       = setWatermark | setOwner | setCommitted | setReset | setRun | setCounts | setLedger
)

// patch is a queued, not yet durable, update of one key.
type patch struct {
	fields uint8
	rec    Record
	// failures are listed by Failures once the patch is durable.
	failures []Failure
}

// apply returns base with the fields set by p replaced.
func (p patch) apply(base Record) Record {
	if p.fields&setWatermark != 0 {
		base.Watermark, base.RecordedAt, base.Completed = p.rec.Watermark, p.rec.RecordedAt, p.rec.Completed
	}
	if p.fields&setOwner != 0 {
		base.Generation, base.Member = p.rec.Generation, p.rec.Member
	}
	if p.fields&setCommitted != 0 {
		base.Committed, base.CommittedAt = p.rec.Committed, p.rec.CommittedAt
	}
	if p.fields&setReset != 0 {
		base.LastReset = p.rec.LastReset
	}
	if p.fields&setRun != 0 {
		base.Run = p.rec.Run
	}
	if p.fields&setCounts != 0 {
		base.Skipped, base.DeadLettered = p.rec.Skipped, p.rec.DeadLettered
	}
	if p.fields&setLedger != 0 {
		base.LastCommit = p.rec.LastCommit
	}
	return base
}

// merge returns the patch that applies p and then later. The Completed
// ranges are those of the watermark that wins: later's if it sets one.
func (p patch) merge(later patch) patch {
	m := patch{fields: p.fields | later.fields, rec: later.apply(p.rec)}
	if len(p.failures)+len(later.failures) > 0 {
		m.failures = append(append([]Failure(nil), p.failures...), later.failures...)
	}
	return m
}

// normTime drops the monotonic clock reading and sets the location to
// time.Local: the value a time has after a round trip through the file, so
// that Get returns the same before and after a reopen.
func normTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.Unix(0, t.UnixNano())
}

// now is the time source for RecordedAt, CommittedAt and a zero Reset.At.
func now() time.Time { return normTime(clock()) }

// clock is the store's clock; tests that need a file with the same bytes
// each run fix it (export_test.go).
var clock = time.Now

func validateKey(k Key) error {
	switch {
	case k.Group == "":
		return fmt.Errorf("invalid key %s: empty group", keyString(k))
	case k.Topic == "":
		return fmt.Errorf("invalid key %s: empty topic", keyString(k))
	case k.Partition < 0:
		return fmt.Errorf("invalid key %s: negative partition", keyString(k))
	case len(k.Group) > maxNameLen:
		return fmt.Errorf("invalid key: group name is %d bytes, the limit is %d", len(k.Group), maxNameLen)
	case len(k.Topic) > maxNameLen:
		return fmt.Errorf("invalid key: topic name is %d bytes, the limit is %d", len(k.Topic), maxNameLen)
	}
	return nil
}

func validateTime(name string, t time.Time) error {
	if !t.IsZero() && (t.Before(minTime) || t.After(maxTime)) {
		return fmt.Errorf("%s %v is outside the storable range (%v to %v)", name, t, minTime, maxTime)
	}
	return nil
}

func validateString(name, s string) error {
	if len(s) > maxStringLen {
		return fmt.Errorf("%s is %d bytes, the limit is %d", name, len(s), maxStringLen)
	}
	return nil
}

func validateReset(r *Reset) error {
	if r.From < -1 {
		return fmt.Errorf("reset from offset %d: must be >= -1", r.From)
	}
	if r.To < 0 {
		return fmt.Errorf("reset to offset %d: must be >= 0", r.To)
	}
	if err := validateTime("reset time", r.At); err != nil {
		return err
	}
	return validateString("reset reason", r.Reason)
}

// validateRecord checks what Put accepts and what the decoder returns.
func validateRecord(r *Record) error {
	if r.Watermark < -1 {
		return fmt.Errorf("watermark %d: must be >= -1", r.Watermark)
	}
	if err := validateCompleted(r.Watermark, r.Completed); err != nil {
		return err
	}
	if r.Committed < -1 {
		return fmt.Errorf("committed offset %d: must be >= -1", r.Committed)
	}
	if err := validateTime("recorded-at time", r.RecordedAt); err != nil {
		return err
	}
	if err := validateTime("committed-at time", r.CommittedAt); err != nil {
		return err
	}
	if err := validateString("member id", r.Member); err != nil {
		return err
	}
	if r.Run != nil {
		if err := validateRun(r.Run); err != nil {
			return err
		}
	}
	if r.Skipped < 0 || r.DeadLettered < 0 {
		return fmt.Errorf("failure counts %d skipped, %d dead-lettered: must be >= 0", r.Skipped, r.DeadLettered)
	}
	if r.LastCommit != nil {
		if err := validateCommit(r.LastCommit); err != nil {
			return err
		}
	}
	if r.LastReset != nil {
		return validateReset(r.LastReset)
	}
	return nil
}

// validateCompleted checks Record.Completed against its watermark.
func validateCompleted(watermark int64, completed []Range) error {
	switch {
	case len(completed) == 0:
		return nil
	case len(completed) > maxRanges:
		return fmt.Errorf("%d completed ranges, the limit is %d", len(completed), maxRanges)
	case watermark < 0:
		return fmt.Errorf("%d completed ranges without a watermark (watermark %d)", len(completed), watermark)
	}
	for i, r := range completed {
		switch {
		case r.From >= r.To:
			return fmt.Errorf("completed range %d [%d, %d): empty or reversed (From must be below To)", i, r.From, r.To)
		case i == 0 && r.From <= watermark:
			return fmt.Errorf("completed range 0 [%d, %d): starts at or below the watermark %d (the watermark offset itself is not done)",
				r.From, r.To, watermark)
		case i == 0:
		case r.From < completed[i-1].To:
			p := completed[i-1]
			return fmt.Errorf("completed range %d [%d, %d): overlaps or is below range %d [%d, %d) (ranges must be sorted and disjoint)",
				i, r.From, r.To, i-1, p.From, p.To)
		case r.From == completed[i-1].To:
			p := completed[i-1]
			return fmt.Errorf("completed range %d [%d, %d): touches range %d [%d, %d) (touching ranges must be merged)",
				i, r.From, r.To, i-1, p.From, p.To)
		}
	}
	return nil
}

func validateRun(r *RunState) error {
	if r.Inflight < -1 {
		return fmt.Errorf("in-flight offset %d: must be >= -1", r.Inflight)
	}
	if r.Crashes < 0 {
		return fmt.Errorf("crash count %d: must be >= 0", r.Crashes)
	}
	return nil
}

func validateCommit(c *CommitAttempt) error {
	switch {
	case c.Offset < 0:
		return fmt.Errorf("commit attempt offset %d: must be >= 0", c.Offset)
	case c.Outcome < CommitOK || c.Outcome > CommitUnknown:
		return fmt.Errorf("commit attempt: unknown outcome %d", c.Outcome)
	case c.Latency < 0:
		return fmt.Errorf("commit attempt latency %v: must be >= 0", c.Latency)
	}
	if err := validateTime("commit attempt time", c.At); err != nil {
		return err
	}
	return validateString("commit attempt error", c.Error)
}

func keyString(k Key) string {
	return fmt.Sprintf("group %q topic %q partition %d", k.Group, k.Topic, k.Partition)
}

// compareKeys orders keys by group, topic, partition.
func compareKeys(a, b Key) int {
	return cmp.Or(
		strings.Compare(a.Group, b.Group),
		strings.Compare(a.Topic, b.Topic),
		cmp.Compare(a.Partition, b.Partition),
	)
}
