package offsetstore

import (
	"cmp"
	"fmt"
	"math"
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
	Committed   int64     // last offset known committed to Kafka; -1 = none known
	CommittedAt time.Time
	LastReset   *Reset // nil if never reset
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
)

// Times are stored as Unix nanoseconds; these are the representable bounds.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

func emptyRecord() Record { return Record{Watermark: -1, Committed: -1} }

// clone returns r with its own copy of LastReset, so callers cannot alter
// the store's state through the pointer.
func (r Record) clone() Record {
	if r.LastReset != nil {
		rs := *r.LastReset
		r.LastReset = &rs
	}
	return r
}

// Fields of a Record that an update sets. Updates to the same key are merged
// field group by field group: a later SetCommitted does not undo an earlier
// SetWatermark that has not been flushed yet.
const (
	setWatermark = 1 << iota // Watermark, RecordedAt
	setOwner                 // Generation, Member
	setCommitted             // Committed, CommittedAt
	setReset                 // LastReset
	setAll       = setWatermark | setOwner | setCommitted | setReset
)

// patch is a queued, not yet durable, update of one key.
type patch struct {
	fields uint8
	rec    Record
}

// apply returns base with the fields set by p replaced.
func (p patch) apply(base Record) Record {
	if p.fields&setWatermark != 0 {
		base.Watermark, base.RecordedAt = p.rec.Watermark, p.rec.RecordedAt
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
	return base
}

// merge returns the patch that applies p and then later.
func (p patch) merge(later patch) patch {
	return patch{fields: p.fields | later.fields, rec: later.apply(p.rec)}
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
func now() time.Time { return normTime(time.Now()) }

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
	if r.LastReset != nil {
		return validateReset(r.LastReset)
	}
	return nil
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
